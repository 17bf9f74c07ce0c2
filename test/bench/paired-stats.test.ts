import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { histogramOf, pooledComparison } from '../../bench/paired-stats.js';

/** 1, 2, …, n ms. */
function ramp(n: number, scale = 1): number[] {
  return Array.from({ length: n }, (_, i) => (i + 1) * scale);
}

const ratio = (a: number, b: number) => a / b - 1;

describe('pooled percentiles of paired rounds (bench/paired-stats.ts)', () => {
  it('resolves a ratio near the 5% target to within 0.1%: the verdict cannot hinge on a bin edge', () => {
    for (const truth of [0.048, 0.0505, 0.0495, 0.052]) {
      const round = { a: histogramOf(ramp(20_000, 0.05 * (1 + truth))), b: histogramOf(ramp(20_000, 0.05)) };
      const result = pooledComparison([round, round, round], 0.99, ratio)!;
      assert.ok(Math.abs(result.value - truth) < 0.001, `${truth}: ${result.value}`);
    }
  });

  it('finds the pooled quantile to within its bins', () => {
    // Two rounds of 1..1000 ms: the pooled p99 is 990 ms on both sides.
    const round = { a: histogramOf(ramp(1000)), b: histogramOf(ramp(1000, 2)) };
    const result = pooledComparison([round, round], 0.99, (a, b) => a / (b / 2) - 1)!;
    assert.ok(Math.abs(result.value) < 0.01, `${result.value}`);
    const p99 = pooledComparison([round], 0.99, (a) => a / 1000)!;
    assert.ok(Math.abs(p99.value - 990) / 990 <= 0.005, `${p99.value}`);
  });

  it('pools samples, so one round with a stalled tail moves the pooled p99.9 less than its own', () => {
    const calm = { a: histogramOf(ramp(10_000, 0.001)), b: histogramOf(ramp(10_000, 0.001)) };
    // Side a of one round has its top 1% stalled by 100 ms.
    const stalledA = ramp(10_000, 0.001).map((ms, i) => (i >= 9_900 ? ms + 100 : ms));
    const stalled = { a: histogramOf(stalledA), b: histogramOf(ramp(10_000, 0.001)) };
    const alone = pooledComparison([stalled], 0.999, ratio)!;
    const pooled = pooledComparison([calm, calm, calm, calm, stalled], 0.999, ratio)!;
    assert.ok(alone.value > 5, `${alone.value}`);
    // Five rounds pooled: 100 stalled samples of 50,000 sit above the pooled p99.9 (50 samples).
    assert.ok(pooled.value > 5, `a stall of 0.2% of the pool still sets its p99.9: ${pooled.value}`);
    // Only the top 20 of one round stalled: fewer than the 50 samples above the pooled p99.9.
    const fewerA = ramp(10_000, 0.001).map((ms, i) => (i >= 9_980 ? ms + 100 : ms));
    const fewer = { a: histogramOf(fewerA), b: calm.b };
    assert.ok(
      pooledComparison([fewer], 0.999, ratio)!.value > 5,
      'alone, the 20 set its p99.9 (10 above it)',
    );
    const diluted = pooledComparison([calm, calm, calm, calm, fewer], 0.999, ratio)!;
    assert.ok(
      Math.abs(diluted.value) < 0.05,
      `20 stalled of 50,000 stay under the pooled p99.9: ${diluted.value}`,
    );
  });

  it('gives an interval that contains the pooled value and widens with disagreement between rounds', () => {
    const same = { a: histogramOf(ramp(2000)), b: histogramOf(ramp(2000)) };
    const tight = pooledComparison([same, same, same, same], 0.99, ratio)!;
    assert.equal(tight.value, 0);
    assert.equal(tight.low, 0);
    assert.equal(tight.high, 0);
    const rounds = [0.8, 0.9, 1.0, 1.1, 1.2, 1.3].map((scale) => ({
      a: histogramOf(ramp(2000, scale)),
      b: histogramOf(ramp(2000)),
    }));
    const spread = pooledComparison(rounds, 0.99, ratio)!;
    assert.ok(spread.low <= spread.value && spread.value <= spread.high, JSON.stringify(spread));
    assert.ok(spread.high - spread.low > 0.1, JSON.stringify(spread));
    assert.ok(spread.low > -0.25 && spread.high < 0.35, JSON.stringify(spread));
  });

  it('is deterministic for a seed, and undefined without rounds', () => {
    const rounds = [1, 1.5, 0.7].map((scale) => ({
      a: histogramOf(ramp(500, scale)),
      b: histogramOf(ramp(500)),
    }));
    assert.deepEqual(pooledComparison(rounds, 0.99, ratio), pooledComparison(rounds, 0.99, ratio));
    assert.equal(pooledComparison([], 0.99, ratio), undefined);
  });
});
