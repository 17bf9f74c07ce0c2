import { hostname } from 'node:os';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { createGlobalLimiter } from '../global/global-limiter.js';
import { addLimiterMetrics } from '../ops/limiter-metrics.js';
import { logListening } from '../ops/logger.js';
import { createMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { OPS_ALLOWED_HOST_FLAGS, opsEndpointFromFlags } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import {
  type CommandSpec,
  listFlag,
  MAX_TIMER_SECONDS,
  numberFlag,
  parseTargets,
  runCommand,
  stringFlag,
  usageError,
} from './command-line.js';
import { createLoadGenerator } from './load-generator.js';
import { LOG_LEVEL_FLAG, loggerFromFlags } from './log-level-flag.js';
import { createParentClients } from './parent-clients.js';
import { shutdownWithin, waitForShutdown } from './process-lifecycle.js';
import { AUTH_TOKEN_FLAGS, readAuthToken, readClientTls, TLS_CLIENT_FLAGS } from './transport-security.js';

export const spec: CommandSpec = {
  name: 'host',
  summary:
    'Run a data-plane host that offers synthetic load to a global limiter (for tests, demos and load trials): ' +
    'it calls allow() at the given rates, reports to its zone aggregators and exposes the outcome as metrics.',
  flags: {
    aggregator: {
      type: 'string',
      multiple: true,
      valueName: 'host:port[,host:port...]',
      description: 'zone aggregators, in failover order',
      required: true,
    },
    zone: { type: 'string', valueName: 'zone', description: 'zone this host reports as', required: true },
    region: { type: 'string', valueName: 'region', description: 'region this host reports as' },
    bucket: {
      type: 'string',
      multiple: true,
      valueName: 'key=rps[,key=rps...]',
      description: 'buckets to offer load to and the rate of allow() calls per second for each',
      required: true,
    },
    'duration-s': {
      type: 'string',
      valueName: 'seconds',
      description: 'stop after this long',
      defaultText: 'run until SIGTERM',
    },
    ops: {
      type: 'string',
      valueName: 'host:port',
      description: 'address of /healthz and /metrics',
      defaultText: '127.0.0.1:0',
    },
    ...OPS_ALLOWED_HOST_FLAGS,
    ...BUCKET_SERIES_FLAGS,
    id: {
      type: 'string',
      valueName: 'id',
      description: 'reporter identity',
      defaultText: '<hostname>-<pid>',
    },
    'interval-ms': {
      type: 'string',
      valueName: 'ms',
      description: 'report interval until a reply sets one',
      defaultText: '1000',
    },
    'report-timeout-ms': {
      type: 'string',
      valueName: 'ms',
      description: 'per-report deadline',
      defaultText: 'half the interval',
    },
    ...LOG_LEVEL_FLAG,
    ...AUTH_TOKEN_FLAGS,
    ...TLS_CLIENT_FLAGS,
  },
  notes: [
    'With --auth-token-file (or SPILLWAY_AUTH_TOKEN) every report carries the shared token.',
    'Example: spillway host --aggregator 127.0.0.1:7071 --zone z1 --bucket payments:charge=300,search=50',
  ],
};

/** Highest rate one host process offers: beyond it the generator itself would be the bottleneck. */
const MAX_OFFERED_RPS = 1_000_000;

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    const maxBucketSeries = maxBucketSeriesFromFlags(values);
    const targets = parseTargets('aggregator', listFlag(values, 'aggregator'));
    const zone = stringFlag(values, 'zone')!;
    const rates = parseBucketRates(listFlag(values, 'bucket'));
    const durationS = numberFlag(values, 'duration-s', 0, { min: 0, max: MAX_TIMER_SECONDS });
    const ops = opsEndpointFromFlags(values, '127.0.0.1:0');
    const id = stringFlag(values, 'id') ?? `${hostname()}-${process.pid}`;
    const intervalMs = numberFlag(values, 'interval-ms', 1000, { min: 50 });
    const reportTimeoutMs = stringFlag(values, 'report-timeout-ms')
      ? numberFlag(values, 'report-timeout-ms', 0, { min: 1 })
      : undefined;
    const logger = loggerFromFlags(values, 'host', id);

    const metrics = createMetrics({ component: 'host', id });
    const authToken = await readAuthToken(values);
    const tls = await readClientTls(values);
    const clients = await createParentClients(targets, {
      authToken,
      tls,
      intervalMs,
      metrics,
      logger,
      thread: 'worker',
    });
    let limiter: ReturnType<typeof createGlobalLimiter>;
    try {
      limiter = createGlobalLimiter({
        reporterId: id,
        zone,
        region: stringFlag(values, 'region'),
        clients,
        intervalMs,
        reportTimeoutMs,
        logger,
      });
    } catch (error) {
      if (error instanceof SpillwayError && error.code === ErrorCode.InvalidOption)
        throw usageError(error.message);
      throw error;
    }
    const handles = rates.map(({ key, rps }) => ({ handle: limiter.bucket(key), rps }));
    addLimiterMetrics(metrics, limiter, { maxBucketSeries });
    const opsServer = await startOpsServer({
      ...ops,
      registry: metrics.registry,
      // A host serves with or without its control plane (fail open), so it is always healthy;
      // the details say how fresh its directives are.
      health: () => {
        const snapshot = limiter.snapshot();
        return {
          ok: true,
          staleDirectives: snapshot.buckets.filter((b) => b.stale).length,
          consecutiveReportFailures: snapshot.reporter.consecutiveFailures,
          lastReportSuccessAtMs: snapshot.reporter.lastSuccessAtMs ?? null,
          // Buckets the controller has no rule for (never a directive): not limited.
          bucketsWithoutRule: snapshot.reporter.bucketsWithoutRule,
        };
      },
    });
    limiter.start();
    const load = createLoadGenerator(
      handles.map(({ handle, rps }) => ({ rps, offer: () => handle.allow() })),
    );
    load.start();
    logListening(logger, {
      ops: opsServer.address,
      parents: targets,
      zone,
      buckets: Object.fromEntries(rates.map((r) => [r.key, r.rps])),
    });

    const stopped = await Promise.race([
      waitForShutdown(logger),
      ...(durationS > 0
        ? [new Promise<'duration'>((resolve) => setTimeout(() => resolve('duration'), durationS * 1000))]
        : []),
    ]);
    if (stopped === 'duration') logger.info({ durationS }, 'duration reached: stopping');
    await shutdownWithin(logger, 10_000, async () => {
      load.stop();
      await limiter.stop({ finalReport: true });
      for (const client of clients) client.close();
      const totals = limiter.snapshot().buckets.map((b) => ({
        bucket: b.key,
        offered: b.offered,
        admitted: b.admitted,
        dropped: b.dropped + b.droppedByGuard,
        wouldDrop: b.wouldDrop,
      }));
      await opsServer.close();
      logger.info({ totals }, 'stopped');
    });
    return 0;
  });
}

export function parseBucketRates(items: string[]): { key: string; rps: number }[] {
  const seen = new Set<string>();
  return items.map((item) => {
    const at = item.lastIndexOf('=');
    const key = at > 0 ? item.slice(0, at).trim() : '';
    const rpsText = at > 0 ? item.slice(at + 1).trim() : '';
    const rps = Number(rpsText);
    if (key === '' || rpsText === '' || !Number.isFinite(rps) || rps < 0 || rps > MAX_OFFERED_RPS) {
      throw usageError(`--bucket wants key=rps with 0 <= rps <= ${MAX_OFFERED_RPS}, got '${item}'`, {
        flag: 'bucket',
      });
    }
    if (seen.has(key)) throw usageError(`--bucket '${key}' is given twice`, { flag: 'bucket' });
    seen.add(key);
    return { key, rps };
  });
}
