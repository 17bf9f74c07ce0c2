import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, describeValue } from '../core/validate.js';

/**
 * Bounds how much one reporter (a host, or a lower tier per host it speaks for) can add to a
 * bucket's offered sum, so one lying or broken host cannot drive the fleet's drop ratio to ~1.
 *
 * Per bucket and tick, a reporter's offered rate per host counts at most
 * `min(maxRps, max(medianMultiple × median, floorRps))`, where the median is taken over the
 * per-host rates of every reporter of that bucket (the lower median for an even count, so a liar
 * cannot pull it up in a pair). Admitted and would-drop are clipped with it, keeping
 * `wouldDrop <= admitted <= offered`.
 *
 * Clipping only ever lowers the offered sum, so its failure mode is admitting more than the limit,
 * never dropping honest traffic: a large `medianMultiple` (skewed fleets have legitimately hot hosts)
 * and a `floorRps` at the highest rate one honest host can reach keep honest reports unclipped.
 */
export interface ReporterCap {
  /** Multiple of the bucket's median per-host rate a reporter may claim. Default: no median bound. */
  medianMultiple?: number;
  /** The median bound never clips below this rate per host (rps). Default 0; needs `medianMultiple`. */
  floorRps?: number;
  /** Hard bound per host (rps), whatever the median. Default: none. */
  maxRps?: number;
}

export function validateReporterCap(cap: ReporterCap, field = 'reporterCap'): ReporterCap {
  if (typeof cap !== 'object' || cap === null) {
    throw new SpillwayError(ErrorCode.InvalidOption, `${field} must be an object`, { field });
  }
  assertKnownOptions(cap, ['medianMultiple', 'floorRps', 'maxRps'], field);
  for (const name of ['medianMultiple', 'floorRps', 'maxRps'] as const) {
    const value = cap[name];
    if (value === undefined) continue;
    if (
      typeof value !== 'number' ||
      Number.isNaN(value) ||
      value < 0 ||
      (name === 'medianMultiple' && value < 1)
    ) {
      throw new SpillwayError(
        ErrorCode.InvalidOption,
        `${field}.${name} must be a number >= ${name === 'medianMultiple' ? 1 : 0}, got ${describeValue(value)}`,
        { field: `${field}.${name}` },
      );
    }
  }
  // The floor only bounds the median bound from below: alone it would be ignored in silence.
  if (cap.floorRps !== undefined && cap.medianMultiple === undefined) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `${field}.floorRps bounds the median bound only: set ${field}.medianMultiple too (or use ${field}.maxRps for a fixed bound)`,
      { field: `${field}.floorRps` },
    );
  }
  return cap;
}

/**
 * The per-host bound for one bucket from its reporters' per-host offered rates (Infinity when
 * nothing bounds it). Sorts `perHostRps` in place: O(n log n) per bucket and tick, only when a cap
 * is configured.
 */
export function perHostCapRps(cap: ReporterCap, perHostRps: number[]): number {
  let bound = cap.maxRps ?? Number.POSITIVE_INFINITY;
  if (cap.medianMultiple !== undefined && perHostRps.length > 0) {
    perHostRps.sort((a, b) => a - b);
    const median = perHostRps[(perHostRps.length - 1) >> 1]!;
    bound = Math.min(bound, Math.max(cap.medianMultiple * median, cap.floorRps ?? 0));
  }
  return bound;
}

/**
 * The factor (0, 1] to scale one reporter's offered, admitted and would-drop rates by so its
 * offered rate is at most `capRps` per host. Scaling all three keeps `wouldDrop <= admitted <= offered`.
 */
export function clipScale(offeredRps: number, hostCount: number, capRps: number): number {
  const limit = capRps * Math.max(1, hostCount);
  return offeredRps > limit ? limit / offeredRps : 1;
}
