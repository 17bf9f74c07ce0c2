import { z } from 'zod';
import { createGlobalLimiter } from '../../global/global-limiter.js';
import { addLimiterMetrics } from '../../ops/limiter-metrics.js';
import { createLogger, logListening } from '../../ops/logger.js';
import { createMetrics } from '../../ops/metrics.js';
import { startOpsServer } from '../../ops/ops-server.js';
import { usageError } from '../command-line.js';
import { createParentClients } from '../parent-clients.js';
import { shutdownWithin, waitForShutdown } from '../process-lifecycle.js';
import { createHttpLoad } from './http-load.js';
import { createVaryingLoad } from './load.js';
import { DEMO_STREAMS } from './plan.js';
import { startDemoUpstream } from './upstream.js';

/**
 * The demo's own processes, started by `spillway demo` as `spillway demo --worker <role> --spec
 * <json>` (not meant to be run by hand, so not in `--help`). Each prints the usual `listening`
 * line and stops on SIGTERM/SIGINT (which demo-parent-watch.ts also sends when the demo dies).
 */
const hostSpec = z.strictObject({
  id: z.string().min(1),
  zone: z.string().min(1),
  aggregators: z.array(z.string().min(1)).min(1),
  /** The demo's start (epoch ms): every process follows the plan from the same instant. */
  startedAtMs: z.number(),
  /** This host's fraction of the fleet's load. */
  share: z.number().min(0).max(1),
  scale: z.number().positive(),
});

export type DemoHostSpec = z.infer<typeof hostSpec>;

const httpLoadSpec = z.strictObject({
  /** The sidecar proxies' addresses and the share of the requests each gets. */
  targets: z.array(z.strictObject({ address: z.string().min(1), weight: z.number().positive() })).min(1),
  startedAtMs: z.number(),
  scale: z.number().positive(),
});

export type DemoHttpLoadSpec = z.infer<typeof httpLoadSpec>;

export async function runDemoWorker(argv: string[]): Promise<number> {
  const [flag, role, specFlag, specText] = argv;
  if (flag !== '--worker' || specFlag !== '--spec' || specText === undefined || argv.length !== 4) {
    throw usageError('internal: spillway demo --worker <role> --spec <json>');
  }
  if (role === 'host') return runHost(parseSpec(hostSpec, specText));
  if (role === 'upstream') return runUpstream();
  if (role === 'http-load') return runHttpLoad(parseSpec(httpLoadSpec, specText));
  throw usageError(`internal: unknown demo worker role '${role}'`);
}

function parseSpec<T>(schema: z.ZodType<T>, text: string): T {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw usageError('internal: the worker spec is not JSON');
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw usageError(`internal: bad worker spec: ${parsed.error.issues[0]?.message}`);
  return parsed.data;
}

/** A data-plane host: a GlobalLimiter offered the plan's load (its share of it), like `spillway host`. */
async function runHost(spec: DemoHostSpec): Promise<number> {
  const logger = createLogger({ component: 'host', id: spec.id, level: 'warn' });
  const metrics = createMetrics({ component: 'host', id: spec.id });
  const clients = await createParentClients(spec.aggregators, {
    intervalMs: 1_000,
    metrics,
    logger,
    thread: 'worker',
  });
  const limiter = createGlobalLimiter({ reporterId: spec.id, zone: spec.zone, clients, logger });
  addLimiterMetrics(metrics, limiter);
  const load = createVaryingLoad(
    DEMO_STREAMS.map((stream) => {
      const handle = limiter.bucket(stream.bucket);
      return {
        rateAt: (tS: number) => stream.rateAt(tS) * spec.share * spec.scale,
        offer: () => handle.allow(),
      };
    }),
    { startedAtMs: spec.startedAtMs },
  );
  const ops = await startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }) });
  limiter.start();
  load.start();
  logListening(logger, { ops: ops.address, zone: spec.zone, parents: spec.aggregators });

  await waitForShutdown(logger);
  await shutdownWithin(logger, 10_000, async () => {
    load.stop();
    await limiter.stop({ finalReport: false });
    for (const client of clients) client.close();
    await ops.close();
  });
  return 0;
}

/** The small HTTP service behind the demo's proxies. */
async function runUpstream(): Promise<number> {
  const logger = createLogger({ component: 'host', id: 'demo-upstream', level: 'warn' });
  const upstream = await startDemoUpstream(logger);
  logListening(logger, { http: upstream.address, ops: upstream.address });
  await waitForShutdown(logger);
  await shutdownWithin(logger, 10_000, () => upstream.close());
  return 0;
}

/**
 * The demo's HTTP clients. `/healthz` on its ops address returns `counts`: responses so far
 * (`sent`, `ok`, `limited` (429), `failed`, `skipped`), which the demo's summary turns into rates.
 */
async function runHttpLoad(spec: DemoHttpLoadSpec): Promise<number> {
  const logger = createLogger({ component: 'host', id: 'demo-load', level: 'warn' });
  const metrics = createMetrics({ component: 'host', id: 'demo-load', processMetrics: false });
  const load = createHttpLoad({
    streams: DEMO_STREAMS,
    targets: spec.targets,
    startedAtMs: spec.startedAtMs,
    scale: spec.scale,
  });
  const ops = await startOpsServer({
    registry: metrics.registry,
    health: () => ({ ok: true, counts: { ...load.counts } }),
  });
  load.start();
  logListening(logger, { ops: ops.address, targets: spec.targets.map((t) => t.address) });
  await waitForShutdown(logger);
  await shutdownWithin(logger, 10_000, async () => {
    load.close();
    await ops.close();
  });
  return 0;
}
