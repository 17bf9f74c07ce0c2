/**
 * The `max` items of highest `weight`, in their original order (ties at the cut go to the earlier
 * ones, so the choice is stable from call to call); all of them when there are `max` or fewer.
 *
 * Finds the cut with a min-heap of the `max` highest weights, in a typed array: one pass, no
 * comparator calls, no sort of all the weights. The aggregator and the controller's dashboard run
 * this every second over up to 100,000 buckets, where a sort would cost tens to hundreds of ms
 * (docs/control-plane.md, "Performance"). Most weights are below the heap's least and cost one
 * comparison.
 */
export function selectBusiest<T>(items: readonly T[], max: number, weight: (item: T) => number): T[] {
  if (items.length <= max) return [...items];
  if (max <= 0) return [];
  const weights = new Float64Array(items.length);
  const heap = new Float64Array(max);
  let size = 0;
  for (let i = 0; i < items.length; i++) {
    const raw = weight(items[i]!);
    const w = Number.isNaN(raw) ? Number.NEGATIVE_INFINITY : raw;
    weights[i] = w;
    if (size < max) {
      // Sift up.
      let at = size++;
      while (at > 0) {
        const parent = (at - 1) >> 1;
        if (heap[parent]! <= w) break;
        heap[at] = heap[parent]!;
        at = parent;
      }
      heap[at] = w;
    } else if (w > heap[0]!) {
      // Replace the least and sift down.
      let at = 0;
      for (;;) {
        const left = 2 * at + 1;
        if (left >= max) break;
        const right = left + 1;
        const child = right < max && heap[right]! < heap[left]! ? right : left;
        if (heap[child]! >= w) break;
        heap[at] = heap[child]!;
        at = child;
      }
      heap[at] = w;
    }
  }
  const cut = heap[0]!;
  // Above the cut all go in; at the cut, as many as there is room for, earliest first.
  let atCut = max;
  for (let i = 0; i < max; i++) if (heap[i]! > cut) atCut--;
  const out: T[] = [];
  for (let i = 0; i < items.length; i++) {
    const w = weights[i]!;
    if (w > cut || (w === cut && atCut-- > 0)) out.push(items[i]!);
  }
  return out;
}
