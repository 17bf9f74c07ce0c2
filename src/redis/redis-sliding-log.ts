import { ErrorCode, SpillwayError } from '../core/errors.js';
import { loadLuaScript } from './lua-script.js';
import type { RedisLimiter } from './redis-limiter.js';
import { createWindowLimiter, type RedisWindowOptions } from './redis-window-limiter.js';

export const slidingLogScript = loadLuaScript('sliding-log');

/** The largest sliding-log limit: one call's script writes up to this many members. */
export const MAX_SLIDING_LOG_LIMIT = 100_000;

/** `limit`: cost admitted in any span of `windowMs`. */
export type RedisSlidingLogOptions = RedisWindowOptions;

/**
 * Sliding window log: a sorted set with one member per admitted cost unit, scored by Redis time
 * in microseconds; every member is unique (the microsecond time, suffixed where it is taken).
 *
 * Pro: exact: at most `limit` in any span of `windowMs`, no boundary burst; exact retryAfterMs.
 * Con: memory and work grow with the limit (one member per admitted unit, O(log n) per add), so
 * it suits limits in the hundreds or low thousands per window, not millions. A limit over
 * `MAX_SLIDING_LOG_LIMIT` is refused: one call's script writes up to `limit` members, and a script
 * blocks Redis for every client while it runs (docs/redis-limiters.md); use the sliding-window
 * counter for large limits.
 *
 * Example: limit 3, windowMs 1000. Calls at t=0, 100, 200 ms are admitted; at t=500 the call is
 * rejected with retryAfterMs 500 (the t=0 entry leaves the window at t=1000); at t=1000 it passes.
 */
export function createRedisSlidingLog(o: RedisSlidingLogOptions): RedisLimiter {
  return createWindowLimiter(o, slidingLogScript, 'sl', 'createRedisSlidingLog', (limit) => {
    if (limit > MAX_SLIDING_LOG_LIMIT) {
      throw new SpillwayError(
        ErrorCode.InvalidLimit,
        `limit ${limit} is over the sliding log's ${MAX_SLIDING_LOG_LIMIT} (one member per unit; use createRedisSlidingCounter)`,
        { field: 'limit' },
      );
    }
  });
}
