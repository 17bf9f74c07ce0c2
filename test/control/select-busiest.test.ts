import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { selectBusiest } from '../../src/control/select-busiest.js';

describe('selectBusiest', () => {
  it('keeps the max heaviest in their original order; ties at the cut go to the earliest', () => {
    const items = [5, 1, 9, 3, 9, 3, 3, 0].map((weight, index) => ({ weight, index }));
    const kept = selectBusiest(items, 4, (i) => i.weight);
    assert.deepEqual(
      kept.map((i) => i.index),
      [0, 2, 3, 4],
    );
    assert.equal(selectBusiest(items, 100, (i) => i.weight).length, 8);
    assert.deepEqual(
      selectBusiest(items, 0, (i) => i.weight),
      [],
    );
  });

  it('matches a sort by weight (stable) on any input, NaN weighing least', () => {
    fc.assert(
      fc.property(
        fc.array(fc.oneof(fc.integer({ min: 0, max: 5 }), fc.double({ noNaN: false })), { maxLength: 60 }),
        fc.integer({ min: 0, max: 70 }),
        (weights, max) => {
          const items = weights.map((weight, index) => ({ weight, index }));
          const key = (w: number) => (Number.isNaN(w) ? Number.NEGATIVE_INFINITY : w);
          const expected = [...items]
            .sort((a, b) => key(b.weight) - key(a.weight) || a.index - b.index)
            .slice(0, max)
            .map((i) => i.index)
            .sort((a, b) => a - b);
          const got = selectBusiest(items, max, (i) => i.weight).map((i) => i.index);
          assert.deepEqual(got, expected);
        },
      ),
      { numRuns: 500 },
    );
  });
});
