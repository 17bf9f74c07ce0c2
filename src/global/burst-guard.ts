import { ErrorCode, SpillwayError } from '../core/errors.js';

/**
 * The burst guard: a host-local token bucket per bucket, sized from the last directive, that cuts
 * a spike inside the interval the feedback loop needs to notice it (the loop closes in about two
 * intervals; a host that jumps 10x would otherwise overshoot for that long).
 *
 * Sizing, refreshed whenever a directive is applied:
 *
 *     hostShareRps = limitRps * hostOfferedRps / max(directive.offeredRps, hostOfferedRps) * (1 + slackRatio)
 *     capacity     = hostShareRps * burstWindowMs / 1000
 *
 * where hostOfferedRps is the lower of the host's rates in its last two reports: the directive's
 * fleet total lags a surging host, and its newest rate would grant the surge to itself.
 *
 * The guard applies after the drop ratio, so it caps what the host admits at its proportional
 * share of the limit plus slack. It is armed only in enforce mode, with a live (or held) directive
 * that carries a limit, and once the host has seen traffic for the bucket: with no offered load
 * in the last window a host has no measured share, and a guard of 0 would drop everything.
 */
export interface BurstGuardOptions {
  /** Headroom over the proportional share, so normal variance between hosts is never cut. Default 0.25. */
  slackRatio?: number;
  /** Burst the guard lets through at once, in ms of share. Default: the report interval. */
  burstWindowMs?: number;
  /**
   * Experimental. At most this much share growth per directive (0.25: +25%). The fleet-wide
   * offered rate in a directive lags a surging host's own rate by a few reports, so the formula
   * grants a surge to itself once the host's rate has risen in two reports; a cap holds the line
   * until the controller's ratio catches up, at the cost of slower recovery after a drop.
   * Default: no cap.
   */
  maxShareGrowthRatio?: number;
}

export interface ResolvedBurstGuard {
  slackRatio: number;
  /** undefined: follow the report interval. */
  burstWindowMs: number | undefined;
  maxShareGrowthRatio: number | undefined;
}

export const DEFAULT_BURST_GUARD_SLACK_RATIO = 0.25;

export function resolveBurstGuard(
  options: BurstGuardOptions | false | undefined,
): ResolvedBurstGuard | undefined {
  if (options === undefined || options === false) return undefined;
  if (typeof options !== 'object' || options === null) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'burstGuard must be an options object or false', {
      field: 'burstGuard',
    });
  }
  const slackRatio = options.slackRatio ?? DEFAULT_BURST_GUARD_SLACK_RATIO;
  if (typeof slackRatio !== 'number' || !Number.isFinite(slackRatio) || slackRatio < 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, `burstGuard.slackRatio must be a finite number >= 0`, {
      field: 'burstGuard.slackRatio',
    });
  }
  const burstWindowMs = options.burstWindowMs;
  if (
    burstWindowMs !== undefined &&
    (typeof burstWindowMs !== 'number' || !Number.isFinite(burstWindowMs) || burstWindowMs <= 0)
  ) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `burstGuard.burstWindowMs must be a positive finite number`,
      {
        field: 'burstGuard.burstWindowMs',
      },
    );
  }
  const maxShareGrowthRatio = options.maxShareGrowthRatio;
  if (
    maxShareGrowthRatio !== undefined &&
    (typeof maxShareGrowthRatio !== 'number' ||
      !Number.isFinite(maxShareGrowthRatio) ||
      maxShareGrowthRatio < 0)
  ) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `burstGuard.maxShareGrowthRatio must be a finite number >= 0`,
      {
        field: 'burstGuard.maxShareGrowthRatio',
      },
    );
  }
  return { slackRatio, burstWindowMs, maxShareGrowthRatio };
}

/** This host's share of `limitRps`, with slack; 0 when there is nothing to size from. */
export function hostShareRps(
  limitRps: number,
  hostOfferedRps: number,
  globalOfferedRps: number,
  slackRatio: number,
): number {
  if (!(limitRps > 0) || !(hostOfferedRps > 0)) return 0;
  const share = hostOfferedRps / Math.max(globalOfferedRps, hostOfferedRps);
  return limitRps * share * (1 + slackRatio);
}
