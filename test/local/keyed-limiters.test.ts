import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import type { KeyedLocalLimiter } from '../../src/local/keyed-local-limiter.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';

const T0 = 1_700_000_000_000;

interface Family {
  name: string;
  /** `capacity` units at once, refilled at `perSec`. */
  create(options: {
    capacity: number;
    perSec: number;
    clock: ManualClock;
    maxKeys?: number;
    idleMs?: number;
  }): KeyedLocalLimiter;
}

const families: Family[] = [
  {
    name: 'keyed token bucket',
    create: ({ capacity, perSec, ...rest }) =>
      createKeyedTokenBucket({ capacity, refillPerSec: perSec, ...rest }),
  },
  {
    name: 'keyed GCRA',
    create: ({ capacity, perSec, ...rest }) =>
      createKeyedGcra({ limit: perSec, periodMs: 1_000, burst: capacity, ...rest }),
  },
];

for (const family of families) {
  describe(family.name, () => {
    it('stays within maxKeys under 1,000,000 distinct keys and keeps a hot key state', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 10, perSec: 1 / 3600, clock, maxKeys: 10_000 });
      assert.equal(limiter.limit('hot', 7).remaining, 3);
      let maxSize = 0;
      for (let i = 0; i < 1_000_000; i++) {
        limiter.tryTake(`flood:${i}`);
        if (i % 100 === 0) limiter.tryTake('hot', 0);
        if (limiter.size > maxSize) maxSize = limiter.size;
      }
      assert.ok(maxSize <= 10_000, `size reached ${maxSize}`);
      assert.equal(limiter.size, 10_000, 'the flood keys are not full, so none expired');
      assert.ok(limiter.evictions >= 990_000, `evictions ${limiter.evictions}`);
      const hot = limiter.limit('hot', 0);
      assert.ok(Math.abs(hot.remaining - 3) < 1e-3, `hot key kept its state: remaining ${hot.remaining}`);
      assert.equal(limiter.limit('hot', 4).allowed, false, 'the hot key is still drained');
    });

    it('evicts a key that is not touched again, which then starts full', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 2, perSec: 1 / 3600, clock, maxKeys: 100 });
      assert.equal(limiter.tryTake('cold', 2), true);
      assert.equal(limiter.tryTake('cold'), false);
      for (let i = 0; i < 1_000; i++) limiter.tryTake(`flood:${i}`);
      assert.ok(limiter.size <= 100);
      assert.equal(limiter.tryTake('cold'), true, 'evicted: its debt is forgotten (the price of the bound)');
    });

    it('expires keys whose bucket is full again, losslessly, as new keys arrive', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 2, perSec: 1, clock });
      for (let i = 0; i < 1_000; i++) limiter.tryTake(`old:${i}`, 2);
      assert.equal(limiter.size, 1_000);
      clock.advance(1_999);
      assert.equal(limiter.prune(), 0, 'not full yet: 1.999 of 2 tokens');
      clock.advance(1);
      for (let i = 0; i < 600; i++) limiter.tryTake(`new:${i}`);
      assert.ok(limiter.size < 1_000, `sweeping on insert dropped full keys: size ${limiter.size}`);
      limiter.prune();
      assert.equal(limiter.size, 600, 'prune drops every full key and keeps the rest');
      assert.equal(limiter.limit('old:1', 0).remaining, 2);
    });

    it('drops keys idle for idleMs even before they are full (lossy, by choice)', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 10, perSec: 1, clock, idleMs: 500 });
      limiter.tryTake('a', 10);
      clock.advance(499);
      assert.equal(limiter.prune(), 0);
      assert.equal(limiter.size, 1);
      clock.advance(1);
      assert.equal(limiter.prune(), 1);
      assert.equal(limiter.limit('a', 0).remaining, 10);
    });

    it('keeps a partly drained key (not expired) through prune', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 2, perSec: 1, clock });
      limiter.tryTake('k', 2);
      clock.advance(500);
      assert.equal(limiter.prune(), 0);
      assert.ok(Math.abs(limiter.limit('k', 0).remaining - 0.5) < 1e-9);
    });

    it('grows up to a maxKeys that is not a power of two, and never past it', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 1, perSec: 0.001, clock, maxKeys: 3_000 });
      for (let i = 0; i < 5_000; i++) {
        limiter.tryTake(`k:${i}`);
        assert.ok(limiter.size <= 3_000);
      }
      assert.equal(limiter.size, 3_000);
      assert.equal(limiter.tryTake('k:4999'), false, 'the newest key is held and drained');
    });

    it('peeks (cost 0) without storing a key', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 3, perSec: 1, clock });
      assert.equal(limiter.limit('nobody', 0).remaining, 3);
      assert.equal(limiter.tryTake('nobody', 0), true);
      assert.equal(limiter.size, 0);
    });

    it('reset forgets a key', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 1, perSec: 0.001, clock });
      assert.equal(limiter.tryTake('k'), true);
      assert.equal(limiter.tryTake('k'), false);
      limiter.reset('k');
      assert.equal(limiter.size, 0);
      assert.equal(limiter.tryTake('k'), true);
    });

    it('tryTake and limit agree', () => {
      const clock = new ManualClock(T0);
      const fast = family.create({ capacity: 3, perSec: 5, clock });
      const full = family.create({ capacity: 3, perSec: 5, clock });
      for (let step = 0; step < 2_000; step++) {
        const key = `k:${step % 7}`;
        const cost = step % 4;
        assert.equal(fast.tryTake(key, cost), full.limit(key, cost).allowed, `step ${step}`);
        clock.advance((step * 37) % 211);
      }
    });

    it('mints nothing per key when the clock goes backwards', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 2, perSec: 10, clock });
      assert.equal(limiter.tryTake('k', 2), true);
      clock.set(T0 - 10_000);
      assert.equal(limiter.tryTake('k'), false);
      clock.set(T0 + 99);
      assert.equal(limiter.tryTake('k'), false);
      clock.set(T0 + 100);
      assert.equal(limiter.tryTake('k'), true);
    });

    it('rejects bad keys and costs with stable codes before touching state', () => {
      const clock = new ManualClock(T0);
      const limiter = family.create({ capacity: 2, perSec: 1, clock });
      const bad: [() => unknown, string][] = [
        [() => limiter.limit(''), ErrorCode.InvalidKey],
        [() => limiter.tryTake('x'.repeat(513)), ErrorCode.InvalidKey],
        [() => limiter.limit(42 as unknown as string), ErrorCode.InvalidKey],
        [() => limiter.tryTake('k', -1), ErrorCode.InvalidCost],
        [() => limiter.limit('k', Number.NaN), ErrorCode.InvalidCost],
        [() => limiter.limit('k', 3), ErrorCode.InvalidCost],
      ];
      for (const [call, code] of bad) {
        assert.throws(call, (error) => isSpillwayError(error) && error.code === code);
      }
      assert.equal(limiter.size, 0);
    });
  });
}

