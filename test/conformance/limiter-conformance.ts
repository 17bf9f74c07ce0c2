import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import type { Decision } from '../../src/core/decision.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';

/**
 * The one conformance suite every Spillway limiter runs (local, Redis, global): same cases, same
 * assertions, whatever the algorithm or store. A subject that cannot meet a case lists it in
 * `skip` with the reason, which the test report prints.
 *
 * Count cases use a long window (60 s) so a real-time subject cannot refill in the middle of a
 * case; only `replenishes` uses the subject's `windowMs` and `advance()`.
 */
export type ConformanceCase =
  | 'admits-up-to-limit'
  | 'decision-fields'
  | 'cost'
  | 'cost-over-remaining'
  | 'zero-cost-peek'
  | 'keys-independent'
  | 'replenishes'
  | 'invalid-input';

export const CONFORMANCE_CASES: readonly ConformanceCase[] = [
  'admits-up-to-limit',
  'decision-fields',
  'cost',
  'cost-over-remaining',
  'zero-cost-peek',
  'keys-independent',
  'replenishes',
  'invalid-input',
];

export interface ConformanceLimiter {
  limit(key: string, cost?: number): Decision | Promise<Decision>;
}

export interface ConformanceSubject {
  name: string;
  /** A fresh limiter admitting `limit` units per `windowMs` (token buckets: capacity=limit, refill=limit per window). Each call must return an isolated limiter (fresh keys/prefix). */
  create(options: { limit: number; windowMs: number }): Promise<ConformanceLimiter> | ConformanceLimiter;
  /** Let `ms` of time pass for limiters made by this subject (manual clock advance, or a real wait for Redis). */
  advance(ms: number): Promise<void> | void;
  /** Window to use for the time-based cases (Redis subjects pick a short real window, e.g. 300 ms). */
  windowMs?: number;
  /** Cases this subject cannot meet, each with the reason (printed as the skip message). */
  skip?: Partial<Record<ConformanceCase, string>>;
  after?(): Promise<void> | void;
  /**
   * The subject's current time in epoch ms, as its limiters see it. Default `Date.now()`, right for
   * real-time subjects (a local Redis's TIME is the host clock); manual-clock subjects return the
   * manual clock's time.
   */
  nowMs?(): number;
}

/** Long enough that no real-time subject refills during a count case. */
const COUNT_WINDOW_MS = 60_000;
const DEFAULT_TIME_WINDOW_MS = 1_000;
/** Limiters may keep fractional state; counts are compared within this. */
const COUNT_TOLERANCE = 1e-6;
/** Times may be rounded to the millisecond by a store. */
const TIME_TOLERANCE_MS = 1;

