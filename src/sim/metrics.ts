/**
 * Accuracy figures of one variant on one bucket, from counts sampled every `sampleMs`.
 *
 * Every figure uses 1 s windows (the report interval the targets are stated for): a shorter
 * window measures Poisson noise, a longer one hides the loop's lag. The first `warmupS` seconds
 * (a cold fleet: no host has a directive yet) are left out of every figure except the
 * convergence after t = 0. The target of a window is min(offered, limit): what the exact
 * centralized limiter admits.
 */
export interface BucketSeries {
  sampleMs: number;
  /** Requests that reached the hosts in each sample. */
  offered: ArrayLike<number>;
  /** Requests admitted in each sample. */
  admitted: ArrayLike<number>;
  /** The limit (rps) in force in each sample. */
  limitRps: ArrayLike<number>;
}

export interface Convergence {
  /** When the change happened. */
  atS: number;
  /**
   * Seconds from the change to the end of the first 1 s window after which every 1 s window
   * (sliding by one sample) up to the next change has admitted within 5% of its target. At least
   * 1 s (the first window wholly after the change); null if it never got there.
   */
  convergedAfterS: number | null;
}

export interface BucketMetrics {
  /**
   * Steady-state error: (admitted / limit - 1) in %, over the 1 s windows that are overloaded
   * (offered > limit) and at least `settleS` after the last change. Null if there are none.
   */
  steadyErrorPct: number | null;
  /** Mean |admitted - target| / target in % over the same steady windows as above, overloaded or not. */
  steadyAbsErrorPct: number | null;
  /** One entry per change (step or event), with the time to get back within 5%. */
  convergence: Convergence[];
  /** Largest (admitted - limit) / limit over sliding 1 s windows after warm-up, in % (>= 0). */
  peakOvershootPct: number;
  /** Sum over 1 s windows after warm-up of max(0, admitted - limit): requests the limit should have stopped. */
  excessAdmitted: number;
  /**
   * Sum over 1 s windows after warm-up of max(0, min(offered, limit) - admitted): requests dropped
   * that the limit did not require dropping (under the limit, every drop counts).
   */
  wronglyDropped: number;
  offeredTotal: number;
  admittedTotal: number;
}

export interface MetricOptions {
  /** Instants of abrupt change (steps, events), in seconds, ascending, including 0. */
  changeTimesS: readonly number[];
  settleS: number;
  warmupS: number;
  /** Relative band for convergence (default 0.05). */
  tolerance?: number;
}

export function computeBucketMetrics(series: BucketSeries, options: MetricOptions): BucketMetrics {
  const { sampleMs } = series;
  const samples = series.offered.length;
  const perWindow = Math.max(1, Math.round(1000 / sampleMs));
  const tolerance = options.tolerance ?? 0.05;
  const warmupSamples = Math.ceil((options.warmupS * 1000) / sampleMs);

  // Prefix sums make every 1 s window O(1).
  const offeredSum = prefix(series.offered);
  const admittedSum = prefix(series.admitted);
  const limitSum = prefix(Array.from(series.limitRps, (rps) => (rps * sampleMs) / 1000));
  const window = (sums: Float64Array, end: number) => sums[end]! - sums[end - perWindow]!;

  const lastChangeBefore = (tS: number) => {
    let last = 0;
    for (const c of options.changeTimesS) if (c <= tS) last = c;
    return last;
  };

  let steadyAdmitted = 0;
  let steadyLimit = 0;
  let absErrorSum = 0;
  let absErrorWindows = 0;
  let excessAdmitted = 0;
  let wronglyDropped = 0;
  // Fixed, non-overlapping windows for totals and steady state.
  for (let end = perWindow; end <= samples; end += perWindow) {
    const startS = ((end - perWindow) * sampleMs) / 1000;
    const offered = window(offeredSum, end);
    const admitted = window(admittedSum, end);
    const limit = window(limitSum, end);
    const target = Math.min(offered, limit);
    if (end - perWindow >= warmupSamples) {
      excessAdmitted += Math.max(0, admitted - limit);
      wronglyDropped += Math.max(0, target - admitted);
    }
    const changeS = lastChangeBefore(startS);
    const steady = startS >= changeS + options.settleS && end - perWindow >= warmupSamples;
    if (!steady) continue;
    if (target > 0) {
      absErrorSum += Math.abs(admitted - target) / target;
      absErrorWindows++;
    }
    if (offered > limit) {
      steadyAdmitted += admitted;
      steadyLimit += limit;
    }
  }

  let peakOvershoot = 0;
  for (let end = Math.max(perWindow, warmupSamples + perWindow); end <= samples; end++) {
    const limit = window(limitSum, end);
    if (limit > 0) peakOvershoot = Math.max(peakOvershoot, (window(admittedSum, end) - limit) / limit);
  }

  const convergence: Convergence[] = [];
  const changes = options.changeTimesS;
  for (let i = 0; i < changes.length; i++) {
    const atS = changes[i]!;
    const nextS = changes[i + 1] ?? (samples * sampleMs) / 1000;
    const firstEnd = Math.round(((atS + 1) * 1000) / sampleMs);
    const lastEnd = Math.min(samples, Math.round((nextS * 1000) / sampleMs));
    if (firstEnd > lastEnd) continue;
    let convergedEnd: number | null = null;
    for (let end = lastEnd; end >= firstEnd; end--) {
      const target = Math.min(window(offeredSum, end), window(limitSum, end));
      const error = Math.abs(window(admittedSum, end) - target);
      if (error > tolerance * Math.max(target, 1)) break;
      convergedEnd = end;
    }
    convergence.push({
      atS,
      convergedAfterS: convergedEnd === null ? null : round((convergedEnd * sampleMs) / 1000 - atS, 3),
    });
  }

  return {
    steadyErrorPct: steadyLimit > 0 ? round((steadyAdmitted / steadyLimit - 1) * 100, 3) : null,
    steadyAbsErrorPct: absErrorWindows > 0 ? round((absErrorSum / absErrorWindows) * 100, 3) : null,
    convergence,
    peakOvershootPct: round(Math.max(0, peakOvershoot) * 100, 2),
    excessAdmitted: Math.round(excessAdmitted),
    wronglyDropped: Math.round(wronglyDropped),
    offeredTotal: Math.round(offeredSum[samples]!),
    admittedTotal: Math.round(admittedSum[samples]!),
  };
}

function prefix(values: ArrayLike<number>): Float64Array {
  const sums = new Float64Array(values.length + 1);
  for (let i = 0; i < values.length; i++) sums[i + 1] = sums[i]! + values[i]!;
  return sums;
}

export function round(value: number, digits: number): number {
  const scale = 10 ** digits;
  return Math.round(value * scale) / scale;
}
