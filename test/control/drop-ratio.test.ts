import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { computeDropRatio } from '../../src/control/drop-ratio.js';

describe('computeDropRatio', () => {
  it('drops the excess share of offered load', () => {
    assert.ok(Math.abs(computeDropRatio(1500, 1000) - 1 / 3) < 1e-12);
    assert.equal(computeDropRatio(2000, 1000), 0.5);
    assert.equal(computeDropRatio(1000, 1000), 0);
    assert.equal(computeDropRatio(500, 1000), 0);
  });

  it('is 0 without offered load and 1 with a zero limit', () => {
    assert.equal(computeDropRatio(0, 1000), 0);
    assert.equal(computeDropRatio(-5, 1000), 0);
    assert.equal(computeDropRatio(100, 0), 1);
    assert.equal(computeDropRatio(100, -3), 1);
  });

  it('never leaves [0, 1], even on non-finite input (NaN fails open)', () => {
    assert.equal(computeDropRatio(Number.NaN, 10), 0);
    assert.equal(computeDropRatio(10, Number.NaN), 0);
    assert.equal(computeDropRatio(Number.POSITIVE_INFINITY, 10), 1);
    assert.equal(computeDropRatio(10, Number.POSITIVE_INFINITY), 0);
  });

  it('admits exactly the limit when offered exceeds it (property)', () => {
    fc.assert(
      fc.property(
        fc.double({ min: 1e-3, max: 1e9, noNaN: true }),
        fc.double({ min: 0, max: 1e9, noNaN: true }),
        (offered, limit) => {
          const ratio = computeDropRatio(offered, limit);
          assert.ok(ratio >= 0 && ratio <= 1);
          const admitted = offered * (1 - ratio);
          if (offered > limit) assert.ok(Math.abs(admitted - limit) <= 1e-6 * Math.max(1, limit));
          else assert.equal(ratio, 0);
        },
      ),
    );
  });
});
