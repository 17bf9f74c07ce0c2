/**
 * The fraction of offered traffic to drop so that what is left fits the limit:
 * `max(0, (offered - limit) / offered)`, 0 when nothing is offered, clamped to [0, 1].
 * Written as `1 - limit / offered` so an infinite offered rate gives 1; NaN anywhere gives 0
 * (fail open), never a ratio outside [0, 1].
 */
export function computeDropRatio(offeredRps: number, limitRps: number): number {
  if (!(offeredRps > 0)) return 0;
  const ratio = 1 - Math.max(0, limitRps) / offeredRps;
  if (!(ratio > 0)) return 0;
  return Math.min(ratio, 1);
}