describe('keyed limiter options', () => {
  it('rejects invalid options with ERR_SPILLWAY_INVALID_LIMIT', () => {
    const attempts: (() => unknown)[] = [
      () => createKeyedTokenBucket({ capacity: 0, refillPerSec: 1 }),
      () => createKeyedTokenBucket({ capacity: 1, refillPerSec: Number.NaN }),
      () => createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, maxKeys: 0 }),
      () => createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, maxKeys: 1.5 }),
      () => createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, idleMs: -5 }),
      () => createKeyedGcra({ limit: 0, periodMs: 1_000 }),
      () => createKeyedGcra({ limit: 1, periodMs: 1_000, burst: Number.NaN }),
      () => createKeyedGcra({ limit: 1, periodMs: 1_000, maxKeyLength: 0 }),
    ];
    for (const attempt of attempts) {
      assert.throws(attempt, (error) => isSpillwayError(error, ErrorCode.InvalidLimit));
    }
  });

  it('accepts longer keys up to maxKeyLength', () => {
    const limiter = createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, maxKeyLength: 2_000 });
    assert.equal(limiter.tryTake('k'.repeat(2_000)), true);
    assert.throws(
      () => limiter.tryTake('k'.repeat(2_001)),
      (error) => isSpillwayError(error, ErrorCode.InvalidKey),
    );
  });
});

describe('keyed key table: eviction looks for an expired entry before a live one', () => {
  it("a full table reuses an expired slot near the hand instead of forgetting a live key's debt", () => {
    const clock = new ManualClock(T0);
    const bucket = createKeyedTokenBucket({ capacity: 10, refillPerSec: 1, maxKeys: 4, clock });
    // A, B and C drain (full again in 10 s); D takes 1 (full again in 1 s).
    for (const key of ['A', 'B', 'C']) bucket.limit(key, 10);
    bucket.limit('D', 1);
    for (const key of ['E', 'F', 'G']) {
      clock.advance(2_000);
      bucket.limit(key, 1);
    }
    assert.equal(bucket.evictions, 0, 'every new key found an expired entry');
    for (const key of ['A', 'B', 'C'])
      assert.equal(bucket.limit(key, 0).remaining, 6, `${key} kept its debt`);
  });
});

describe('local limiters refuse options whose derived times are not exact milliseconds', () => {
  it('a GCRA interval that underflows to 0, a token bucket that refills in more than 2^53 ms', () => {
    assert.throws(() => createKeyedGcra({ limit: 1e300, periodMs: 1e-30 }), {
      code: 'ERR_SPILLWAY_INVALID_LIMIT',
      message: /the emission interval/,
    });
    assert.throws(() => createKeyedTokenBucket({ capacity: 1e308, refillPerSec: 1e-10 }), {
      code: 'ERR_SPILLWAY_INVALID_LIMIT',
      message: /the time to refill the bucket/,
    });
  });
});
