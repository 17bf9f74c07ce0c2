import { assertKnownOptions, assertTokenBucketRate, optionNames } from '../core/validate.js';
import { loadLuaScript } from './lua-script.js';
import { redisKey } from './redis-key.js';
import {
  createRedisLimiter,
  REDIS_COMMON_OPTIONS,
  type RedisLimiter,
  type RedisLimiterCommonOptions,
} from './redis-limiter.js';

export const tokenBucketScript = loadLuaScript('token-bucket');

export interface RedisTokenBucketOptions extends RedisLimiterCommonOptions {
  /** Bucket size: the largest burst, and the decision's `limit`. */
  capacity: number;
  /** Tokens added per second, continuously (fractions of a token accumulate). */
  refillPerSec: number;
}

/**
 * Token bucket: tokens (possibly fractional) and the Redis time they were counted at, in one string
 * key that expires when the bucket would be full again.
 *
 * Pro: O(1); allows bursts up to `capacity` and a steady `refillPerSec` after; fractional costs;
 * the smoothest of the four (no window edges at all).
 * Con: "N per window" is not what it enforces: over a span of T seconds up to
 * capacity + refillPerSec * T pass, which users must size for.
 *
 * Example: capacity 10, refillPerSec 2. A burst of 10 passes; the 11th is rejected with
 * retryAfterMs 500; 1.25 s later 2.5 tokens are back (remaining 2.5), so two calls pass.
 */
const TOKEN_BUCKET_OPTIONS = optionNames<RedisTokenBucketOptions>({
  ...REDIS_COMMON_OPTIONS,
  capacity: true,
  refillPerSec: true,
});

export function createRedisTokenBucket(o: RedisTokenBucketOptions): RedisLimiter {
  assertKnownOptions(o, TOKEN_BUCKET_OPTIONS, 'createRedisTokenBucket');
  // The key's TTL is the time to refill: past what Redis's PX takes, every call would fail.
  assertTokenBucketRate(o?.capacity, o?.refillPerSec);
  const { capacity, refillPerSec } = o;
  return createRedisLimiter(o, {
    name: 'token-bucket',
    script: tokenBucketScript,
    limit: capacity,
    integerCost: false,
    keys: (prefix, key) => [redisKey(prefix, key, 'tb')],
    args: (cost) => [capacity, refillPerSec, cost],
    // The script replies remaining tokens in millionths: Redis truncates Lua numbers to integers.
    remainingScale: 1_000_000,
  });
}