export function describeLimiterConformance(subject: ConformanceSubject): void {
  const windowMs = subject.windowMs ?? DEFAULT_TIME_WINDOW_MS;
  const nowMs = (): number => subject.nowMs?.() ?? Date.now();

  /**
   * Checks `remaining` against the count expected if time stood still. It may be higher by what a
   * continuously refilling limiter (limit per COUNT_WINDOW_MS) could have regained since the case
   * began: nothing on a manual clock, a hair in real time. Never lower.
   */
  const remainingChecker = (limit: number) => {
    const startMs = nowMs();
    return (actual: number, expected: number, what: string): void => {
      const refill = (limit * (Math.max(0, nowMs() - startMs) + TIME_TOLERANCE_MS)) / COUNT_WINDOW_MS;
      assert.ok(
        actual >= expected - COUNT_TOLERANCE && actual <= expected + COUNT_TOLERANCE + refill,
        `${what}: expected ${expected}, got ${actual}`,
      );
    };
  };

  const check = (name: ConformanceCase, title: string, fn: () => Promise<void>): void => {
    const reason = subject.skip?.[name];
    it(`${name}: ${title}`, reason === undefined ? {} : { skip: reason }, fn);
  };

  describe(`limiter conformance: ${subject.name}`, () => {
    after(async () => {
      await subject.after?.();
    });

    check(
      'admits-up-to-limit',
      'admits exactly `limit` calls, sequential or concurrent, then rejects',
      async () => {
        const limiter = await subject.create({ limit: 5, windowMs: COUNT_WINDOW_MS });
        for (let call = 1; call <= 5; call++) {
          const decision = await limiter.limit('conformance:sequential');
          assert.equal(decision.allowed, true, `call ${call} of 5 must be admitted`);
        }
        for (let call = 6; call <= 7; call++) {
          const decision = await limiter.limit('conformance:sequential');
          assert.equal(decision.allowed, false, `call ${call} is over the limit of 5 and must be rejected`);
        }
        const concurrent = await Promise.all(
          Array.from({ length: 12 }, async () => limiter.limit('conformance:concurrent')),
        );
        assert.equal(
          concurrent.filter((decision) => decision.allowed).length,
          5,
          'exactly 5 of 12 concurrent calls are admitted',
        );
      },
    );

    check(
      'decision-fields',
      'limit, decreasing remaining, retryAfterMs and resetAtMs are consistent',
      async () => {
        const limiter = await subject.create({ limit: 3, windowMs: COUNT_WINDOW_MS });
        const assertRemaining = remainingChecker(3);
        const key = 'conformance:fields';
        const startMs = nowMs();
        for (let call = 1; call <= 3; call++) {
          const decision = await limiter.limit(key);
          assertDecisionShape(decision);
          assert.equal(decision.allowed, true);
          assert.equal(decision.limit, 3);
          assertRemaining(decision.remaining, 3 - call, `remaining after call ${call}`);
          assert.equal(decision.retryAfterMs, 0, 'an admitted call has nothing to wait for');
          assert.ok(decision.resetAtMs + TIME_TOLERANCE_MS >= startMs, 'resetAtMs is not in the past');
        }
        const beforeMs = nowMs();
        const rejected = await limiter.limit(key);
        assertDecisionShape(rejected);
        assert.equal(rejected.allowed, false);
        assert.equal(rejected.limit, 3);
        assertRemaining(rejected.remaining, 0, 'remaining when rejected');
        assert.ok(
          rejected.retryAfterMs > 0,
          `retryAfterMs ${rejected.retryAfterMs} must be > 0 when rejected`,
        );
        assert.ok(
          rejected.retryAfterMs <= COUNT_WINDOW_MS + TIME_TOLERANCE_MS,
          `retryAfterMs ${rejected.retryAfterMs} is at most one window for a cost of 1`,
        );
        assert.ok(
          rejected.resetAtMs > beforeMs,
          `resetAtMs ${rejected.resetAtMs} must be after now ${beforeMs}`,
        );
        assert.ok(
          rejected.resetAtMs + TIME_TOLERANCE_MS >= beforeMs + rejected.retryAfterMs,
          'full replenishment is no sooner than the next admission',
        );
      },
    );

    check('cost', 'a call of cost n consumes n units', async () => {
      const limiter = await subject.create({ limit: 10, windowMs: COUNT_WINDOW_MS });
      const assertRemaining = remainingChecker(10);
      const key = 'conformance:cost';
      const first = await limiter.limit(key, 3);
      assert.equal(first.allowed, true);
      assertRemaining(first.remaining, 7, 'remaining after cost 3');
      const second = await limiter.limit(key, 7);
      assert.equal(second.allowed, true);
      assertRemaining(second.remaining, 0, 'remaining after cost 3 + 7');
      assert.equal((await limiter.limit(key, 1)).allowed, false, 'nothing is left after 10 of 10');
      const whole = await limiter.limit('conformance:cost-whole', 10);
      assert.equal(whole.allowed, true, 'a cost equal to the limit is admitted on a fresh key');
      assertRemaining(whole.remaining, 0, 'remaining after a cost equal to the limit');
    });

    check('cost-over-remaining', 'a cost above what remains is rejected and consumes nothing', async () => {
      const limiter = await subject.create({ limit: 5, windowMs: COUNT_WINDOW_MS });
      const assertRemaining = remainingChecker(5);
      const key = 'conformance:over';
      assert.equal((await limiter.limit(key, 3)).allowed, true);
      const rejected = await limiter.limit(key, 3);
      assert.equal(rejected.allowed, false, 'cost 3 with 2 remaining is rejected');
      assert.ok(rejected.retryAfterMs > 0);
      const rest = await limiter.limit(key, 2);
      assert.equal(
        rest.allowed,
        true,
        'the rejected call consumed nothing: the 2 remaining units are still there',
      );
      assertRemaining(rest.remaining, 0, 'remaining after taking the rest');
      assert.equal((await limiter.limit(key, 1)).allowed, false);
    });

    check('zero-cost-peek', 'cost 0 reports remaining and never consumes', async () => {
      const limiter = await subject.create({ limit: 3, windowMs: COUNT_WINDOW_MS });
      const assertRemaining = remainingChecker(3);
      const key = 'conformance:peek';
      for (let peek = 0; peek < 5; peek++) {
        const decision = await limiter.limit(key, 0);
        assert.equal(decision.allowed, true, 'a peek at a fresh key is admitted');
        assertRemaining(decision.remaining, 3, 'a fresh key has the whole limit');
      }
      assertRemaining((await limiter.limit(key)).remaining, 2, 'remaining after one call');
      assertRemaining((await limiter.limit(key, 0)).remaining, 2, 'a peek sees the same remaining');
      assertRemaining((await limiter.limit(key, 0)).remaining, 2, 'and peeking again changes nothing');
      assert.equal((await limiter.limit(key)).allowed, true);
      assert.equal((await limiter.limit(key)).allowed, true);
      assertRemaining((await limiter.limit(key, 0)).remaining, 0, 'a peek at an exhausted key sees 0');
      assert.equal((await limiter.limit(key)).allowed, false);
    });

    check('keys-independent', 'each key has its own budget', async () => {
      const limiter = await subject.create({ limit: 2, windowMs: COUNT_WINDOW_MS });
      const assertRemaining = remainingChecker(2);
      // Related-looking keys (a prefix of another, braces, non-ASCII) must still be distinct.
      const keys = ['conformance:a', 'conformance:a:b', 'conformance:{a}', 'conformance:Ω ü'];
      for (const call of [1, 2]) {
        const decision = await limiter.limit(keys[0]!);
        assert.equal(decision.allowed, true, `call ${call} on ${keys[0]}`);
      }
      assert.equal((await limiter.limit(keys[0]!)).allowed, false);
      for (const key of keys.slice(1)) {
        const first = await limiter.limit(key);
        assert.equal(first.allowed, true, `${key} is untouched by ${keys[0]}`);
        assertRemaining(first.remaining, 1, `remaining of ${key}`);
        assert.equal((await limiter.limit(key)).allowed, true);
        assert.equal((await limiter.limit(key)).allowed, false);
      }
      assert.equal((await limiter.limit(keys[0]!)).allowed, false, `${keys[0]} is still exhausted`);
    });

    check('replenishes', 'admits again after retryAfterMs, and the whole limit after a window', async () => {
      const limiter = await subject.create({ limit: 3, windowMs });
      const key = 'conformance:replenish';
      for (let call = 1; call <= 3; call++) assert.equal((await limiter.limit(key)).allowed, true);
      const rejected = await limiter.limit(key);
      assert.equal(rejected.allowed, false);
      assert.ok(rejected.retryAfterMs > 0 && rejected.retryAfterMs <= windowMs + TIME_TOLERANCE_MS);
      await subject.advance(rejected.retryAfterMs / 4);
      assert.equal((await limiter.limit(key)).allowed, false, 'not admitted a quarter of retryAfterMs early');
      await subject.advance((rejected.retryAfterMs * 3) / 4);
      assert.equal((await limiter.limit(key)).allowed, true, 'admitted once retryAfterMs has passed');
      await subject.advance(windowMs);
      for (let call = 1; call <= 3; call++) {
        assert.equal((await limiter.limit(key)).allowed, true, `call ${call} of 3 after a full window`);
      }
    });

    check('invalid-input', 'bad cost or key fails with a stable code and touches no state', async () => {
      const limiter = await subject.create({ limit: 3, windowMs: COUNT_WINDOW_MS });
      const key = 'conformance:invalid';
      for (const cost of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
        await expectSpillwayError(() => limiter.limit(key, cost), ErrorCode.InvalidCost, `cost ${cost}`);
      }
      await expectSpillwayError(() => limiter.limit(''), ErrorCode.InvalidKey, 'an empty key');
      await expectSpillwayError(
        () => limiter.limit('k'.repeat(10_000)),
        ErrorCode.InvalidKey,
        'a 10,000-character key',
      );
      for (let call = 1; call <= 3; call++) {
        assert.equal(
          (await limiter.limit(key)).allowed,
          true,
          `call ${call}: invalid calls consumed nothing`,
        );
      }
      assert.equal((await limiter.limit(key)).allowed, false);
    });
  });
}

function assertDecisionShape(decision: Decision): void {
  assert.equal(typeof decision.allowed, 'boolean');
  for (const field of ['limit', 'remaining', 'resetAtMs', 'retryAfterMs'] as const) {
    assert.ok(Number.isFinite(decision[field]), `${field} must be a finite number, got ${decision[field]}`);
  }
  assert.ok(decision.remaining >= 0, 'remaining is never negative');
  assert.ok(decision.retryAfterMs >= 0, 'retryAfterMs is never negative');
}

/** Accepts a synchronous throw or a rejected promise: sync and async limiters both conform. */
async function expectSpillwayError(call: () => unknown, code: ErrorCode, what: string): Promise<void> {
  let failure: unknown;
  try {
    await call();
  } catch (error) {
    failure = error;
  }
  assert.ok(
    isSpillwayError(failure, code),
    `${what}: expected SpillwayError ${code}, got ${failure === undefined ? 'no error' : String(failure)}`,
  );
}
