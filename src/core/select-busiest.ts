/**
 * The `max` items of highest `weight`, in their original order (ties at the cut go to the earlier
 * ones, so the choice is stable from call to call); all of them when there are `max` or fewer.
 *
 * Finds the cut with one typed-array sort of the weights (native, no comparator calls): the
 * aggregator runs this every second over up to 100,000 buckets, and a sort of the objects with a
 * comparator took 90-430 ms there (2026-12-02, a loaded 2-CPU VM).
 */
export function selectBusiest<T>(items: readonly T[], max: number, weight: (item: T) => number): T[] {
  if (items.length <= max) return [...items];
  if (max <= 0) return [];
  const weights = new Float64Array(items.length);
  for (let i = 0; i < items.length; i++) {
    const w = weight(items[i]!);
    weights[i] = Number.isNaN(w) ? Number.NEGATIVE_INFINITY : w;
  }
  const sorted = weights.slice().sort();
  const cut = sorted[items.length - max]!;
  // Above the cut all go in; at the cut, as many as there is room for, earliest first.
  let atCut = max;
  for (let i = items.length - max; i < items.length; i++) if (sorted[i]! > cut) atCut--;
  const out: T[] = [];
  for (let i = 0; i < items.length; i++) {
    const w = weights[i]!;
    if (w > cut || (w === cut && atCut-- > 0)) out.push(items[i]!);
  }
  return out;
}
