import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { Decision } from '../../src/core/decision.js';
import { rateLimitHeaders } from '../../src/http/rate-limit-headers.js';
import { createRateLimitField } from '../../src/http/rate-limit-middleware.js';

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
});
