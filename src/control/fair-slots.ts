/**
 * Max-min fair slots, for a table whose slots are shared between slices (zones, addresses): when
 * every slot is taken, a newcomer holding `held` slots takes one from the fullest slice if that
 * slice holds at least two more, so a few slices that took every slot cannot keep the others out.
 * The two-slot margin keeps two slices from taking a slot back and forth. Answers the slice to take
 * a slot from, or undefined when the newcomer must be refused.
 */
export function sliceToYield<K>(sizes: ReadonlyMap<K, number>, held: number): K | undefined {
  let fullest: K | undefined;
  let fullestSize = 0;
  for (const [slice, size] of sizes) {
    if (size > fullestSize) {
      fullest = slice;
      fullestSize = size;
    }
  }
  return fullestSize >= held + 2 ? fullest : undefined;
}
