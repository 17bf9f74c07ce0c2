import { ErrorCode, SpillwayError } from './errors.js';

/**
 * Input checks shared by every limiter. They run before any store call, so bad input never costs
 * a round trip and never reaches a Lua script.
 */

/** Longest key accepted by default: long enough for `tenant:route:caller` keys, short enough to bound memory. */
export const DEFAULT_MAX_KEY_LENGTH = 512;

export function assertPositiveFinite(name: string, value: unknown): asserts value is number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new SpillwayError(
      ErrorCode.InvalidLimit,
      `${name} must be a positive finite number, got ${String(value)}`,
      {
        field: name,
      },
    );
  }
}

/**
 * The longest time a limiter may derive from its options: what Redis's `PX` takes (a signed 64-bit
 * count of milliseconds from now), with room to spare; about 285 million years.
 */
const MAX_DERIVED_SPAN_MS = 9e18;

/**
 * A time a limiter derives from its options (the time to refill a whole bucket, a GCRA's emission
 * interval and tolerance): above 0 and at most `MAX_DERIVED_SPAN_MS`. Valid-looking extremes
 * otherwise give `NaN` or `Infinity` fields (an interval that underflows to 0, a refill time that
 * overflows) or a TTL Redis refuses on every call, which then fails open.
 */
function assertDerivedSpanMs(field: string, what: string, ms: number): void {
  if (ms > 0 && ms <= MAX_DERIVED_SPAN_MS) return;
  throw new SpillwayError(
    ErrorCode.InvalidLimit,
    `${what} is ${ms} ms; it must be above 0 and at most ${MAX_DERIVED_SPAN_MS} ms`,
    { field },
  );
}

/**
 * A token bucket's `capacity` and `refillPerSec`, each a positive finite number, and its time to
 * refill from empty within what a timer or a Redis TTL takes.
 */
export function assertTokenBucketRate(capacity: unknown, refillPerSec: unknown): void {
  assertPositiveFinite('capacity', capacity);
  assertPositiveFinite('refillPerSec', refillPerSec);
  assertDerivedSpanMs(
    'refillPerSec',
    'capacity / refillPerSec (the time to refill the bucket)',
    (capacity / refillPerSec) * 1000,
  );
}

/**
 * A GCRA's `limit`, `periodMs` and `burst`, each a positive finite number, and its emission
 * interval and tolerance within what a timer takes.
 */
export function assertGcraRate(limit: unknown, periodMs: unknown, burst: unknown): void {
  assertPositiveFinite('limit', limit);
  assertPositiveFinite('periodMs', periodMs);
  assertPositiveFinite('burst', burst);
  assertDerivedSpanMs('periodMs', 'periodMs / limit (the emission interval)', periodMs / limit);
  assertDerivedSpanMs('burst', 'periodMs / limit * burst (the tolerance)', (periodMs / limit) * burst);
}

export function assertPositiveInteger(name: string, value: unknown): asserts value is number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new SpillwayError(
      ErrorCode.InvalidLimit,
      `${name} must be a positive integer, got ${String(value)}`,
      {
        field: name,
      },
    );
  }
}

/** A cost is a finite number >= 0 (0 peeks without consuming) and at most `max` (the limit). */
export function assertCost(cost: unknown, max: number): asserts cost is number {
  if (typeof cost !== 'number' || !Number.isFinite(cost) || cost < 0) {
    throw new SpillwayError(ErrorCode.InvalidCost, `cost must be a finite number >= 0, got ${String(cost)}`, {
      field: 'cost',
    });
  }
  if (cost > max) {
    throw new SpillwayError(
      ErrorCode.InvalidCost,
      `cost ${cost} exceeds the limit ${max} and could never be admitted`,
      {
        field: 'cost',
      },
    );
  }
}

export function assertKey(key: unknown, maxLength = DEFAULT_MAX_KEY_LENGTH): asserts key is string {
  if (typeof key !== 'string' || key.length === 0) {
    throw new SpillwayError(ErrorCode.InvalidKey, 'key must be a non-empty string', { field: 'key' });
  }
  if (key.length > maxLength) {
    throw new SpillwayError(
      ErrorCode.InvalidKey,
      `key is ${key.length} characters, over the maximum ${maxLength}`,
      {
        field: 'key',
        maxLength,
      },
    );
  }
}
