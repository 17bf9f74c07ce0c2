import { Redis } from 'ioredis';
import { systemClock } from '../../core/clock.js';
import { ErrorCode, SpillwayError } from '../../core/errors.js';
import type { GlobalLimiter, GlobalLimiterOptions } from '../../global/global-limiter.js';
import { createGlobalLimiter } from '../../global/global-limiter.js';
import type { GlobalLimiterLogger } from '../../global/reporter.js';
import { DEFAULT_STALE_HOLD_INTERVALS, type StalePolicy } from '../../global/stale-policy.js';
import { createKeyedTokenBucket, type KeyedTokenBucket } from '../../local/keyed-token-bucket.js';
import { createRedisFixedWindow } from '../../redis/redis-fixed-window.js';
import type { RedisLimiter } from '../../redis/redis-limiter.js';
import { ioredisAdapter } from '../../redis/redis-script-client.js';
import { createRedisSlidingCounter } from '../../redis/redis-sliding-counter.js';
import { createRedisSlidingLog } from '../../redis/redis-sliding-log.js';
import { createRedisTokenBucket } from '../../redis/redis-token-bucket.js';
import type { ControlClient } from '../../transport/control-transport.js';
import { type EdgeLimiter, toEdgeLimiter } from '../limiter-adapter.js';
import type { BackendConfig, ProxyBucket } from '../rules/proxy-rules.js';
import { assertProxyBackendOptionNames } from './proxy-options.js';

/**
 * The limiters behind the proxy's buckets, built from the rules file's `backend`:
 *
 * - `local`: one keyed token bucket per bucket (capacity `limit`, refilled `limit / windowSec`
 *   per second), in this process only.
 * - `redis`: one Redis limiter per bucket (the algorithm chosen), prefix `<prefix>:<bucket name>`,
 *   sharing one connection; faults decided by `failPolicy` within `timeoutMs`.
 * - `global`: one GlobalLimiter for all buckets; the rendered key is the GRL bucket key, so the
 *   controller's limits file decides the limit and mode (`limit`/`windowSec` only feed headers).
 *   A bucket whose key has no placeholder is pinned in the limiter's table when first built, so
 *   it keeps its entry whatever keys clients send (pins outlive a reload that removes the bucket:
 *   at most 64 per rules file, an entry each).
 *
 * `limiterFor` returns the same limiter for a bucket whose name, limit, window and cost bound are
 * unchanged, so a reload keeps counts of unchanged buckets; a changed bucket starts fresh.
 */
export interface ProxyBackend {
  readonly kind: BackendConfig['kind'];
  limiterFor(bucket: ProxyBucket): EdgeLimiter;
  /** The global limiter, for metrics and health (global backend only). */
  readonly globalLimiter: GlobalLimiter | undefined;
  /** Start background work (the global limiter's reports). */
  start(): void;
  /** Stop reports (sending a final one) and close connections. */
  close(): Promise<void>;
  /** Whether `config` can be served by this backend without a restart. */
  accepts(config: BackendConfig): boolean;
  /**
   * The key tables this process holds, one per bucket of the `local` backend (empty for `redis`,
   * whose keys live in Redis, and for `global`, whose one table the limiter's own metrics export).
   */
  keyTables(): KeyTableStats[];
  /**
   * Drops the limiters (and a local bucket's key table) of buckets not named here: those a reload
   * removed or renamed, which would otherwise hold their memory until a restart. A removed bucket
   * that comes back later starts fresh.
   */
  keepOnly(bucketNames: ReadonlySet<string>): void;
}

/** One local bucket's key table: how full it is and how many live keys it had to drop. */
export interface KeyTableStats {
  /** The bucket's name in the rules file. */
  bucket: string;
  keys: number;
  maxKeys: number;
  /** Live keys evicted because the table was full (cumulative since the bucket's limiter was built). */
  evictions: number;
}

export interface ProxyBackendOptions {
  /** Reporter identity for the global backend. */
  id: string;
  logger?: GlobalLimiterLogger & { warn(obj: object, msg: string): void };
  /** gRPC clients for the aggregators (global backend); built by the caller so it can instrument them. */
  controlClients?: ControlClient[];
  /** Extra options for the global limiter (tests inject a scheduler or a shorter interval). */
  global?: Partial<GlobalLimiterOptions>;
}

export function createProxyBackend(config: BackendConfig, options: ProxyBackendOptions): ProxyBackend {
  assertProxyBackendOptionNames(options);
  const accepts = (other: BackendConfig) => JSON.stringify(other) === JSON.stringify(config);
  switch (config.kind) {
    case 'local':
      return localBackend(config, accepts);
    case 'redis':
      return redisBackend(config, options, accepts);
    case 'global':
      return globalBackend(config, options, accepts);
  }
}

type BackendOf<Kind extends BackendConfig['kind']> = Extract<BackendConfig, { kind: Kind }>;

/** Each bucket name's limiter, kept while the bucket's limit and window stay the same. */
class BucketLimiters {
  readonly #entries = new Map<string, { signature: string; limiter: EdgeLimiter }>();

  get(bucket: ProxyBucket, build: () => EdgeLimiter): EdgeLimiter {
    const { name, limit, windowSec } = bucket.config;
    const signature = `${limit}/${windowSec}`;
    const entry = this.#entries.get(name);
    if (entry?.signature === signature) return entry.limiter;
    const limiter = build();
    this.#entries.set(name, { signature, limiter });
    return limiter;
  }

  /** Drops the limiters of other buckets, and their entries in `tables`. */
  keepOnly(bucketNames: ReadonlySet<string>, tables?: Map<string, unknown>): void {
    for (const name of this.#entries.keys()) {
      if (bucketNames.has(name)) continue;
      this.#entries.delete(name);
      tables?.delete(name);
    }
  }
}

