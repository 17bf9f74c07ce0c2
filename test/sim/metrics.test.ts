import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { seededRandom } from '../../src/core/clock.js';
import { createExactLimiter } from '../../src/sim/exact-limiter.js';
import { computeBucketMetrics } from '../../src/sim/metrics.js';
import { AliasTable, poisson } from '../../src/sim/traffic.js';

/** 100 ms samples of a constant-limit bucket from per-second rates. */
function series(perSecond: { offered: number; admitted: number }[], limitRps: number) {
  const offered: number[] = [];
  const admitted: number[] = [];
  for (const s of perSecond) {
    for (let i = 0; i < 10; i++) {
      offered.push(s.offered / 10);
      admitted.push(s.admitted / 10);
    }
  }
  return { sampleMs: 100, offered, admitted, limitRps: offered.map(() => limitRps) };
}

const options = { changeTimesS: [0, 10], settleS: 3, warmupS: 3 };

describe('computeBucketMetrics', () => {
  it('scores an exact limiter as perfect', () => {
    const seconds = Array.from({ length: 20 }, (_, t) => ({
      offered: t < 10 ? 500 : 3000,
      admitted: t < 10 ? 500 : 1000,
    }));
    const m = computeBucketMetrics(series(seconds, 1000), options);
    assert.equal(m.steadyErrorPct, 0);
    assert.equal(m.peakOvershootPct, 0);
    assert.equal(m.excessAdmitted, 0);
    assert.equal(m.wronglyDropped, 0);
    assert.deepEqual(
      m.convergence.map((c) => c.convergedAfterS),
      [1, 1],
    );
  });

  it('measures lag, overshoot, excess and wrong drops', () => {
    // After the step at 10 s the limiter admits everything for 2 s, then 1,100 (10% over), then 1,000.
    const seconds = Array.from({ length: 20 }, (_, t) => {
      if (t < 10) return { offered: 800, admitted: t === 5 ? 700 : 800 };
      if (t < 12) return { offered: 3000, admitted: 3000 };
      if (t < 14) return { offered: 3000, admitted: 1100 };
      return { offered: 3000, admitted: 980 };
    });
    const m = computeBucketMetrics(series(seconds, 1000), options);
    assert.equal(m.peakOvershootPct, 200);
    assert.equal(m.excessAdmitted, 2 * 2000 + 2 * 100);
    assert.equal(m.wronglyDropped, 100 + 6 * 20);
    // The window [13.5, 14.5) holds 550 + 490 = 1,040: the first within 5% that is never left again.
    assert.equal(m.convergence[1]!.convergedAfterS, 4.5);
    // Steady: windows starting at >= 13 s and overloaded: 13 (1,100) and 14..19 (980).
    assert.equal(m.steadyErrorPct, Math.round(((1100 + 6 * 980) / 7000 - 1) * 100 * 1000) / 1000);
  });

  it('reports never-converged changes as null', () => {
    const seconds = Array.from({ length: 20 }, (_, t) => ({ offered: 3000, admitted: t < 10 ? 1000 : 1500 }));
    const m = computeBucketMetrics(series(seconds, 1000), options);
    assert.equal(m.convergence[1]!.convergedAfterS, null);
  });
});

describe('traffic draws and the exact baseline', () => {
  it('poisson draws have the requested mean on both sides of the normal switch', () => {
    const random = seededRandom(7);
    for (const mean of [0.3, 4, 80]) {
      let sum = 0;
      for (let i = 0; i < 20_000; i++) sum += poisson(random, mean);
      assert.ok(Math.abs(sum / 20_000 - mean) < mean * 0.03 + 0.01, `mean ${mean}: ${sum / 20_000}`);
    }
  });

  it('alias tables pick in proportion to their weights', () => {
    const random = seededRandom(3);
    const table = new AliasTable([1, 2, 7]);
    const counts = [0, 0, 0];
    for (let i = 0; i < 50_000; i++) counts[table.pick(random)]!++;
    assert.ok(Math.abs(counts[2]! / 50_000 - 0.7) < 0.01, String(counts));
    assert.ok(Math.abs(counts[0]! / 50_000 - 0.1) < 0.01, String(counts));
  });

  it('the exact limiter admits min(offered, limit) per tick', () => {
    const limiter = createExactLimiter({ limitRps: 1000, burstMs: 10, nowMs: 0 });
    let admitted = 0;
    for (let tick = 0; tick < 100; tick++) {
      for (let i = 0; i < 25; i++) if (limiter.allow(tick * 10)) admitted++;
    }
    assert.equal(admitted, 1000);
    limiter.setLimit(500, 1000);
    admitted = 0;
    for (let tick = 100; tick < 200; tick++) {
      for (let i = 0; i < 25; i++) if (limiter.allow(tick * 10)) admitted++;
    }
    assert.equal(admitted, 500);
  });

  it('the exact limiter keeps the fraction of a token a tick leaves, so any limit is its long-run rate', () => {
    for (const limitRps of [50, 99, 150, 1030, 1050]) {
      const limiter = createExactLimiter({ limitRps, burstMs: 10, nowMs: 0 });
      const burst = (limitRps * 10) / 1000;
      let admitted = 0;
      for (let tick = 0; tick < 1000; tick++) {
        let thisTick = 0;
        for (let i = 0; i < Math.ceil(burst * 3); i++) if (limiter.allow(tick * 10)) thisTick++;
        assert.ok(thisTick <= Math.ceil(burst), `${limitRps} rps: ${thisTick} in one tick`);
        admitted += thisTick;
      }
      // 10 s at 3x the limit: the limit x 10, give or take the one request a fraction rounds to.
      assert.ok(Math.abs(admitted - limitRps * 10) <= 1, `${limitRps} rps admitted ${admitted} in 10 s`);
    }
    // A whole burst stays whole: idle time never lets a tick take one more.
    const limiter = createExactLimiter({ limitRps: 1000, burstMs: 10, nowMs: 0 });
    let admitted = 0;
    for (let i = 0; i < 20; i++) if (limiter.allow(5_000)) admitted++;
    assert.equal(admitted, 10);
  });
});
