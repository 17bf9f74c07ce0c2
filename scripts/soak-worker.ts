// The soak's own processes (scripts/soak.ts starts them; not meant to be run by hand):
//
//   node --import tsx scripts/soak-worker.ts upstream '{}'
//   node --import tsx scripts/soak-worker.ts load '{"targets":[{"name":"p1","address":"127.0.0.1:8080","rps":500}],"path":"/v1/items"}'
//
// `upstream` is the HTTP service behind the proxies: it answers every request at once with a small
// body. `load` offers HTTP requests to the proxies at fixed rates (open loop: a slow answer does not
// slow the offered rate; past `maxInFlight` per target a request is skipped and counted), over a
// fixed number of keep-alive undici connections per proxy. Each prints the usual `listening` JSON line and serves /metrics (Node
// process metrics plus its own counters, below) on an ops address, and stops on SIGTERM/SIGINT.

import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Histogram } from 'prom-client';
import { Client } from 'undici';
import { z } from 'zod';
import { createLoadGenerator } from '../src/cli/load-generator.js';
import { shutdownWithin, waitForShutdown } from '../src/cli/process-lifecycle.js';
import { createLogger, logListening } from '../src/ops/logger.js';
import { createMetrics } from '../src/ops/metrics.js';
import { startOpsServer } from '../src/ops/ops-server.js';

/** Outcomes the load generator counts (`spillway_soak_load_responses_total{target,outcome}`). */
const LOAD_OUTCOMES = ['ok', 'limited', 'http_4xx', 'http_5xx', 'timeout', 'error', 'skipped'] as const;
type LoadOutcome = (typeof LOAD_OUTCOMES)[number];

const loadSpec = z.strictObject({
  targets: z
    .array(
      z.strictObject({
        /** The `target` label of its counters. */
        name: z.string().min(1),
        address: z.string().min(1),
        rps: z.number().positive(),
      }),
    )
    .min(1),
  path: z.string().startsWith('/'),
  /** Requests in flight per target past which a request is skipped (counted, not sent). */
  maxInFlight: z.number().int().positive().default(1_024),
  /**
   * Keep-alive connections per target, used in turn (one undici Client each, so the number of
   * connections is fixed rather than growing and shrinking with the latency, as a Pool's would).
   */
  connections: z.number().int().positive().default(8),
  /** No response headers (or body progress) within this: counted as `timeout`. */
  timeoutMs: z.number().int().positive().default(10_000),
});

export type SoakLoadSpec = z.input<typeof loadSpec>;

async function main(): Promise<number> {
  const [role, specText = '{}', ...rest] = process.argv.slice(2);
  if (rest.length > 0) throw new Error('usage: soak-worker.ts upstream|load <json spec>');
  if (role === 'upstream') return runUpstream();
  if (role === 'load') return runLoad(loadSpec.parse(JSON.parse(specText)));
  throw new Error(`soak-worker.ts: unknown role '${role}' (upstream|load)`);
}

async function runUpstream(): Promise<number> {
  const logger = createLogger({ component: 'host', id: 'soak-upstream', level: 'warn' });
  const metrics = createMetrics({ component: 'host', id: 'soak-upstream' });
  const served = new Counter({
    name: 'spillway_soak_upstream_requests_total',
    help: 'Requests the upstream answered.',
    registers: [metrics.registry],
  });
  const body = '{"ok":true}\n';
  const server = createServer((request, response) => {
    request.resume();
    served.inc();
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    response.end(body);
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const ops = await startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }) });
  logListening(logger, { http: `127.0.0.1:${(server.address() as AddressInfo).port}`, ops: ops.address });
  await waitForShutdown(logger);
  await shutdownWithin(logger, 10_000, async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await ops.close();
  });
  return 0;
}

async function runLoad(spec: z.output<typeof loadSpec>): Promise<number> {
  const logger = createLogger({ component: 'host', id: 'soak-load', level: 'warn' });
  const metrics = createMetrics({ component: 'host', id: 'soak-load' });
  const responses = new Counter({
    name: 'spillway_soak_load_responses_total',
    help: `Requests by target and outcome (${LOAD_OUTCOMES.join(', ')}).`,
    labelNames: ['target', 'outcome'],
    registers: [metrics.registry],
  });
  const seconds = new Histogram({
    name: 'spillway_soak_load_response_seconds',
    help: 'From sending a request to the end of its response (answered requests).',
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [metrics.registry],
  });
  const inFlightGauge = new Gauge({
    name: 'spillway_soak_load_in_flight_requests',
    help: 'Requests sent and not yet answered.',
    registers: [metrics.registry],
  });
  const errorLog = new Map<string, number>();
  const targets = spec.targets.map((target) => ({
    ...target,
    inFlight: 0,
    next: 0,
    clients: Array.from(
      { length: spec.connections },
      () =>
        new Client(`http://${target.address}`, {
          pipelining: 1,
          headersTimeout: spec.timeoutMs,
          bodyTimeout: spec.timeoutMs,
          connectTimeout: spec.timeoutMs,
          keepAliveTimeout: 4_000,
        }),
    ),
  }));
  for (const target of spec.targets) {
    for (const outcome of LOAD_OUTCOMES) responses.inc({ target: target.name, outcome }, 0);
  }

  const send = (target: (typeof targets)[number]) => {
    if (target.inFlight >= spec.maxInFlight)
      return responses.inc({ target: target.name, outcome: 'skipped' });
    target.inFlight++;
    inFlightGauge.inc();
    const startedMs = performance.now();
    const done = (outcome: LoadOutcome) => {
      target.inFlight--;
      inFlightGauge.dec();
      responses.inc({ target: target.name, outcome });
    };
    const client = target.clients[target.next++ % target.clients.length]!;
    client
      .request({ path: spec.path, method: 'GET' })
      .then(async (response) => {
        await response.body.dump();
        seconds.observe((performance.now() - startedMs) / 1000);
        const status = response.statusCode;
        done(status === 429 ? 'limited' : status < 400 ? 'ok' : status >= 500 ? 'http_5xx' : 'http_4xx');
      })
      .catch((error: unknown) => {
        const code = (error as { code?: string }).code ?? 'unknown';
        // Logged once a minute per code, so a failing run says why without flooding.
        const nowMs = performance.now();
        if (nowMs - (errorLog.get(code) ?? -Infinity) > 60_000) {
          errorLog.set(code, nowMs);
          logger.warn({ code, err: (error as Error).message }, 'soak load: request failed');
        }
        done(code.endsWith('_TIMEOUT') ? 'timeout' : 'error');
      });
  };

  const generator = createLoadGenerator(
    targets.map((target) => ({ rps: target.rps, offer: () => send(target) })),
  );
  const ops = await startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }) });
  generator.start();
  logListening(logger, { ops: ops.address, targets: targets.map((t) => t.address) });
  await waitForShutdown(logger);
  await shutdownWithin(logger, 10_000, async () => {
    generator.stop();
    await Promise.all(targets.flatMap((t) => t.clients.map((c) => c.close())));
    await ops.close();
  });
  return 0;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  },
);
