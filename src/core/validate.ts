import { distance } from 'fastest-levenshtein';
import { ErrorCode, SpillwayError } from './errors.js';

/**
 * Input checks shared by every limiter. They run before any store call, so bad input never costs
 * a round trip and never reaches a Lua script.
 */

/** Longest key accepted by default: long enough for `tenant:route:caller` keys, short enough to bound memory. */
export const DEFAULT_MAX_KEY_LENGTH = 512;

/**
 * A value as an error message quotes it: a string in quotes with its type (`'10' (a string)`), so
 * `capacity: '10'` never reads as if 10 were refused; anything else as it prints.
 */
export function describeValue(value: unknown): string {
  if (typeof value === 'string') {
    const shown = value.length > 40 ? `${value.slice(0, 40)}...` : value;
    return `'${shown}' (a string)`;
  }
  if (typeof value === 'bigint') return `${value}n (a bigint)`;
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object' && value !== null) return 'an object';
  return String(value);
}

/**
 * The known name an unknown one was probably meant to be, or undefined. First the closest within a
 * few edits (`limt` for `limit`, `trustedProxy` for `trustedProxies`, `mdoe` for `mode`: two
 * neighbours swapped count as one edit; one edit per 3 characters, at least one); else, for a name
 * of 3 characters or more, one it begins within an edit (`limit` or `limt` for `limitRps`) or one
 * that begins it. Letter case is ignored.
 */
export function suggestName(unknown: string, known: readonly string[]): string | undefined {
  const folded = unknown.toLowerCase();
  let best: string | undefined;
  let bestEdits = Number.POSITIVE_INFINITY;
  for (const candidate of known) {
    const other = candidate.toLowerCase();
    const edits = swappedNeighbours(folded, other) ? 1 : distance(folded, other);
    if (edits < bestEdits) {
      bestEdits = edits;
      best = candidate;
    }
  }
  if (bestEdits <= Math.max(1, Math.floor(unknown.length / 3))) return best;
  if (folded.length < 3) return undefined;
  return known.find((candidate) => {
    const other = candidate.toLowerCase();
    return folded.startsWith(other) || distance(folded, other.slice(0, folded.length + 1)) <= 1;
  });
}

/** `a` is `b` with two neighbouring characters swapped. */
function swappedNeighbours(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let first = -1;
  for (let i = 0; i < a.length; i++) {
    if (a[i] === b[i]) continue;
    if (first !== -1)
      return i === first + 1 && a[first] === b[i] && a[i] === b[first] && a.slice(i + 1) === b.slice(i + 1);
    first = i;
  }
  return false;
}

/**
 * Refuses an options object with a field its function does not know, before any other check, so a
 * typo (`trustedProxy` for `trustedProxies`) is named as such instead of being ignored, or
 * reported as the field it left out. `where` names the function (`createKeyedTokenBucket`); the
 * error is ERR_SPILLWAY_INVALID_OPTION with details `{ field, suggestion }`. A field whose value is
 * `undefined` counts too: it is still a name the caller wrote.
 */
export function assertKnownOptions(options: unknown, known: readonly string[], where: string): void {
  if (typeof options !== 'object' || options === null) return;
  for (const field of Object.keys(options)) {
    if (known.includes(field)) continue;
    const suggestion = suggestName(field, known);
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `${where}: unknown option "${field}"${suggestion === undefined ? '' : `; did you mean "${suggestion}"?`} (known: ${known.join(', ')})`,
      suggestion === undefined ? { field } : { field, suggestion },
    );
  }
}

/**
 * Every option name of `T`, checked by the compiler both ways: a name missing from `keys` or one
 * `T` does not have fails to compile, so the list `assertKnownOptions` reads never drifts from the
 * interface it guards.
 */
export function optionNames<T>(keys: { readonly [K in keyof Required<T>]: true }): readonly string[] {
  return Object.freeze(Object.keys(keys));
}

export function assertPositiveFinite(name: string, value: unknown): asserts value is number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new SpillwayError(
      ErrorCode.InvalidLimit,
      `${name} must be a positive finite number, got ${describeValue(value)}`,
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
      `${name} must be a positive integer, got ${describeValue(value)}`,
      {
        field: name,
      },
    );
  }
}

/** A cost is a finite number >= 0 (0 peeks without consuming) and at most `max` (the limit). */
export function assertCost(cost: unknown, max: number): asserts cost is number {
  if (typeof cost !== 'number' || !Number.isFinite(cost) || cost < 0) {
    throw new SpillwayError(
      ErrorCode.InvalidCost,
      `cost must be a finite number >= 0, got ${describeValue(cost)}`,
      {
        field: 'cost',
      },
    );
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
