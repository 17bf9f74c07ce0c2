import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { fairShares } from '../../src/control/fair-share.js';

function shares(
  demands: number[],
  capacity: number,
  weights?: number[],
): { shares: number[]; level: number } {
  const out = new Array<number>(demands.length).fill(Number.NaN);
  const level = fairShares({ demands, capacity, ...(weights ? { weights } : {}) }, out);
  return { shares: out, level };
}

describe('fairShares', () => {
  it('gives every claimant its demand when the demands fit', () => {
    const { shares: got, level } = shares([10, 20, 30], 100);
    assert.deepEqual(got, [10, 20, 30]);
    assert.equal(level, Number.POSITIVE_INFINITY);
  });

  it('holds a claimant that overstates its demand at the level; the others keep theirs', () => {
    // Nine callers at 60 and one liar at a billion, 1,000 to share: the nine get 60 each, the liar the rest.
    const demands = [...Array.from({ length: 9 }, () => 60), 1e9];
    const { shares: got, level } = shares(demands, 1000);
    assert.deepEqual(
      got.slice(0, 9),
      Array.from({ length: 9 }, () => 60),
    );
    assert.equal(got[9], 1000 - 540);
    assert.equal(level, 460);
  });

  it('splits equally among claimants that all ask for more than an equal split', () => {
    const { shares: got } = shares([500, 700, 900], 600);
    assert.deepEqual(got, [200, 200, 200]);
  });

  it('splits by weight: a claimant that speaks for three hosts gets three shares', () => {
    const { shares: got, level } = shares([1000, 1000], 400, [3, 1]);
    assert.deepEqual(got, [300, 100]);
    assert.equal(level, 100);
  });

  it('gives nothing when there is nothing to divide, and treats bad numbers as none', () => {
    assert.deepEqual(shares([10, 20], 0).shares, [0, 0]);
    assert.deepEqual(shares([Number.NaN, -5, Number.POSITIVE_INFINITY, 10], 5).shares, [0, 0, 0, 5]);
    assert.deepEqual(shares([10, 10], Number.NaN).shares, [0, 0]);
  });

  it('never hands out more than the capacity or than a claim, and fills the capacity when claims exceed it', () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0, max: 1e6, noNaN: true }), { minLength: 1, maxLength: 40 }),
        fc.array(fc.double({ min: 0.1, max: 100, noNaN: true }), { minLength: 40, maxLength: 40 }),
        fc.double({ min: 0, max: 1e7, noNaN: true }),
        (demands, allWeights, capacity) => {
          const weights = allWeights.slice(0, demands.length);
          const { shares: got, level } = shares(demands, capacity, weights);
          const total = got.reduce((a, b) => a + b, 0);
          const demanded = demands.reduce((a, b) => a + b, 0);
          const tolerance = 1e-9 * Math.max(1, capacity, demanded);
          assert.ok(total <= capacity + tolerance, `${total} > ${capacity}`);
          for (let i = 0; i < demands.length; i++) assert.ok(got[i]! <= demands[i]! + tolerance);
          if (demanded > capacity) {
            assert.ok(Math.abs(total - capacity) <= tolerance * 10, `${total} != ${capacity}`);
            // Max-min: a claimant held below its demand is at the level, and nobody is above it.
            for (let i = 0; i < demands.length; i++) {
              assert.ok(got[i]! <= weights[i]! * level + tolerance);
              if (got[i]! < demands[i]! - tolerance) {
                assert.ok(Math.abs(got[i]! - weights[i]! * level) <= tolerance * 10);
              }
            }
          }
        },
      ),
    );
  });

  it('does not reward a larger claim beyond the level (strategy-proof for the others)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0, max: 1000, noNaN: true }), { minLength: 2, maxLength: 20 }),
        fc.double({ min: 1, max: 1e9, noNaN: true }),
        fc.double({ min: 1, max: 5000, noNaN: true }),
        (demands, lie, capacity) => {
          const honest = shares(demands, capacity).shares;
          const lied = shares([...demands.slice(0, -1), Math.max(lie, demands.at(-1)!)], capacity).shares;
          // Every other claimant gets at least its share under the level it had with the truth, or its demand.
          for (let i = 0; i < demands.length - 1; i++) {
            const floor = Math.min(demands[i]!, capacity / demands.length);
            assert.ok(lied[i]! >= Math.min(honest[i]!, floor) - 1e-9 * capacity);
          }
        },
      ),
    );
  });
});
