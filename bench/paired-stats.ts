import { seededRandom } from '../src/core/index.js';

/**
 * Latency percentiles pooled over the rounds of a paired comparison, with a bootstrap confidence
 * interval over rounds.
 *
 * Why pooled: one 15 s round at 1,000 req/s puts only 15 samples above its p99.9, so a per-round
 * p99.9 (and the median of those over rounds) moves with a single stalled burst. Pooling the rounds'
 * samples puts rounds × 15 above it. Why a bootstrap over whole rounds: the samples of one round are
 * not independent (a stall of the VM delays every request in flight), so rounds are the unit that
 * is resampled, with both sides of a pair drawn together (they shared their seconds).
 */

/**
 * Bin i holds latencies in [GROWTH^i, GROWTH^(i+1)) µs: 0.05% resolution, up to ~60 s. Fine enough
 * that a ratio of two binned quantiles is within 0.1% of the ratio of the exact ones (0.5% bins
 * could report a true +5.05% as +4.59%, on the wrong side of a 5% target).
 */
const GROWTH = 1.0005;
const LOG_GROWTH = Math.log(GROWTH);
const BINS = Math.ceil(Math.log(60e6) / LOG_GROWTH);

/** Sparse histogram as sent between processes: [bin, count] pairs. */
export type SparseHistogram = [number, number][];

export function histogramOf(latenciesMs: readonly number[]): SparseHistogram {
  const counts = new Map<number, number>();
  for (const ms of latenciesMs) {
    const bin = binOf(ms * 1000);
    counts.set(bin, (counts.get(bin) ?? 0) + 1);
  }
  return [...counts].sort(([a], [b]) => a - b);
}

function binOf(us: number): number {
  if (!(us >= 1)) return 0;
  return Math.min(BINS - 1, Math.floor(Math.log(us) / LOG_GROWTH));
}

/**
 * One side's rounds as cumulative counts over the bins any of them uses, so the quantile of any
 * weighted pool of rounds (a bootstrap resample) is a binary search: O(rounds x log bins).
 */
class PooledRounds {
  readonly #first: number;
  readonly #cumulative: Float64Array[];

  constructor(rounds: readonly SparseHistogram[]) {
    let first = BINS;
    let last = 0;
    for (const round of rounds) {
      for (const [bin] of round) {
        if (bin < first) first = bin;
        if (bin > last) last = bin;
      }
    }
    if (first > last) first = last = 0;
    this.#first = first;
    this.#cumulative = rounds.map((round) => {
      const counts = new Float64Array(last - first + 1);
      for (const [bin, count] of round) counts[bin - first]! += count;
      for (let i = 1; i < counts.length; i++) counts[i]! += counts[i - 1]!;
      return counts;
    });
  }

  /** The q-quantile in µs (the bin's geometric middle) of the rounds pooled with these weights; NaN when empty. */
  quantileUs(weights: ArrayLike<number>, q: number): number {
    const cumulative = this.#cumulative;
    const countUpTo = (i: number) => {
      let sum = 0;
      for (let r = 0; r < cumulative.length; r++)
        if (weights[r]! > 0) sum += weights[r]! * cumulative[r]![i]!;
      return sum;
    };
    const lastIndex = (cumulative[0]?.length ?? 1) - 1;
    const total = countUpTo(lastIndex);
    if (total === 0) return Number.NaN;
    const rank = Math.max(1, Math.ceil(q * total));
    let low = 0;
    let high = lastIndex;
    while (low < high) {
      const mid = (low + high) >> 1;
      if (countUpTo(mid) >= rank) high = mid;
      else low = mid + 1;
    }
    return GROWTH ** (this.#first + low + 0.5);
  }
}

export interface PooledComparison {
  /** The statistic on all rounds pooled. */
  value: number;
  /** 5th and 95th percentile of the statistic over bootstrap resamples of whole rounds. */
  low: number;
  high: number;
  resamples: number;
}

/**
 * `stat(qa, qb)` of the q-quantiles of side a and side b, pooled over rounds, with a 90% bootstrap
 * interval. `rounds` holds each round's two histograms.
 */
export function pooledComparison(
  rounds: readonly { a: SparseHistogram; b: SparseHistogram }[],
  q: number,
  stat: (aUs: number, bUs: number) => number,
  { resamples = 2000, seed = 7 }: { resamples?: number; seed?: number } = {},
): PooledComparison | undefined {
  if (rounds.length === 0) return undefined;
  const a = new PooledRounds(rounds.map((r) => r.a));
  const b = new PooledRounds(rounds.map((r) => r.b));
  const all = new Float64Array(rounds.length).fill(1);
  const value = stat(a.quantileUs(all, q), b.quantileUs(all, q));
  const random = seededRandom(seed);
  const draws: number[] = [];
  const weights = new Float64Array(rounds.length);
  for (let i = 0; i < resamples; i++) {
    // A resample of whole rounds, with replacement: how many times each round is drawn.
    weights.fill(0);
    for (let k = 0; k < rounds.length; k++) weights[Math.floor(random() * rounds.length)]! += 1;
    draws.push(stat(a.quantileUs(weights, q), b.quantileUs(weights, q)));
  }
  return { value, ...interval90(draws), resamples };
}

/** The 5th and 95th percentiles of bootstrap draws: a 90% interval. */
export function interval90(draws: readonly number[]): { low: number; high: number } {
  const sorted = [...draws].sort((x, y) => x - y);
  const at = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
  return { low: at(0.05), high: at(0.95) };
}

/**
 * For a figure measured once per round and per case (CPU per request), which has no samples to
 * pool: how often a random relabelling of the two sides' round values gives a difference of medians
 * (a − b) at least the observed one. A one-sided permutation p-value for "a costs more than b";
 * the cases ran in separate (unpaired) runs, so rounds are exchangeable between the two sides.
 */
export function medianShiftPValue(
  a: readonly number[],
  b: readonly number[],
  { relabellings = 20_000, seed = 7 }: { relabellings?: number; seed?: number } = {},
): number {
  if (a.length === 0 || b.length === 0) return Number.NaN;
  const observed = median(a) - median(b);
  const pool = [...a, ...b];
  const random = seededRandom(seed);
  let atLeast = 0;
  for (let i = 0; i < relabellings; i++) {
    // Fisher–Yates on the first a.length positions is enough to draw side a.
    for (let j = 0; j < a.length; j++) {
      const k = j + Math.floor(random() * (pool.length - j));
      [pool[j], pool[k]] = [pool[k]!, pool[j]!];
    }
    if (median(pool.slice(0, a.length)) - median(pool.slice(a.length)) >= observed) atLeast++;
  }
  return atLeast / relabellings;
}

/** The median; NaN for no values. */
export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((x, y) => x - y);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}
