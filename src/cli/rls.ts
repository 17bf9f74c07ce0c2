import { stat } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { compileRateLimits } from '../envoy/descriptor-rules.js';
import { startEnvoyGrpcServer } from '../envoy/envoy-grpc-server.js';
import { createGlobalBackend } from '../envoy/global-backend.js';
import { createLocalBackend } from '../envoy/local-backend.js';
import { createRateLimitService } from '../envoy/rate-limit-service.js';
import { loadRateLimitConfig } from '../envoy/ratelimit-config.js';
import { createRedisBackend } from '../envoy/redis-backend.js';
import { DEFAULT_REQUEST_BOUNDS } from '../envoy/request-bounds.js';
import type { RlsBackend } from '../envoy/rls-backend.js';
import { RlsStats } from '../envoy/rls-stats.js';
import { createGlobalLimiter, DEFAULT_MAX_BUCKETS, type GlobalLimiter } from '../global/global-limiter.js';
import { addLimiterMetrics } from '../ops/limiter-metrics.js';
import { createLogger, type Logger, logListening, parseLogLevel } from '../ops/logger.js';
import { createMetrics, type SpillwayMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { createReloadMetrics } from '../ops/reload-metrics.js';
import { addRlsMetrics } from '../ops/rls-metrics.js';
import { ioredisAdapter } from '../redis/redis-script-client.js';
import type { ControlClient } from '../transport/control-transport.js';
import { allowedHostsFromFlag, OPS_ALLOWED_HOST_FLAGS } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import {
  type CommandSpec,
  type FlagValues,
  listFlag,
  numberFlag,
  parseHostPort,
  parseTargets,
  runCommand,
  stringFlag,
  usageError,
} from './command-line.js';
import { watchFile } from './file-watcher.js';
import { createParentClients } from './parent-clients.js';
import { shutdownWithin, waitForShutdown } from './process-lifecycle.js';
import { AUTH_TOKEN_FLAGS, readAuthToken, readClientTls, TLS_CLIENT_FLAGS } from './transport-security.js';

export const spec: CommandSpec = {
  name: 'rls',
  summary:
    "Serve Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from an " +
    'envoyproxy/ratelimit configuration file, read unchanged, deciding in process as a data-plane host of the ' +
    'global rate limiter (or on Redis, or locally). docs/envoy.md.',
  flags: {
    config: {
      type: 'string',
      valueName: 'ratelimit.yaml|dir',
      description: "envoyproxy/ratelimit's YAML: one file, or a directory of *.yaml files (one domain each)",
      required: true,
    },
    listen: {
      type: 'string',
      valueName: 'host:port',
      description: 'gRPC address Envoy calls',
      defaultText: '127.0.0.1:8081',
    },
    ops: {
      type: 'string',
      valueName: 'host:port',
      description: 'address of /healthz and /metrics',
      defaultText: '127.0.0.1:8080',
    },
    ...OPS_ALLOWED_HOST_FLAGS,
    ...BUCKET_SERIES_FLAGS,
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
    'response-headers': {
      type: 'boolean',
      description:
        'add the IETF RateLimit and RateLimit-Policy fields (and Retry-After when over) to responses ' +
        "(envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)",
    },
    'shadow-mode': {
      type: 'boolean',
      description: "answer every call OK, counting as usual (envoyproxy/ratelimit's SHADOW_MODE)",
    },
    'unknown-domain': {
      type: 'string',
      valueName: 'ok|error',
      description:
        'a domain the file does not have: every descriptor OK (as envoyproxy/ratelimit), or NOT_FOUND',
      defaultText: 'ok',
    },
    'max-descriptors': {
      type: 'string',
      valueName: 'n',
      description: 'descriptors per call; more are refused with INVALID_ARGUMENT',
      defaultText: String(DEFAULT_REQUEST_BOUNDS.maxDescriptors),
    },
    id: {
      type: 'string',
      valueName: 'id',
      description: 'reporter identity',
      defaultText: 'rls-<hostname>-<pid>',
    },
    'log-level': {
      type: 'string',
      valueName: 'level',
      description: 'fatal|error|warn|info|debug|trace|silent',
      defaultText: 'info',
    },
    ...AUTH_TOKEN_FLAGS,
    ...TLS_CLIENT_FLAGS,
  },
  notes: [
    'The configuration is reloaded on SIGHUP and when it changes on disk; a configuration that fails to',
    'load keeps the previous one in force (spillway_config_reloads_total{result="error"}).',
    'Give `spillway controller` the same file with --config-format envoy-ratelimit: it enforces the limits',
    'every instance reports against, under the same bucket keys.',
    'Example: spillway rls --config ratelimit.yaml --aggregator 127.0.0.1:7071 --zone z1',
  ],
};

type BackendName = 'global' | 'redis' | 'local';
/** How long startup waits for Redis before serving anyway (on the fail policy). */
const REDIS_READY_TIMEOUT_MS = 5_000;
type ReloadTrigger = 'SIGHUP' | 'file';

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    const configPath = stringFlag(values, 'config')!;
    const listen = parseHostPort('listen', stringFlag(values, 'listen') ?? '127.0.0.1:8081');
    const ops = parseHostPort('ops', stringFlag(values, 'ops') ?? '127.0.0.1:8080');
    const opsAllowedHosts = allowedHostsFromFlag(values, 'ops-allowed-host');
    const maxBucketSeries = maxBucketSeriesFromFlags(values);
    const backendName = oneOf(values, 'backend', ['global', 'redis', 'local'] as const, 'global');
    const unknownDomain = oneOf(values, 'unknown-domain', ['ok', 'error'] as const, 'ok');
    const maxDescriptors = numberFlag(values, 'max-descriptors', DEFAULT_REQUEST_BOUNDS.maxDescriptors, {
      min: 1,
      max: 100_000,
      integer: true,
    });
    checkBackendFlags(values, backendName);
    const id = stringFlag(values, 'id') ?? `rls-${hostname()}-${process.pid}`;
    const logger = createLogger({
      component: 'rls',
      id,
      level: parseLogLevel(stringFlag(values, 'log-level') ?? 'info'),
    });
    // Signals first: a SIGHUP while starting must not end the process.
    let reloadOnSignal: (() => void) | undefined;
    const stopRequested = waitForShutdown(logger, () => {
      if (reloadOnSignal === undefined) return false;
      reloadOnSignal();
      return true;
    });

    const loaded = await loadRateLimitConfig(configPath);
    const limits = compileRateLimits(loaded.domains);
    const metrics = createMetrics({ component: 'rls', id });
    const stats = new RlsStats(maxBucketSeries);
    addRlsMetrics(metrics, stats);
    const reloads = createReloadMetrics(metrics.registry, 'spillway_config');
    const built = await buildBackend(values, backendName, { id, logger, metrics, maxBucketSeries });
    const service = createRateLimitService({
      limits,
      backend: built.backend,
      responseHeaders: values['response-headers'] === true,
      shadowMode: values['shadow-mode'] === true,
      unknownDomain,
      bounds: { maxDescriptors },
      stats,
    });
    const server = await startEnvoyGrpcServer({
      host: listen.host,
      port: listen.port,
      rls: service,
      onMalformed: () => stats.refuse('malformed'),
      onError: (error, { peer }) => logger.error({ peer, err: String(error) }, 'ShouldRateLimit failed'),
    });

    let lastReloadError: string | undefined;
    let attempted = loaded.fingerprint;
    let reloading: Promise<void> | undefined;
    let queued: ReloadTrigger | undefined;
    const reload = (trigger: ReloadTrigger): void => {
      if (reloading) {
        queued = queued === 'SIGHUP' ? 'SIGHUP' : trigger;
        return;
      }
      reloading = (async () => {
        try {
          const next = await loadRateLimitConfig(configPath);
          // Events name anything in the directory: content already tried is not a reload.
          if (trigger !== 'SIGHUP' && next.fingerprint === attempted) return;
          attempted = next.fingerprint;
          const compiled = compileRateLimits(next.domains);
          service.updateLimits(compiled);
          lastReloadError = undefined;
          reloads.reloaded('ok');
          logger.info(
            { trigger, config: configPath, domains: next.domains.length, rules: compiled.rules.length },
            'rate limit config reloaded',
          );
        } catch (error) {
          const message = error instanceof Error ? error.message : String(error);
          if (trigger !== 'SIGHUP' && message === lastReloadError) return;
          lastReloadError = message;
          reloads.reloaded('error');
          logger.error(
            { trigger, config: configPath, code: (error as SpillwayError).code, err: message },
            'rate limit config reload failed; the previous config stays in force',
          );
        } finally {
          reloading = undefined;
          const next = queued;
          queued = undefined;
          if (next !== undefined) reload(next);
        }
      })();
    };

    const opsServer = await startOpsServer({
      host: ops.host,
      port: ops.port,
      allowedHosts: opsAllowedHosts,
      registry: metrics.registry,
      // Serving never needs the control plane (fail open): healthy while it answers calls.
      health: () => {
        const limiter = built.limiter?.snapshot();
        return {
          ok: true,
          backend: backendName,
          domains: [...service.limits.domains.keys()],
          rules: service.limits.rules.length,
          lastReloadError: lastReloadError ?? null,
          ...(limiter
            ? {
                staleDirectives: limiter.buckets.filter((b) => b.stale).length,
                consecutiveReportFailures: limiter.reporter.consecutiveFailures,
              }
            : {}),
        };
      },
    });
    built.limiter?.start();
    const watchPath = (await stat(configPath)).isDirectory()
      ? join(configPath, 'ratelimit.yaml')
      : configPath;
    const watcher = watchFile(watchPath, () => reload('file'), {
      onError: (error) =>
        logger.warn({ config: configPath, err: error.message }, 'config watch stopped; SIGHUP still reloads'),
    });
    logListening(logger, {
      grpc: server.address,
      ops: opsServer.address,
      backend: backendName,
      config: configPath,
      domains: [...limits.domains.keys()],
      rules: limits.rules.length,
    });

    reloadOnSignal = () => reload('SIGHUP');
    await stopRequested;
    await shutdownWithin(logger, 10_000, async () => {
      watcher.close();
      await server.close();
      await built.backend.close();
      for (const client of built.clients) client.close();
      await reloading;
      await opsServer.close();
      logger.info({}, 'stopped');
    });
    return 0;
  });
}

