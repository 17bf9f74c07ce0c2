import { loadLuaScript } from './lua-script.js';
import type { RedisLimiter } from './redis-limiter.js';
import { createWindowLimiter, type RedisWindowOptions } from './redis-window-limiter.js';

export const slidingCounterScript = loadLuaScript('sliding-counter');

/** `limit`: cost admitted per window, estimated over a sliding window (docs/redis-limiters.md). */
export type RedisSlidingCounterOptions = RedisWindowOptions;

/**
 * Sliding window counter: the current fixed window's count plus the previous window's count
 * weighted by the share of it the sliding window still covers.
 *
 * Pro: O(1) memory (one hash of three numbers) like the fixed window, without its instant 2 x
 * burst at a boundary: over any span of d <= windowMs at most limit * (1 + d / windowMs) pass.
 * Con: an estimate: it assumes the previous window's traffic was uniform, so it may admit up to
 * (just under) 2 x limit over a full window-length span when that traffic was bunched at the end
 * of the previous window, and may reject early when it was bunched at the start.
 *
 * Example: limit 100, windowMs 60_000; 80 admitted in the previous window, 30 so far in this one,
 * 15 s into it: estimate = 80 * 45/60 + 30 = 90, so 10 more are admitted now.
 */
export function createRedisSlidingCounter(o: RedisSlidingCounterOptions): RedisLimiter {
  return createWindowLimiter(o, slidingCounterScript, 'sc', 'createRedisSlidingCounter');
}
