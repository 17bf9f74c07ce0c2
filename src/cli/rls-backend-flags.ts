import { Redis } from 'ioredis';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { createGlobalBackend } from '../envoy/global-backend.js';
import { createLocalBackend } from '../envoy/local-backend.js';
import { createRedisBackend } from '../envoy/redis-backend.js';
import type { RlsBackend } from '../envoy/rls-backend.js';
import { createGlobalLimiter, DEFAULT_MAX_BUCKETS, type GlobalLimiter } from '../global/global-limiter.js';
import { addLimiterMetrics } from '../ops/limiter-metrics.js';
import type { Logger } from '../ops/logger.js';
import type { SpillwayMetrics } from '../ops/metrics.js';
import { ioredisAdapter } from '../redis/redis-script-client.js';
import type { ControlClient } from '../transport/control-transport.js';
import {
  type FlagSpec,
  type FlagValues,
  listFlag,
  numberFlag,
  parseTargets,
  stringFlag,
  usageError,
} from './command-line.js';
import { createParentClients } from './parent-clients.js';
import { readAuthToken, readClientTls } from './transport-security.js';

/** The flags of `spillway rls` that choose and configure where it counts. */
export const BACKEND_FLAGS: Record<string, FlagSpec> = {
  backend: {
    type: 'string',
    valueName: 'global|redis|local',
    description:
      "global: decide in process from the controller's drop ratios; redis: a Redis round trip per descriptor " +
      '(exact counts across instances); local: exact counts in this process alone',
    defaultText: 'global',
  },
  aggregator: {
    type: 'string',
    multiple: true,
    valueName: 'host:port[,host:port...]',
    description: 'zone aggregators, in failover order (backend global)',
  },
  zone: {
    type: 'string',
    valueName: 'zone',
    description: 'zone this instance reports as (backend global)',
  },
  region: { type: 'string', valueName: 'region', description: 'region this instance reports as' },
  'interval-ms': {
    type: 'string',
    valueName: 'ms',
    description: 'report interval until a reply sets one (backend global)',
    defaultText: '1000',
  },
  'report-timeout-ms': {
    type: 'string',
    valueName: 'ms',
    description: 'per-report deadline (backend global)',
    defaultText: 'half the interval',
  },
  'max-buckets': {
    type: 'string',
    valueName: 'n',
    description: 'buckets held at once (backend global); calls for new keys past it are admitted uncounted',
    defaultText: String(DEFAULT_MAX_BUCKETS),
  },
  'redis-url': { type: 'string', valueName: 'redis://host:port', description: 'Redis (backend redis)' },
  'redis-prefix': {
    type: 'string',
    valueName: 'prefix',
    description: 'Redis key prefix',
    defaultText: 'spillway:rls',
  },
  'redis-timeout-ms': {
    type: 'string',
    valueName: 'ms',
    description: 'longest wait for Redis per descriptor; past it the fail policy answers',
    defaultText: '100',
  },
  'redis-fail': {
    type: 'string',
    valueName: 'open|closed',
    description: 'what a descriptor gets when Redis fails or is late: OK (open) or OVER_LIMIT (closed)',
    defaultText: 'open',
  },
};

export type BackendName = 'global' | 'redis' | 'local';
/** How long startup waits for Redis before serving anyway (on the fail policy). */
const REDIS_READY_TIMEOUT_MS = 5_000;

/** What the global limiter calls back into (RLQS records its streams' usage through them). */
export interface LimiterHooks {
  onWindowClose?: (nowMs: number) => void;
  hostCount?: () => number;
}

export function oneOf<T extends string>(
  values: FlagValues,
  flag: string,
  allowed: readonly T[],
  fallback: T,
): T {
  const value = stringFlag(values, flag) ?? fallback;
  if (!(allowed as readonly string[]).includes(value)) {
    throw usageError(`--${flag} must be one of ${allowed.join(', ')}, got '${value}'`, { flag });
  }
  return value as T;
}

const GLOBAL_ONLY = ['aggregator', 'zone', 'region', 'interval-ms', 'report-timeout-ms', 'max-buckets'];
const REDIS_ONLY = ['redis-url', 'redis-prefix', 'redis-timeout-ms', 'redis-fail'];

