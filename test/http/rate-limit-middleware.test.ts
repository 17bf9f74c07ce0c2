import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { Decision } from '../../src/core/decision.js';
import { createRateLimitField, rateLimitHeaders } from '../../src/http/rate-limit-headers.js';

const number = fc.oneof(
  fc.double({ noNaN: false }),
  fc.integer({ min: -1_000_000, max: 10_000_000 }),
  fc.constantFrom(0, 1, 999.9999999, 1000.0000001, Number.POSITIVE_INFINITY),
);

describe('createRateLimitField', () => {
  it('writes exactly what rateLimitHeaders writes for one policy, for any decision and clock', () => {
    fc.assert(
      fc.property(
        fc.record({
          name: fc.string({ minLength: 1, maxLength: 8 }),
          limit: fc.double({ min: 0.5, max: 1e13, noNaN: true }),
          windowSec: fc.double({ min: 0.5, max: 1e6, noNaN: true }),
        }),
        fc.array(
          fc.record({
            allowed: fc.boolean(),
            limit: fc.oneof(fc.constant(0), number),
            remaining: number,
            /** Relative to now, so offsets just past a whole second (float noise) come up often. */
            resetOffsetMs: fc.oneof(number, fc.constantFrom(1000.0000001, 2999.9999999, 3000.0000004, -0.5)),
            retryAfterMs: number,
          }),
          { minLength: 1, maxLength: 5 },
        ),
        fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 2_000_000_000_000 })),
        (policy, decisions, nowMs) => {
          // One field function over a sequence: its cache must never return a stale field.
          const field = createRateLimitField(policy);
          for (const { resetOffsetMs, ...rest } of decisions) {
            const decision: Decision = { ...rest, resetAtMs: nowMs + resetOffsetMs };
            const expected = rateLimitHeaders([{ policy, decision }], nowMs).RateLimit;
            assert.equal(field(decision, nowMs), expected, JSON.stringify({ policy, decision, nowMs }));
          }
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('a rejection with a NaN reset or retry still says t of at least Retry-After, and a NaN remaining is 0', () => {
    const policy = { name: 'api', limit: 10, windowSec: 60 };
    const field = createRateLimitField(policy);
    const nan = Number.NaN;
    const rejected: Decision = {
      allowed: false,
      limit: 10,
      remaining: 0,
      resetAtMs: nan,
      retryAfterMs: 2500,
    };
    assert.equal(field(rejected, 1000), '"api";r=0;t=3');
    assert.equal(rateLimitHeaders([{ policy, decision: rejected }], 1000).RateLimit, '"api";r=0;t=3');
    const noRetry: Decision = { ...rejected, retryAfterMs: nan };
    assert.equal(field(noRetry, 1000), '"api";r=0;t=1');
    assert.equal(rateLimitHeaders([{ policy, decision: noRetry }], 1000)['Retry-After'], '1');
    const admitted: Decision = { allowed: true, limit: 10, remaining: nan, resetAtMs: nan, retryAfterMs: 0 };
    assert.equal(field(admitted, 1000), '"api";r=0;t=0');
  });
});