function localBackend(config: BackendOf<'local'>, accepts: ProxyBackend['accepts']): ProxyBackend {
  const limiters = new BucketLimiters();
  /** The table behind each bucket name's current limiter (replaced with it when the bucket changes). */
  const tables = new Map<string, KeyedTokenBucket>();
  return {
    kind: 'local',
    globalLimiter: undefined,
    limiterFor: (bucket) =>
      limiters.get(bucket, () => {
        const table = createKeyedTokenBucket({
          capacity: bucket.config.limit,
          refillPerSec: bucket.config.limit / bucket.config.windowSec,
          maxKeys: config.maxKeys,
          // Not the local limiters' default coarse clock: at request rates reading the real clock
          // per request costs less than its 1 ms ticker (docs/local-limiters.md, "The coarse clock").
          clock: systemClock,
        });
        tables.set(bucket.config.name, table);
        return toEdgeLimiter(table);
      }),
    start: () => {},
    close: async () => {},
    accepts,
    keyTables: () =>
      [...tables].map(([bucket, table]) => ({
        bucket,
        keys: table.size,
        maxKeys: table.maxKeys,
        evictions: table.evictions,
      })),
    keepOnly: (bucketNames) => limiters.keepOnly(bucketNames, tables),
  };
}

function redisBackend(
  config: BackendOf<'redis'>,
  options: ProxyBackendOptions,
  accepts: ProxyBackend['accepts'],
): ProxyBackend {
  const limiters = new BucketLimiters();
  // Fail fast while disconnected (no offline queue, no retries per command): the limiter's
  // own timeout and fail policy decide, rather than requests piling up behind a dead Redis.
  const redis = new Redis(config.url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
  });
  let lastErrorLogMs = 0;
  redis.on('error', (error: Error) => {
    const nowMs = Date.now();
    if (nowMs - lastErrorLogMs < 10_000) return;
    lastErrorLogMs = nowMs;
    options.logger?.warn({ err: error.message }, 'proxy: Redis connection error');
  });
  const client = ioredisAdapter(redis);
  const build = (bucket: ProxyBucket): RedisLimiter => {
    const common = {
      redis: client,
      prefix: `${config.prefix}:${bucket.config.name}`,
      timeoutMs: config.timeoutMs,
      failPolicy: config.failPolicy,
      logger: options.logger,
    };
    const { limit, windowSec } = bucket.config;
    const windowMs = windowSec * 1000;
    switch (config.algorithm) {
      case 'fixed-window':
        return createRedisFixedWindow({ ...common, limit, windowMs });
      case 'sliding-log':
        return createRedisSlidingLog({ ...common, limit, windowMs });
      case 'sliding-counter':
        return createRedisSlidingCounter({ ...common, limit, windowMs });
      case 'token-bucket':
        return createRedisTokenBucket({ ...common, capacity: limit, refillPerSec: limit / windowSec });
    }
  };
  return {
    kind: 'redis',
    globalLimiter: undefined,
    limiterFor: (bucket) => limiters.get(bucket, () => toEdgeLimiter(build(bucket))),
    start: () => {},
    close: async () => {
      redis.disconnect();
    },
    accepts,
    keyTables: () => [],
    keepOnly: (bucketNames) => limiters.keepOnly(bucketNames),
  };
}

function globalBackend(
  config: BackendOf<'global'>,
  options: ProxyBackendOptions,
  accepts: ProxyBackend['accepts'],
): ProxyBackend {
  const limiter = createGlobalLimiter({
    reporterId: options.id,
    zone: config.zone,
    region: config.region,
    clients: options.controlClients ?? [],
    intervalMs: config.intervalMs,
    ...(config.stalePolicy === undefined ? {} : { stalePolicy: stalePolicyOf(config) }),
    ...(config.burstGuard === undefined ? {} : { burstGuard: config.burstGuard }),
    logger: options.logger,
    ...options.global,
  });
  const edge = toEdgeLimiter(limiter);
  const pinned = new Set<string>();
  return {
    kind: 'global',
    globalLimiter: limiter,
    limiterFor: (bucket) => {
      // A bucket with a fixed key holds its table entry for good: otherwise a flood of distinct
      // keys in another bucket fills the table, and a fixed-key bucket first used (or idle for
      // idleExpiryMs) meanwhile is decided by the never-dropping overflow handle, i.e. unlimited.
      const key = bucket.key.constant;
      if (key !== undefined && !pinned.has(key)) {
        try {
          limiter.bucket(key);
          pinned.add(key);
        } catch (error) {
          if (!(error instanceof SpillwayError && error.code === ErrorCode.CapacityExceeded)) throw error;
          // Added by a reload while the table is full: decided by key like any other, until there is room.
          options.logger?.warn(
            { bucket: bucket.config.name, key, maxBuckets: limiter.snapshot().maxBuckets },
            'proxy: the global limiter table is full; this fixed-key bucket is not reserved and may be decided by the overflow handle',
          );
        }
      }
      return edge;
    },
    start: () => limiter.start(),
    close: () => limiter.stop({ finalReport: true }),
    accepts,
    keyTables: () => [],
    // One limiter for every bucket; pinned fixed keys stay pinned (see above).
    keepOnly: () => {},
  };
}

/** The rules file's stale policy as the global limiter takes it; an absent hold is 3 intervals. */
function stalePolicyOf(config: BackendOf<'global'>): StalePolicy | undefined {
  const policy = config.stalePolicy;
  if (policy === undefined || policy.kind !== 'hold-then-decay') return policy;
  return {
    kind: 'hold-then-decay',
    holdMs: policy.holdMs ?? DEFAULT_STALE_HOLD_INTERVALS * config.intervalMs,
    decayMs: policy.decayMs,
  };
}
