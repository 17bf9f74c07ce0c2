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
 *
 * That test alone is blind to a fleet-wide change at a thin host: 1,000 hosts sharing 20,000 rps
 * see 20 calls each a second, and a rise to 60 shows in the host's windows as 40 against 60 one
 * report later (the directive's window straddles the step), 2.2 standard deviations. The directive
 * still carries a fleet total that lags the step, so its ratio is too low, and the fleet overshoots
 * for a second more (docs/accuracy.md, "Local rescale follows a fleet-wide move"). The fleet total is the sum of every
 * host's counts, so its own noise is tiny: when it moved between the last two directives by more
 * than `FLEET_MOVE_RATIO` and beyond its noise, the change is real and fleet-wide, and a host
 * whose own rate moved the same way by at least `FLEET_LOCAL_Z` standard deviations rescales.
 * The relative bound keeps accounting wobble out (hosts joining or leaving move the total by a few
 * percent while each host's share changes, and there keeping the allowance would be wrong).
 */
export const RESCALE_Z = 3;
/** The fleet total moved by more than this fraction between the last two directives. */
export const FLEET_MOVE_RATIO = 0.2;
/** With the fleet total moving, the host's own change must be at least this many standard deviations, the same way. */
export const FLEET_LOCAL_Z = 1;

/** What local rescale reads: the held directive's figures and the host's rates. */
export interface RescaleInputs {
  /** The held directive's limit (units per second). */
  readonly limitRps: number;
  /** The fleet offered rate in the held directive. */
  readonly globalOfferedRps: number;
  /** The fleet offered rate in the directive before it (0: none). */
  readonly previousGlobalOfferedRps: number;
  /** The host's rate in the windows the held directive covers: a mean over `directiveHostWindows` report windows. */
  readonly directiveHostOfferedRps: number;
  readonly directiveHostWindows: number;
  /** The host's rate in its last report window. */
  readonly recentOfferedRps: number;
}

/**
 * The ratio to apply now, from `dropRatio` (the held directive's, after the stale policy) and the
 * rates in `inputs`, each report window about `windowMs` long. Returns `dropRatio` unchanged when
 * there is nothing to scale from or the change is within noise.
 */
export function localRescaleRatio(dropRatio: number, inputs: RescaleInputs, windowMs: number): number {
  const { directiveHostOfferedRps: hostThenRps, recentOfferedRps: hostNowRps } = inputs;
  if (!(hostThenRps > 0) || !(hostNowRps >= 0) || !(windowMs > 0)) return dropRatio;
  const thenCount = (hostThenRps * windowMs) / 1000;
  const nowCount = (hostNowRps * windowMs) / 1000;
  const change = nowCount - thenCount;
  // Variance of the difference: a mean over n windows has 1/n of one window's Poisson variance.
  const variance = thenCount / Math.max(1, inputs.directiveHostWindows) + nowCount;
  const squared = change * change;
  if (squared <= RESCALE_Z * RESCALE_Z * variance) {
    const fleetChange = fleetMove(inputs, windowMs);
    if (
      fleetChange === 0 ||
      fleetChange * change <= 0 ||
      squared < FLEET_LOCAL_Z * FLEET_LOCAL_Z * variance
    ) {
      return dropRatio;
    }
  }
  const allowanceRps = directiveAllowanceRps(dropRatio, inputs);
  if (!(allowanceRps > 0)) return dropRatio;
  if (hostNowRps <= allowanceRps) return 0;
  return Math.min(1, 1 - allowanceRps / hostNowRps);
}

/**
 * How far the fleet total moved between the last two directives, in counts per window, when that
 * is beyond both `FLEET_MOVE_RATIO` and `RESCALE_Z` standard deviations of Poisson noise; else 0.
 */
function fleetMove(inputs: RescaleInputs, windowMs: number): number {
  const before = inputs.previousGlobalOfferedRps;
  if (!(before > 0) || !(inputs.globalOfferedRps > 0)) return 0;
  const beforeCount = (before * windowMs) / 1000;
  const nowCount = (inputs.globalOfferedRps * windowMs) / 1000;
  const move = nowCount - beforeCount;
  if (Math.abs(move) <= FLEET_MOVE_RATIO * beforeCount) return 0;
  if (move * move <= RESCALE_Z * RESCALE_Z * (beforeCount + nowCount)) return 0;
  return move;
}

/**
 * The allowance: what the held directive lets this host admit (units per second), from the host's
 * rate over the windows the directive covers; 0 when there is nothing to size from. Local rescale
 * keeps it when the host's rate moves; the burst guard holds a host to it once tripped.
 */
export function directiveAllowanceRps(dropRatio: number, inputs: RescaleInputs): number {
  const hostThenRps = inputs.directiveHostOfferedRps;
  if (!(hostThenRps > 0)) return 0;
  if (dropRatio > 0) return hostThenRps * (1 - dropRatio);
  if (inputs.limitRps > 0 && inputs.globalOfferedRps > 0) {
    return (hostThenRps * inputs.limitRps) / inputs.globalOfferedRps;
  }
  return 0;
}
