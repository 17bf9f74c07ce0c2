import { hostname } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { readConfigFile } from '../config/read-config-file.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { watchPolicyAgreement } from '../http/proxy/policy-agreement.js';
import { createProxyBackend } from '../http/proxy/proxy-backend.js';
import { startProxyServer } from '../http/proxy/proxy-server.js';
import { type ProxyRules, parseProxyRules } from '../http/rules/proxy-rules.js';
import { addLimiterMetrics } from '../ops/limiter-metrics.js';
import { logListening } from '../ops/logger.js';
import { createMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { addProxyKeyMetrics, createProxyMetrics } from '../ops/proxy-metrics.js';
import { OPS_ALLOWED_HOST_FLAGS, opsEndpointFromFlags } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import { type CommandSpec, numberFlag, parseHostPort, runCommand, stringFlag } from './command-line.js';
import { ConfigReloader } from './config-reloader.js';
import { LOG_LEVEL_FLAG, loggerFromFlags } from './log-level-flag.js';
import { createParentClients } from './parent-clients.js';
import { shutdownWithin, waitForShutdownOrReload } from './process-lifecycle.js';

export const spec: CommandSpec = {
  name: 'proxy',
  summary:
    'Run a sidecar reverse proxy that decides every request against the buckets of a rules file ' +
    '(local, Redis or global limiter) before forwarding it to the upstream, and answers 429 with ' +
    'RateLimit headers when a bucket rejects.',
  flags: {
    config: {
      type: 'string',
      valueName: 'rules.yaml',
      description: 'the rules file (upstream, backend, buckets; see docs/proxy.md)',
      required: true,
    },
    listen: {
      type: 'string',
      valueName: 'host:port',
      description: 'address clients connect to',
      defaultText: '127.0.0.1:8080',
    },
    ops: {
      type: 'string',
      valueName: 'host:port',
      description: 'address of /healthz and /metrics',
      defaultText: '127.0.0.1:9095',
    },
    ...OPS_ALLOWED_HOST_FLAGS,
    ...BUCKET_SERIES_FLAGS,
    id: {
      type: 'string',
      valueName: 'id',
      description: 'identity in logs, metrics and global-limiter reports',
      defaultText: 'proxy-<hostname>-<pid>',
    },
    'drain-timeout-ms': {
      type: 'string',
      valueName: 'ms',
      description:
        'on SIGTERM, how long in-flight requests may take before their connections are cut (at most 86400000)',
      defaultText: '10000',
    },
    'shutdown-delay-ms': {
      type: 'string',
      valueName: 'ms',
      description:
        'on SIGTERM, keep accepting and serving for this long, with /healthz answering 503, before the drain ' +
        'starts: Kubernetes removes a stopping pod from its endpoints asynchronously (at most 86400000)',
      defaultText: '0',
    },
    ...LOG_LEVEL_FLAG,
  },
  notes: [
    'The rules file is reloaded on SIGHUP and when it changes on disk; a file that fails to load keeps',
    'the previous rules (logged, spillway_proxy_rules_reloads_total{result="error"}). Changes to',
    'upstream.url, upstream.connections, upstream.connectTimeoutMs and backend need a restart.',
    'Set SPILLWAY_AUTH_TOKEN to send a shared token with global-limiter reports.',
    'Example: spillway proxy --config examples/proxy-rules.yaml --listen 0.0.0.0:8080',
  ],
};

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    const maxBucketSeries = maxBucketSeriesFromFlags(values);
    const configPath = stringFlag(values, 'config')!;
    const listen = parseHostPort('listen', stringFlag(values, 'listen') ?? '127.0.0.1:8080');
    const ops = opsEndpointFromFlags(values, '127.0.0.1:9095');
    const id = stringFlag(values, 'id') ?? `proxy-${hostname()}-${process.pid}`;
    // At most a day: the shutdown guard (this + 10 s) must fit Node's 32-bit timers, or it fires at once.
    const drainTimeoutMs = numberFlag(values, 'drain-timeout-ms', 10_000, { min: 0, max: 86_400_000 });
    const shutdownDelayMs = numberFlag(values, 'shutdown-delay-ms', 0, { min: 0, max: 86_400_000 });
    const logger = loggerFromFlags(values, 'proxy', id);
    const shutdown = waitForShutdownOrReload(logger);
    const configText = await readConfigFile(configPath, { kind: 'rules file' });
    let rules = parseProxyRules(configText, configPath);

    const metrics = createMetrics({ component: 'proxy', id });
    const proxyMetrics = createProxyMetrics(metrics.registry);
    const authToken = process.env.SPILLWAY_AUTH_TOKEN || undefined;
    const controlClients =
      rules.backend.kind === 'global'
        ? await createParentClients(rules.backend.aggregators, {
            authToken,
            intervalMs: rules.backend.intervalMs,
            metrics,
            logger,
            thread: 'worker',
          })
        : [];
    const backend = createProxyBackend(rules.backend, { id, logger, controlClients });
    if (backend.globalLimiter)
      addLimiterMetrics(metrics, backend.globalLimiter, {
        maxBucketSeries,
      });
    addProxyKeyMetrics(metrics.registry, () => backend.keyTables());
    let proxy: Awaited<ReturnType<typeof startProxyServer>>;
    try {
      proxy = await startProxyServer({
        rules,
        backend,
        host: listen.host,
        port: listen.port,
        metrics: proxyMetrics,
        logger,
      });
    } catch (error) {
      await backend.close();
      for (const client of controlClients) client.close();
      // A bucket the backend cannot build (e.g. a fractional limit for a window algorithm).
      if (error instanceof SpillwayError && error.code !== ErrorCode.InvalidConfig) {
        throw new SpillwayError(ErrorCode.InvalidConfig, `${configPath}: ${error.message}`, {
          file: configPath,
        });
      }
      throw error;
    }
    backend.start();
    const stopPolicyCheck = backend.globalLimiter
      ? watchPolicyAgreement({ limiter: backend.globalLimiter, buckets: () => rules.buckets, logger })
      : () => {};
    /** SIGTERM (or SIGINT) came: /healthz answers 503 through the shutdown delay and the drain. */
    let stopping = false;
    const reloader = new ConfigReloader({
      path: configPath,
      holds: 'rules',
      text: configText,
      logger,
      apply: (text) => {
        const next: ProxyRules = parseProxyRules(text, configPath);
        if (!backend.accepts(next.backend)) {
          logger.warn(
            { file: configPath },
            'proxy: backend changes apply after a restart; keeping the current backend',
          );
        }
        proxy.setRules(next);
        rules = next;
        return { buckets: rules.buckets.length };
      },
      count: (result) => proxyMetrics.reload(result),
    });
    const watcher = reloader.watch();

    let opsServer: Awaited<ReturnType<typeof startOpsServer>>;
    try {
      opsServer = await startOpsServer({
        ...ops,
        registry: metrics.registry,
        // Unhealthy from SIGTERM on (the shutdown delay, then the drain), so a load balancer stops
        // sending before connections close.
        health: () => {
          const snapshot = backend.globalLimiter?.snapshot();
          const upstream = proxy.upstreamHealth;
          return {
            ok: !stopping,
            // Degraded, not unhealthy (still 200): the proxy serves, decides and answers; restarting
            // or unrouting it would not bring the upstream back.
            status: upstream.state === 'failing' ? 'degraded' : 'ok',
            upstream,
            stopping,
            draining: proxy.draining,
            backend: backend.kind,
            buckets: rules.buckets.length,
            inFlight: proxy.inFlight,
            lastReloadError: reloader.lastError ?? null,
            ...(snapshot
              ? {
                  staleDirectives: snapshot.buckets.filter((b) => b.stale).length,
                  consecutiveReportFailures: snapshot.reporter.consecutiveFailures,
                  // Buckets the controller has no rule for (never a directive): not limited.
                  bucketsWithoutRule: snapshot.reporter.bucketsWithoutRule,
                }
              : {}),
          };
        },
      });
    } catch (error) {
      // A busy ops port: close what startup opened, so the process exits with the error.
      watcher.close();
      await proxy.close({ drainTimeoutMs: 0 });
      await backend.close();
      for (const client of controlClients) client.close();
      throw error;
    }
    logListening(logger, {
      proxy: proxy.address,
      ops: opsServer.address,
      upstream: rules.upstream.url,
      backend: backend.kind,
      buckets: rules.buckets.map((b) => b.config.name),
    });

    shutdown.reloadWith(() => reloader.reload('SIGHUP'));
    await shutdown.stopRequested;
    stopping = true;
    if (shutdownDelayMs > 0) {
      // Kubernetes sends SIGTERM as it starts removing the pod from its Services' endpoints, and
      // kube-proxies, ingresses and meshes apply that a few seconds later: until then they still
      // route new connections here, which a proxy that stopped accepting would refuse. It keeps
      // serving meanwhile (kube-apiserver's --shutdown-delay-duration, Traefik's
      // requestAcceptGraceTimeout). A second signal still ends the process at once.
      logger.info({ shutdownDelayMs }, 'shutdown delay: still serving while endpoints drop this pod');
      await delay(shutdownDelayMs);
    }
    await shutdownWithin(logger, drainTimeoutMs + 10_000, async () => {
      watcher.close();
      stopPolicyCheck();
      const { forcedConnections } = await proxy.close({ drainTimeoutMs });
      if (forcedConnections > 0) {
        logger.warn({ forcedConnections, drainTimeoutMs }, 'drain timeout: connections cut');
      }
      await backend.close();
      for (const client of controlClients) client.close();
      await opsServer.close();
      logger.info({}, 'stopped');
    });
    return 0;
  });
}
