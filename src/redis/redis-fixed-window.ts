import { loadLuaScript } from './lua-script.js';
import type { RedisLimiter } from './redis-limiter.js';
import { createWindowLimiter, type RedisWindowOptions } from './redis-window-limiter.js';

export const fixedWindowScript = loadLuaScript('fixed-window');

/** `limit`: cost admitted per window; windows are aligned to epoch multiples of `windowMs` on the Redis clock. */
export type RedisFixedWindowOptions = RedisWindowOptions;

/**
 * Fixed window: one counter per key per window, in one hash with its window start.
 *
 * Pro: one small key, O(1), cheapest of the four; `resetAtMs` is the same for every caller.
 * Con: up to 2 x limit can pass in a span much shorter than a window: a full window's worth just
 * before a boundary and another just after it.
 *
 * Example: limit 100, windowMs 60_000. 100 calls at 12:00:59.9 are admitted; the 101st at
 * 12:00:59.95 is rejected with retryAfterMs 50; 100 more at 12:01:00.0 are admitted again.
 */
export function createRedisFixedWindow(o: RedisFixedWindowOptions): RedisLimiter {
  return createWindowLimiter(o, fixedWindowScript, 'fw', 'createRedisFixedWindow');
}
