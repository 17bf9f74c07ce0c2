import { stat } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type { SpillwayError } from '../core/errors.js';
import { compileRateLimits } from '../envoy/descriptor-rules.js';
import { startEnvoyGrpcServer } from '../envoy/envoy-grpc-server.js';
import { quotaStreamHandler } from '../envoy/quota-grpc.js';
import { createQuotaService, type QuotaService } from '../envoy/quota-service.js';
import { createRateLimitService } from '../envoy/rate-limit-service.js';
import { loadRateLimitConfig } from '../envoy/ratelimit-config.js';
import { DEFAULT_REQUEST_BOUNDS } from '../envoy/request-bounds.js';
import { RlsStats } from '../envoy/rls-stats.js';
import { createLogger, logListening, parseLogLevel } from '../ops/logger.js';
import { createMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { createReloadMetrics } from '../ops/reload-metrics.js';
import { addQuotaMetrics, addRlsMetrics } from '../ops/rls-metrics.js';
import { allowedHostsFromFlag, OPS_ALLOWED_HOST_FLAGS } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import { type CommandSpec, numberFlag, parseHostPort, runCommand, stringFlag } from './command-line.js';
import { watchFile } from './file-watcher.js';
import { shutdownWithin, waitForShutdown } from './process-lifecycle.js';
import { RLQS_FLAGS, rlqsOptionsFromFlags } from './rlqs-flags.js';
import {
  BACKEND_FLAGS,
  buildBackend,
  checkBackendFlags,
  type LimiterHooks,
  oneOf,
} from './rls-backend-flags.js';
import { AUTH_TOKEN_FLAGS, TLS_CLIENT_FLAGS } from './transport-security.js';

export const spec: CommandSpec = {
  name: 'rls',
  summary:
    "Serve Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, and with " +
    'the global backend its quota service, RLQS) from an ' +
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
    ...BACKEND_FLAGS,
    ...RLQS_FLAGS,
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
    const rlqsOptions = rlqsOptionsFromFlags(values, backendName);
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
    // RLQS records its streams' usage into the limiter's report windows, through these.
    let quota: QuotaService | undefined;
    const hooks: LimiterHooks = {
      onWindowClose: (nowMs) => quota?.onWindowClose(nowMs),
      hostCount: () => 1 + (quota?.streamCount ?? 0),
    };
    const built = await buildBackend(values, backendName, { id, logger, metrics, maxBucketSeries, hooks });
    const service = createRateLimitService({
      limits,
      backend: built.backend,
      responseHeaders: values['response-headers'] === true,
      shadowMode: values['shadow-mode'] === true,
      unknownDomain,
      bounds: { maxDescriptors },
      stats,
    });
    if (built.limiter) {
      quota = createQuotaService({
        limiter: built.limiter,
        limits: () => service.limits,
        intervalMs: built.intervalMs,
        unknownDomain,
        ...rlqsOptions,
      });
      addQuotaMetrics(metrics, quota.stats);
    }
    const server = await startEnvoyGrpcServer({
      host: listen.host,
      port: listen.port,
      rls: service,
      ...(quota ? { rlqs: quotaStreamHandler(quota, { onMalformed: () => stats.refuse('malformed') }) } : {}),
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
    quota?.start();
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
      rlqs: quota !== undefined,
      config: configPath,
      domains: [...limits.domains.keys()],
      rules: limits.rules.length,
    });

    reloadOnSignal = () => reload('SIGHUP');
    await stopRequested;
    await shutdownWithin(logger, 10_000, async () => {
      watcher.close();
      quota?.stop();
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
