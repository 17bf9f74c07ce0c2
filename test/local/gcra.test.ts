import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { ManualClock } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';
import { createGcra } from '../../src/local/gcra.js';
import { createTokenBucket } from '../../src/local/token-bucket.js';

const T0 = 1_700_000_000_000;

describe('createGcra', () => {
  it('admits `burst` at once from rest, then one per emission interval', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 10, periodMs: 1_000, burst: 3, clock });
    for (let call = 0; call < 3; call++) assert.equal(gcra.tryTake(), true, `burst call ${call}`);
    const rejected = gcra.take();
    assert.equal(rejected.allowed, false);
    assert.equal(rejected.limit, 3, 'the decision limit is the burst');
    assert.equal(rejected.remaining, 0);
    assert.equal(rejected.retryAfterMs, 100, 'one unit every 1000/10 ms');
    assert.equal(rejected.resetAtMs, T0 + 300, 'full again once all three units are paid back');
    clock.advance(99);
    assert.equal(gcra.tryTake(), false);
    clock.advance(1);
    assert.equal(gcra.tryTake(), true);
    assert.equal(gcra.tryTake(), false);
  });

  it('never stores more than `burst`, however long it rests', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 10, periodMs: 1_000, burst: 3, clock });
    clock.advance(3_600_000);
    let admitted = 0;
    while (gcra.tryTake()) admitted++;
    assert.equal(admitted, 3);
  });

  it('admits a steady rate at exactly the limit forever, with burst 1', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 3, periodMs: 1_000, burst: 1, clock });
    for (let call = 0; call < 3_000; call++) {
      clock.set(T0 + (call * 1_000) / 3);
      assert.equal(gcra.tryTake(), true, `call ${call} at the exact rate`);
      assert.equal(gcra.tryTake(), false, `call ${call}: nothing extra with burst 1`);
    }
  });

  it('defaults burst to limit and reports decision fields', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 4, periodMs: 2_000, clock });
    assert.equal(gcra.burst, 4);
    assert.deepEqual(gcra.take(), {
      allowed: true,
      limit: 4,
      remaining: 3,
      resetAtMs: T0 + 500,
      retryAfterMs: 0,
    });
    assert.deepEqual(gcra.take(3), {
      allowed: true,
      limit: 4,
      remaining: 0,
      resetAtMs: T0 + 2_000,
      retryAfterMs: 0,
    });
    const peek = gcra.take(0);
    assert.equal(peek.remaining, 0);
    clock.advance(250);
    assert.equal(gcra.take(0).remaining, 0.5, 'remaining is fractional between emissions');
  });

  it('rejects a cost above what remains and consumes nothing', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 5, periodMs: 1_000, clock });
    assert.equal(gcra.tryTake(3), true);
    const rejected = gcra.take(3);
    assert.equal(rejected.allowed, false);
    assert.equal(rejected.remaining, 2);
    assert.equal(rejected.retryAfterMs, 200);
    assert.equal(gcra.tryTake(2), true);
  });

  it('mints nothing when the clock goes backwards', () => {
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 10, periodMs: 1_000, clock });
    assert.equal(gcra.tryTake(10), true);
    clock.set(T0 - 60_000);
    assert.equal(gcra.tryTake(), false);
    clock.set(T0 + 99);
    assert.equal(gcra.tryTake(), false);
    clock.set(T0 + 100);
    assert.equal(gcra.tryTake(), true);
  });

  it('keeps sub-microsecond emission intervals exact at epoch-sized times', () => {
    // 10 million per second: an emission interval of 0.1 µs, below one double step at 1.7e12 ms.
    const clock = new ManualClock(T0);
    const gcra = createGcra({ limit: 10_000_000, periodMs: 1_000, burst: 20_000, clock });
    let admitted = 0;
    for (let step = 0; step < 100; step++) {
      clock.set(T0 + step);
      for (let call = 0; call < 100_000 && gcra.tryTake(); call++) admitted++;
    }
    // The initial burst, 99 ms of refill at 10,000 per ms, and the 1 µs admission slack (10 units).
    const expected = 20_000 + 99 * 10_000 + 10;
    assert.ok(Math.abs(admitted - expected) <= 1, `admitted ${admitted}, expected ${expected}`);
  });

  it('makes the same decisions as a token bucket of capacity burst and refill limit/period', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 10 }),
        fc.array(fc.tuple(fc.integer({ min: 0, max: 300 }), fc.integer({ min: 0, max: 3 })), {
          maxLength: 200,
        }),
        (limit, burst, steps) => {
          const clock = new ManualClock(T0);
          const gcra = createGcra({ limit, periodMs: 1_000, burst, clock });
          const bucket = createTokenBucket({ capacity: burst, refillPerSec: limit, clock });
          for (const [advanceMs, costWanted] of steps) {
            clock.advance(advanceMs);
            const cost = Math.min(costWanted, burst);
            if (gcra.tryTake(cost) !== bucket.tryTake(cost)) return false;
          }
          return true;
        },
      ),
    );
  });

  it('rejects invalid options and costs with stable codes', () => {
    for (const options of [
      { limit: 0, periodMs: 1_000 },
      { limit: 1, periodMs: Number.NaN },
      { limit: 1, periodMs: 1_000, burst: -1 },
      { limit: Number.POSITIVE_INFINITY, periodMs: 1_000 },
    ]) {
      assert.throws(
        () => createGcra(options),
        (error) => isSpillwayError(error, ErrorCode.InvalidLimit),
        JSON.stringify(options),
      );
    }
    const gcra = createGcra({ limit: 2, periodMs: 1_000, clock: new ManualClock(T0) });
    for (const cost of [-1, Number.NaN, Number.POSITIVE_INFINITY, 2.5]) {
      assert.throws(
        () => gcra.tryTake(cost),
        (error) => isSpillwayError(error, ErrorCode.InvalidCost),
      );
    }
    assert.equal(gcra.take(0).remaining, 2);
  });
});