export function checkBackendFlags(values: FlagValues, backend: BackendName): void {
  const given = (flag: string) => values[flag] !== undefined;
  if (backend === 'global') {
    if (listFlag(values, 'aggregator').length === 0)
      throw usageError('--backend global needs --aggregator', { flag: 'aggregator' });
    if (!given('zone')) throw usageError('--backend global needs --zone', { flag: 'zone' });
  } else {
    const stray = GLOBAL_ONLY.find(given);
    if (stray) throw usageError(`--${stray} is for --backend global`, { flag: stray });
  }
  if (backend === 'redis') {
    if (!given('redis-url')) throw usageError('--backend redis needs --redis-url', { flag: 'redis-url' });
  } else {
    const stray = REDIS_ONLY.find(given);
    if (stray) throw usageError(`--${stray} is for --backend redis`, { flag: stray });
  }
}

export interface BuiltBackend {
  backend: RlsBackend;
  limiter: GlobalLimiter | undefined;
  clients: ControlClient[];
  /** The global backend's report interval. */
  intervalMs?: number;
}

export async function buildBackend(
  values: FlagValues,
  backend: BackendName,
  context: {
    id: string;
    logger: Logger;
    metrics: SpillwayMetrics;
    maxBucketSeries: number;
    hooks: LimiterHooks;
  },
): Promise<BuiltBackend> {
  const { id, logger, metrics } = context;
  if (backend === 'local') return { backend: createLocalBackend(), limiter: undefined, clients: [] };
  if (backend === 'redis') {
    const redis = new Redis(stringFlag(values, 'redis-url')!, {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
    });
    let lastErrorLogMs = 0;
    redis.on('error', (error: Error) => {
      if (Date.now() - lastErrorLogMs < 10_000) return;
      lastErrorLogMs = Date.now();
      logger.warn({ err: error.message }, 'rls: Redis connection error');
    });
    // Serve once connected when Redis is there: calls before that would all go to the fail policy.
    const ready = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), REDIS_READY_TIMEOUT_MS);
      redis.once('ready', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    if (!ready) {
      logger.warn(
        { timeoutMs: REDIS_READY_TIMEOUT_MS },
        'rls: Redis not connected yet; serving, calls go to the fail policy until it is',
      );
    }
    const built = createRedisBackend({
      redis: ioredisAdapter(redis),
      prefix: stringFlag(values, 'redis-prefix') ?? 'spillway:rls',
      timeoutMs: numberFlag(values, 'redis-timeout-ms', 100, { min: 1, max: 60_000 }),
      failPolicy: oneOf(values, 'redis-fail', ['open', 'closed'] as const, 'open'),
      logger,
      onClose: async () => {
        redis.disconnect();
      },
    });
    return { backend: built, limiter: undefined, clients: [] };
  }
  const targets = parseTargets('aggregator', listFlag(values, 'aggregator'));
  const intervalMs = numberFlag(values, 'interval-ms', 1000, { min: 50 });
  const reportTimeoutMs = stringFlag(values, 'report-timeout-ms')
    ? numberFlag(values, 'report-timeout-ms', 0, { min: 1 })
    : undefined;
  const maxBuckets = numberFlag(values, 'max-buckets', DEFAULT_MAX_BUCKETS, {
    min: 1,
    max: 10_000_000,
    integer: true,
  });
  const clients = await createParentClients(targets, {
    authToken: await readAuthToken(values),
    tls: await readClientTls(values),
    intervalMs,
    metrics,
    logger,
    thread: 'worker',
  });
  let limiter: GlobalLimiter;
  try {
    limiter = createGlobalLimiter({
      reporterId: id,
      zone: stringFlag(values, 'zone')!,
      region: stringFlag(values, 'region'),
      clients,
      intervalMs,
      reportTimeoutMs,
      maxBuckets,
      logger,
      onWindowClose: (nowMs) => context.hooks.onWindowClose?.(nowMs),
      hostCount: () => context.hooks.hostCount?.() ?? 1,
    });
  } catch (error) {
    for (const client of clients) client.close();
    if (error instanceof SpillwayError && error.code === ErrorCode.InvalidOption)
      throw usageError(error.message);
    throw error;
  }
  addLimiterMetrics(metrics, limiter, { maxBucketSeries: context.maxBucketSeries });
  return { backend: createGlobalBackend(limiter), limiter, clients, intervalMs };
}
