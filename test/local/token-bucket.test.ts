import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { ManualClock } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';
import { TIME_SLACK_MS } from '../../src/local/time-slack.js';
import { createTokenBucket } from '../../src/local/token-bucket.js';

const T0 = 1_700_000_000_000;

describe('createTokenBucket', () => {
  it('refills continuously at refillPerSec up to capacity', () => {
    const clock = new ManualClock(T0);
    const bucket = createTokenBucket({ capacity: 5, refillPerSec: 2, clock });
    for (let call = 0; call < 5; call++) assert.equal(bucket.tryTake(), true);
    const rejected = bucket.take();
    assert.deepEqual(rejected, {
      allowed: false,
      limit: 5,
      remaining: 0,
      resetAtMs: T0 + 2_500,
      retryAfterMs: 500,
    });
    clock.advance(499);
    assert.equal(bucket.tryTake(), false, 'one token takes 500 ms at 2 per second');
    clock.advance(1);
    assert.equal(bucket.tryTake(), true);
    clock.advance(3_600_000);
    const peek = bucket.take(0);
    assert.equal(peek.remaining, 5, 'refill stops at capacity');
    assert.equal(peek.resetAtMs, T0 + 500 + 3_600_000, 'a full bucket resets now');
  });

  it('reports decision fields on admission', () => {
    const clock = new ManualClock(T0);
    const bucket = createTokenBucket({ capacity: 10, refillPerSec: 5, clock });
    assert.deepEqual(bucket.take(4), {
      allowed: true,
      limit: 10,
      remaining: 6,
      resetAtMs: T0 + 800,
      retryAfterMs: 0,
    });
  });

  it('handles fractional costs and rejects without consuming', () => {
    const clock = new ManualClock(T0);
    const bucket = createTokenBucket({ capacity: 1, refillPerSec: 1, clock });
    for (let call = 0; call < 4; call++) assert.equal(bucket.tryTake(0.25), true);
    const rejected = bucket.take(0.25);
    assert.equal(rejected.allowed, false);
    assert.equal(rejected.retryAfterMs, 250);
    clock.advance(100);
    const partial = bucket.take(0.25);
    assert.equal(partial.allowed, false, '0.1 tokens are not 0.25');
    assert.ok(Math.abs(partial.retryAfterMs - 150) < 1e-9);
    assert.ok(Math.abs(bucket.take(0).remaining - 0.1) < 1e-9, 'the rejection consumed nothing');
    clock.advance(150);
    assert.equal(bucket.tryTake(0.25), true);
  });

  it('admits exactly after waiting retryAfterMs, even for intervals that are not exact in binary', () => {
    const clock = new ManualClock(T0 + 0.3);
    const bucket = createTokenBucket({ capacity: 3, refillPerSec: 3000 / 7, clock });
    for (let round = 0; round < 1000; round++) {
      while (bucket.tryTake()) {}
      const { retryAfterMs } = bucket.take();
      assert.ok(retryAfterMs > 0);
      clock.advance(retryAfterMs);
      assert.equal(bucket.tryTake(), true, `round ${round}: admitted after retryAfterMs ${retryAfterMs}`);
    }
  });

  it('mints no tokens when the clock goes backwards', () => {
    const clock = new ManualClock(T0);
    const bucket = createTokenBucket({ capacity: 5, refillPerSec: 10, clock });
    assert.equal(bucket.tryTake(5), true);
    clock.set(T0 - 60_000);
    assert.equal(bucket.tryTake(), false);
    clock.set(T0);
    assert.equal(bucket.tryTake(), false, 'coming back to the same time adds nothing');
    clock.set(T0 + 99);
    assert.equal(bucket.tryTake(), false);
    clock.set(T0 + 100);
    assert.equal(bucket.tryTake(), true, 'refill resumes from the latest time seen');
  });

  it('never admits more than capacity + refill over any sequence of calls', () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0.5, max: 100, noNaN: true }),
        fc.double({ min: 0.1, max: 1000, noNaN: true }),
        fc.array(
          fc.tuple(fc.double({ min: 0, max: 50, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })),
          {
            maxLength: 300,
          },
        ),
        (capacity, refillPerSec, steps) => {
          const clock = new ManualClock(T0);
          const bucket = createTokenBucket({ capacity, refillPerSec, clock });
          let admitted = 0;
          for (const [advanceMs, costFraction] of steps) {
            clock.advance(advanceMs);
            const cost = costFraction * capacity;
            if (bucket.tryTake(cost)) admitted += cost;
          }
          // Admission may run TIME_SLACK_MS of refill ahead (as debt, never forgiven).
          const bound = capacity + ((clock.nowMs() - T0 + TIME_SLACK_MS) * refillPerSec) / 1000;
          return admitted <= bound * (1 + 1e-12);
        },
      ),
    );
  });

  it('tryTake and take make the same decisions', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 400 }), fc.integer({ min: 0, max: 4 })), {
          maxLength: 200,
        }),
        (steps) => {
          const clock = new ManualClock(T0);
          const fast = createTokenBucket({ capacity: 4, refillPerSec: 7, clock });
          const full = createTokenBucket({ capacity: 4, refillPerSec: 7, clock });
          for (const [advanceMs, cost] of steps) {
            clock.advance(advanceMs);
            if (fast.tryTake(cost) !== full.take(cost).allowed) return false;
          }
          return true;
        },
      ),
    );
  });

  it('rejects invalid options with ERR_SPILLWAY_INVALID_LIMIT', () => {
    for (const options of [
      { capacity: 0, refillPerSec: 1 },
      { capacity: -1, refillPerSec: 1 },
      { capacity: Number.POSITIVE_INFINITY, refillPerSec: 1 },
      { capacity: 1, refillPerSec: Number.NaN },
      { capacity: 1, refillPerSec: 0 },
    ]) {
      assert.throws(
        () => createTokenBucket(options),
        (error) => isSpillwayError(error, ErrorCode.InvalidLimit),
        JSON.stringify(options),
      );
    }
  });

  it('rejects an invalid cost with ERR_SPILLWAY_INVALID_COST before touching state', () => {
    const clock = new ManualClock(T0);
    const bucket = createTokenBucket({ capacity: 2, refillPerSec: 1, clock });
    for (const cost of [-1, Number.NaN, Number.POSITIVE_INFINITY, 3]) {
      assert.throws(
        () => bucket.tryTake(cost),
        (error) => isSpillwayError(error, ErrorCode.InvalidCost),
      );
      assert.throws(
        () => bucket.take(cost),
        (error) => isSpillwayError(error, ErrorCode.InvalidCost),
      );
    }
    assert.equal(bucket.take(0).remaining, 2);
  });

  it('works on the default coarse clock', () => {
    const bucket = createTokenBucket({ capacity: 2, refillPerSec: 0.001 });
    assert.equal(bucket.tryTake(), true);
    assert.equal(bucket.tryTake(), true);
    assert.equal(bucket.tryTake(), false);
  });
});
