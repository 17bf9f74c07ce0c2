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
