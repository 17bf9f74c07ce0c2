import { loadLuaScript } from './lua-script.js';
import type { RedisLimiter, RedisLimiterCommonOptions } from './redis-limiter.js';
import { assertWindowOptionNames, assertWindowOptions, createWindowLimiter } from './redis-window-limiter.js';

export const slidingCounterScript = loadLuaScript('sliding-counter');

export interface RedisSlidingCounterOptions extends RedisLimiterCommonOptions {
  /** Cost admitted per window (estimated over a sliding window, see docs/redis-limiters.md). */
  limit: number;
  windowMs: number;
}

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
  assertWindowOptionNames(o, 'createRedisSlidingCounter');
  assertWindowOptions(o?.limit, o?.windowMs);
  return createWindowLimiter(o, { name: 'sliding-counter', script: slidingCounterScript, keyTag: 'sc' });
}
