import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, assertPositiveInteger, optionNames } from '../core/validate.js';
import type { LuaScript } from './lua-script.js';
import { redisKey } from './redis-key.js';
import {
  createRedisLimiter,
  REDIS_COMMON_OPTIONS,
  type RedisLimiter,
  type RedisLimiterCommonOptions,
} from './redis-limiter.js';

/** The options of a window limiter (fixed window, sliding log, sliding counter). */
export interface RedisWindowOptions extends RedisLimiterCommonOptions {
  limit: number;
  windowMs: number;
}

const WINDOW_OPTIONS = optionNames<RedisWindowOptions>({
  ...REDIS_COMMON_OPTIONS,
  limit: true,
  windowMs: true,
});

/** Refuses an option a window limiter does not know (a typo), before any other check. */
export function assertWindowOptionNames(options: unknown, where: string): void {
  assertKnownOptions(options, WINDOW_OPTIONS, where);
}

/**
 * Checks `limit` and `windowMs` of the window limiters. Both are whole numbers: counts are whole
 * requests and Redis TIME windows are aligned in milliseconds. `limit * windowMs` must stay a safe
 * integer because the sliding counter compares its weighted estimate multiplied by `windowMs`.
 */
export function assertWindowOptions(limit: unknown, windowMs: unknown): asserts limit is number {
  assertPositiveInteger('limit', limit);
  assertPositiveInteger('windowMs', windowMs);
  if (!Number.isSafeInteger(limit * (windowMs as number))) {
    throw new SpillwayError(
      ErrorCode.InvalidLimit,
      `limit * windowMs must be at most ${Number.MAX_SAFE_INTEGER}, got ${limit} * ${String(windowMs)}`,
      { field: 'limit' },
    );
  }
}

/** What tells the window limiters apart: the script, and the tag of its key (`{prefix:key}:fw`). */
/**
 * A window limiter (fixed window, sliding log, sliding counter): `limit` whole cost units per
 * `windowMs` (option names and values checked first, named after `factory`), one key per caller (its
 * hash tag `keyTag`), the script called with
 * `limit, windowMs, cost`.
 */
export function createWindowLimiter(
  options: RedisWindowOptions,
  script: LuaScript,
  keyTag: string,
  factory: string,
  checkLimit?: (limit: number) => void,
): RedisLimiter {
  assertWindowOptionNames(options, factory);
  assertWindowOptions(options?.limit, options?.windowMs);
  checkLimit?.(options.limit);
  const { limit, windowMs } = options;
  return createRedisLimiter(options, {
    name: script.name,
    script,
    limit,
    integerCost: true,
    keys: (prefix, key) => [redisKey(prefix, key, keyTag)],
    args: (cost) => [limit, windowMs, cost],
  });
}
