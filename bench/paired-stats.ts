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

/** Bin i holds latencies in [GROWTH^i, GROWTH^(i+1)) µs: 0.5% resolution, up to ~60 s. */
const GROWTH = 1.005;
const LOG_GROWTH = Math.log(GROWTH);
const BINS = 3600;

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

function dense(sparse: SparseHistogram): Float64Array {
  const out = new Float64Array(BINS);
  for (const [bin, count] of sparse) out[bin]! += count;
  return out;
}

/** The q-quantile in µs (the bin's geometric middle) of the sum of `hists`; NaN when empty. */
function quantileUs(hists: readonly Float64Array[], q: number): number {
  let total = 0;
  for (const h of hists) for (let i = 0; i < BINS; i++) total += h[i]!;
  if (total === 0) return Number.NaN;
  const rank = Math.max(1, Math.ceil(q * total));
  let seen = 0;
  for (let i = 0; i < BINS; i++) {
    for (const h of hists) seen += h[i]!;
    if (seen >= rank) return GROWTH ** (i + 0.5);
  }
  return GROWTH ** BINS;
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
  const a = rounds.map((r) => dense(r.a));
  const b = rounds.map((r) => dense(r.b));
  const value = stat(quantileUs(a, q), quantileUs(b, q));
  const random = seededRandom(seed);
  const draws: number[] = [];
  for (let i = 0; i < resamples; i++) {
    const picks = rounds.map(() => Math.floor(random() * rounds.length));
    draws.push(
      stat(
        quantileUs(
          picks.map((p) => a[p]!),
          q,
        ),
        quantileUs(
          picks.map((p) => b[p]!),
          q,
        ),
      ),
    );
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
