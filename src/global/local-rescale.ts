/**
 * Local rescale: between directives, a host scales the directive's drop ratio by how its own
 * offered rate moved since the window the directive was computed from.
 *
 * A directive says: the fleet offered `globalOfferedRps` (this host's part of it: `hostThenRps`),
 * drop `dropRatio`. The host's allowance — what the directive lets it admit — is
 *
 *     allowanceRps = hostThenRps * (1 - dropRatio)                  (dropRatio > 0)
 *                  = hostThenRps * limitRps / globalOfferedRps      (dropRatio = 0: its share of the limit)
 *
 * If the host now offers `hostNowRps`, keeping the allowance fixed means dropping
 * `1 - allowanceRps / hostNowRps`. In a fleet-wide spike every host sees its own rate jump at its
 * next report tick and cuts at once, without waiting the loop's two to three intervals for the
 * controller; when the load falls back, the drop ratio falls with it.
 *
 * Neutral in steady state: the ratio is rescaled only when the two rates differ by more than
 * Poisson noise (`RESCALE_Z` standard deviations of the difference of the two windows' counts).
 * Rescaling on noise would be biased: E[then / now] > 1 for two noisy windows (Jensen), about
 * +1/count, i.e. +3% for a host that sees 30 calls per interval.
 */
export const RESCALE_Z = 3;

/**
 * The ratio to apply now, from the held directive and the host's rates (units per second) in the
 * window the directive covers (`hostThenRps`) and in its last window (`hostNowRps`), each window
 * about `windowMs` long. Returns `dropRatio` unchanged when there is nothing to scale from or the
 * change is within noise.
 */
export function localRescaleRatio(
  dropRatio: number,
  limitRps: number,
  globalOfferedRps: number,
  hostThenRps: number,
  hostNowRps: number,
  windowMs: number,
): number {
  if (!(hostThenRps > 0) || !(hostNowRps >= 0) || !(windowMs > 0)) return dropRatio;
  const thenCount = (hostThenRps * windowMs) / 1000;
  const nowCount = (hostNowRps * windowMs) / 1000;
  const change = nowCount - thenCount;
  if (change * change <= RESCALE_Z * RESCALE_Z * (thenCount + nowCount)) return dropRatio;
  let allowanceRps: number;
  if (dropRatio > 0) allowanceRps = hostThenRps * (1 - dropRatio);
  else if (limitRps > 0 && globalOfferedRps > 0) allowanceRps = (hostThenRps * limitRps) / globalOfferedRps;
  else return dropRatio;
  if (hostNowRps <= allowanceRps) return 0;
  return Math.min(1, 1 - allowanceRps / hostNowRps);
}
