import { createRedisFixedWindow } from '../redis/redis-fixed-window.js';
import type { RedisLimiter, RedisLimiterCommonOptions } from '../redis/redis-limiter.js';
import type { DescriptorOutcome, RlsBackend, WindowLimit } from './rls-backend.js';

/** Distinct (requests_per_unit, unit) pairs held at once. */
const MAX_LIMITERS = 1_000;

export type RedisBackendOptions = Omit<RedisLimiterCommonOptions, 'maxKeyLength'> & {
  /** Called by close(), e.g. to quit the client. */
  onClose?: () => Promise<void>;
};

/**
 * envoyproxy/ratelimit's shape: a Redis round trip per descriptor, on our atomic fixed-window
 * script (windows aligned to the epoch on the Redis clock). One limiter per distinct
 * (requests_per_unit, unit) pair, all on the same prefix; the bucket key names the counter. A
 * Redis that fails or does not answer in time is decided by the fail policy (default open).
 */
export function createRedisBackend(options: RedisBackendOptions): RlsBackend & {
  readonly limiters: number;
} {
  // Keyed by limit: a request's own limit can be any (requests_per_unit, unit), so the table is
  // bounded, oldest first out (a limiter holds no counts; Redis does).
  const limiters = new Map<string, RedisLimiter>();
  const { onClose, ...limiterOptions } = options;
  const limiterFor = (limit: WindowLimit): RedisLimiter => {
    const id = `${limit.requestsPerUnit}/${limit.unitSeconds}`;
    let limiter = limiters.get(id);
    if (limiter === undefined) {
      if (limiters.size >= MAX_LIMITERS) limiters.delete(limiters.keys().next().value!);
      limiter = createRedisFixedWindow({
        ...limiterOptions,
        limit: limit.requestsPerUnit,
        windowMs: limit.unitSeconds * 1000,
        maxKeyLength: 1024,
      });
      limiters.set(id, limiter);
    }
    return limiter;
  };
  const check = async (key: string, limit: WindowLimit, hits: number): Promise<DescriptorOutcome> => {
    // More than the whole window holds can never pass (the script refuses such a cost outright).
    if (hits > limit.requestsPerUnit) return { overLimit: true, remaining: 0 };
    const decision = await limiterFor(limit).limit(key, hits);
    const fault = decision.reason === 'fail-open' || decision.reason === 'fail-closed';
    return {
      overLimit: !decision.allowed,
      remaining: decision.allowed ? Math.floor(decision.remaining) : 0,
      ...(fault ? { fault } : {}),
    };
  };
  return {
    kind: 'redis',
    check,
    checkOverride: check,
    close: async () => {
      await onClose?.();
    },
    get limiters() {
      return limiters.size;
    },
  };
}