function oneOf<T extends string>(values: FlagValues, flag: string, allowed: readonly T[], fallback: T): T {
  const value = stringFlag(values, flag) ?? fallback;
  if (!(allowed as readonly string[]).includes(value)) {
    throw usageError(`--${flag} must be one of ${allowed.join(', ')}, got '${value}'`, { flag });
  }
  return value as T;
}

const GLOBAL_ONLY = ['aggregator', 'zone', 'region', 'interval-ms', 'report-timeout-ms', 'max-buckets'];
const REDIS_ONLY = ['redis-url', 'redis-prefix', 'redis-timeout-ms', 'redis-fail'];

function checkBackendFlags(values: FlagValues, backend: BackendName): void {
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

interface BuiltBackend {
  backend: RlsBackend;
  limiter: GlobalLimiter | undefined;
  clients: ControlClient[];
}

async function buildBackend(
  values: FlagValues,
  backend: BackendName,
  context: { id: string; logger: Logger; metrics: SpillwayMetrics; maxBucketSeries: number },
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
    });
  } catch (error) {
    for (const client of clients) client.close();
    if (error instanceof SpillwayError && error.code === ErrorCode.InvalidOption)
      throw usageError(error.message);
    throw error;
  }
  addLimiterMetrics(metrics, limiter, { maxBucketSeries: context.maxBucketSeries });
  return { backend: createGlobalBackend(limiter), limiter, clients };
}
