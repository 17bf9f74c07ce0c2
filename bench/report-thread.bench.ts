// What one report costs the thread that serves requests: the gRPC client on that thread
// (createGrpcControlClient) against the same client on a worker thread (createWorkerControlClient).
// Every request arriving while the thread is busy with a report waits behind it, so this busy time
// is the stall a report puts in front of requests (docs/proxy.md, "Cost").
//
// The server runs in a child process, so the figures are the client side alone. Reports go out at
// the production cadence: each case reports once a second (cases take turns every 1000/cases ms),
// so the client code is as cold, or as warm, as in a host reporting every second.
//
// Run: node --import tsx --expose-gc bench/report-thread.bench.ts
// Env: BENCH_REPORTS (reports per case, default 60); BENCH_SMOKE=1: 2 reports per case every
//      100 ms, the thread's cost from one process, nothing written (bench/smoke.ts).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import os from 'node:os';
import { create } from '@bufbuild/protobuf';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../src/transport/control-transport.js';
import { createGrpcControlClient } from '../src/transport/grpc-control-client.js';
import { startGrpcControlServer } from '../src/transport/grpc-control-server.js';
import { createWorkerControlClient } from '../src/transport/worker-control-client.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, SMOKE, writeResultsFile } from './smoke.js';

const REPORTS = benchSetting('BENCH_REPORTS', 60, 2);
const INTERVAL_MS = SMOKE ? 100 : 1000;
/** Fresh processes the worker thread's own cost is measured in (threadCost). */
const THREAD_COST_PROCESSES = SMOKE ? 1 : 5;
const BUCKET_COUNTS = [1, 50];

function reportOf(buckets: number, sequence: number): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId: 'bench-host-1',
    zone: 'z1',
    sequence: BigInt(sequence),
    windowStartMs: 1_700_000_000_000n,
    windowEndMs: 1_700_000_001_000n,
    hostCount: 1,
    buckets: Array.from({ length: buckets }, (_, i) => ({
      bucket: `api:caller=tenant-${i}`,
      offered: 1000 + i,
      admitted: 900 + i,
      wouldDrop: 0,
    })),
  });
}

async function runServer(): Promise<void> {
  const server = await startGrpcControlServer({
    handler: (request) =>
      create(ReportResponseSchema, {
        responderId: 'bench-aggregator',
        epoch: 1n,
        reportIntervalMs: INTERVAL_MS,
        directives: request.buckets.map((b) => ({
          bucket: b.bucket,
          dropRatio: 0.1,
          mode: 1,
          limitRps: 900,
          offeredRps: b.offered,
          epoch: 1n,
          version: request.sequence,
          ttlMs: 3000,
        })),
      }),
  });
  process.stdout.write(`${server.address}\n`);
}

interface Case {
  id: string;
  label: string;
  buckets: number;
  client: ControlClient;
  busyUs: number[];
  /** CPU time of the whole process (every thread: request, worker, V8's helpers) over the same span. */
  processCpuUs: number[];
  roundTripMs: number[];
}

/** A stand-in client answering after 1 ms without any work: the floor of this measurement. */
function idleClient(): ControlClient {
  const response = create(ReportResponseSchema, {});
  return {
    target: 'none',
    report: () => new Promise<ReportResponse>((resolve) => setTimeout(() => resolve(response), 1)),
    close() {},
  };
}

/**
 * The calling thread's busy time from handing a report to the client until its answer has been
 * handled: event-loop utilization's active time over that span (the thread is idle otherwise).
 */
async function oneReport(c: Case, sequence: number): Promise<void> {
  const request = reportOf(c.buckets, sequence);
  // No forced collection here: a full GC before each span would also flush the bytecode of code
  // that runs once a second, and time its recompilation instead of the report.
  const before = performance.eventLoopUtilization();
  const cpuBefore = process.cpuUsage();
  const started = performance.now();
  const response = await c.client.report(request, { timeoutMs: 2_000 });
  const roundTripMs = performance.now() - started;
  // Whatever the answer scheduled (stream callbacks, timers cleared) runs before the span ends.
  await new Promise((resolve) => setImmediate(resolve));
  const elu = performance.eventLoopUtilization(before);
  const cpu = process.cpuUsage(cpuBefore);
  if (c.buckets > 0 && response.directives.length !== c.buckets) throw new Error(`${c.id}: wrong answer`);
  c.busyUs.push(elu.active * 1000);
  c.processCpuUs.push(cpu.user + cpu.system);
  c.roundTripMs.push(roundTripMs);
}

const quantile = (values: number[], q: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
};

/**
 * What the thread itself costs, from the built package in a fresh Node (no tsx): resident memory
 * it adds and the time until it runs, median of THREAD_COST_PROCESSES processes. Undefined when `dist/` is not built.
 */
function threadCost(): { rssMb: number; readyMs: number } | undefined {
  const built = new URL('../dist/src/transport/worker-control-client.js', import.meta.url);
  if (!existsSync(built)) return undefined;
  const code = `
    const { createWorkerControlClient } = await import(${JSON.stringify(built.href)});
    globalThis.gc(); const before = process.memoryUsage().rss; const t0 = performance.now();
    const client = createWorkerControlClient('127.0.0.1:1'); await client.whenReady();
    const readyMs = performance.now() - t0; await new Promise((r) => setTimeout(r, 500)); globalThis.gc();
    console.log(JSON.stringify({ rssMb: (process.memoryUsage().rss - before) / 1048576, readyMs })); client.close();`;
  const runs = Array.from({ length: THREAD_COST_PROCESSES }, () =>
    JSON.parse(
      execFileSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', code], {
        encoding: 'utf8',
      }),
    ),
  ) as { rssMb: number; readyMs: number }[];
  return {
    rssMb: quantile(
      runs.map((r) => r.rssMb),
      0.5,
    ),
    readyMs: quantile(
      runs.map((r) => r.readyMs),
      0.5,
    ),
  };
}

async function main(): Promise<void> {
  const loadAtStart = os.loadavg();
  const cost = threadCost();
  const server = spawn(process.execPath, ['--import', 'tsx', 'bench/report-thread.bench.ts', 'server'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  // A failed run must not leave the server running.
  process.once('exit', () => server.kill());
  const address = await new Promise<string>((resolve, reject) => {
    server.stdout.once('data', (chunk) => resolve(String(chunk).trim()));
    server.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
  const cases: Case[] = [
    {
      id: 'floor',
      label: 'no client (a 1 ms timer: the floor of this measurement)',
      buckets: 0,
      client: idleClient(),
    },
  ].map((c) => ({ ...c, busyUs: [], processCpuUs: [], roundTripMs: [] }));
  for (const buckets of BUCKET_COUNTS) {
    const worker = createWorkerControlClient(address);
    await worker.whenReady();
    cases.push(
      {
        id: `thread-${buckets}`,
        label: `gRPC client on the request thread, ${buckets} bucket${buckets === 1 ? '' : 's'}`,
        buckets,
        client: createGrpcControlClient(address),
        busyUs: [],
        processCpuUs: [],
        roundTripMs: [],
      },
      {
        id: `worker-${buckets}`,
        label: `gRPC client on a worker thread, ${buckets} bucket${buckets === 1 ? '' : 's'}`,
        buckets,
        client: worker,
        busyUs: [],
        processCpuUs: [],
        roundTripMs: [],
      },
    );
  }
  // Connections opened and first calls made before anything is recorded.
  for (const c of cases) await c.client.report(reportOf(c.buckets, 0), { timeoutMs: 5_000 });
  for (const c of cases) c.busyUs.length = c.processCpuUs.length = c.roundTripMs.length = 0;

  const turnMs = INTERVAL_MS / cases.length;
  let next = performance.now();
  for (let i = 1; i <= REPORTS; i++) {
    for (const c of cases) {
      next += turnMs;
      await oneReport(c, i);
      const waitMs = next - performance.now();
      if (waitMs > 0) await new Promise((resolve) => setTimeout(resolve, waitMs));
    }
    if (i % 10 === 0) process.stderr.write(`${i}/${REPORTS} reports per case\n`);
  }
  for (const c of cases) c.client.close();
  server.kill();

  const results = cases.map((c) => ({
    id: c.id,
    label: c.label,
    buckets: c.buckets,
    reports: c.busyUs.length,
    busyUsP50: quantile(c.busyUs, 0.5),
    busyUsP90: quantile(c.busyUs, 0.9),
    busyUsMax: quantile(c.busyUs, 1),
    busyUsMean: c.busyUs.reduce((a, b) => a + b, 0) / Math.max(1, c.busyUs.length),
    processCpuUsP50: quantile(c.processCpuUs, 0.5),
    processCpuUsMean: c.processCpuUs.reduce((a, b) => a + b, 0) / Math.max(1, c.processCpuUs.length),
    roundTripMsP50: quantile(c.roundTripMs, 0.5),
  }));
  const byId = (id: string) => results.find((r) => r.id === id)!;
  const ratios = BUCKET_COUNTS.map((buckets) => ({
    buckets,
    workerOverThreadP50: byId(`worker-${buckets}`).busyUsP50 / byId(`thread-${buckets}`).busyUsP50,
    workerOverThreadMean: byId(`worker-${buckets}`).busyUsMean / byId(`thread-${buckets}`).busyUsMean,
  }));
  const meta = {
    date: new Date().toISOString(),
    node: process.version,
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    cpu: `${os.cpus()[0]?.model ?? 'unknown'} x${os.cpus().length}`,
    loadAverage: { atStart: loadAtStart, atEnd: os.loadavg() },
    // BENCH_* settings are added by reproduce() in the Reproduce line.
    command: 'node --import tsx --expose-gc bench/report-thread.bench.ts',
    commit: sourceCommit(),
    reportsPerCase: REPORTS,
    intervalMs: INTERVAL_MS,
    workerThread: cost ?? 'not measured: dist/ not built (npm run build)',
  };
  writeResultsFile(
    'bench/results/report-thread.json',
    `${JSON.stringify({ meta, results, ratios }, null, 2)}\n`,
  );
  const us = (n: number) => Math.round(n).toLocaleString('en-US');
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' / ');
  const md = [
    '# What a report costs the thread that serves requests',
    '',
    `${meta.date} · Node ${meta.node} · ${meta.platform} · ${meta.cpu} · load average ${load(meta.loadAverage.atStart)} at the start, ${load(meta.loadAverage.atEnd)} at the end`,
    '',
    `Reproduce: \`${reproduce(meta.command)}\` (${REPORTS} reports per case, each case once a second, cases taking turns).`,
    '',
    "A data-plane host reports its counts about once a second. The report's work on the thread that",
    'serves requests is a stall that every request arriving meanwhile waits behind: it lands in the',
    "latency tail, not in `allow()` (which never waits on a report). Busy time is that thread's",
    'event-loop active time from handing the report to the client until the answer has been handled',
    '(the thread does nothing else here). The server (one directive per reported bucket) runs in',
    "another process, so its work is not counted; the worker thread's own work is not in the busy",
    'columns either: it runs beside the request thread, on another core when one is free. It is in',
    '"process CPU": the CPU time of every thread of this process (request thread, worker, V8\'s',
    'helpers) over the same span (the process does nothing else meanwhile): what a host pays per',
    'report, once a second whatever its request rate.',
    '',
    '| case | reports | busy µs p50 | busy µs p90 | busy µs max | busy µs mean | process CPU µs p50 | process CPU µs mean | round trip ms p50 |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...results.map(
      (r) =>
        `| ${r.label} | ${r.reports} | ${us(r.busyUsP50)} | ${us(r.busyUsP90)} | ${us(r.busyUsMax)} | ${us(r.busyUsMean)} | ${us(r.processCpuUsP50)} | ${us(r.processCpuUsMean)} | ${r.roundTripMsP50.toFixed(2)} |`,
    ),
    '',
    ...ratios.map(
      (r) =>
        `Worker thread over request thread, ${r.buckets} bucket${r.buckets === 1 ? '' : 's'}: **${r.workerOverThreadP50.toFixed(2)}x** busy time at p50, ${r.workerOverThreadMean.toFixed(2)}x in the mean.`,
    ),
    '',
    'What stays on the request thread with the worker: a structured clone of the report object out',
    'and of the answer back, and the message handling. Building the report from the bucket counters',
    'and applying the directives are the same in both and not in these figures (each request is',
    'built before its span starts). The worker rows spread wider than their',
    'p50 (p90 against p50): the thread and the server share the 2 CPUs with the request thread, so',
    'the message that answers a report can find the request thread descheduled. The two',
    'request-thread cases share one JIT, so their code runs twice a second, warmer than in a host:',
    'if anything their busy time is understated.',
    '',
    cost
      ? `The thread itself, from the built package in a fresh Node (median of ${THREAD_COST_PROCESSES} processes): +${cost.rssMb.toFixed(1)} MB resident memory, running ${Math.round(cost.readyMs)} ms after it was created (it loads grpc-js and protobuf-es in its own isolate; the CLI waits for it before listening).`
      : 'The thread itself: not measured (dist/ not built: `npm run build`).',
    '',
  ].join('\n');
  writeResultsFile('bench/results/report-thread.md', md);
  process.stdout.write(md);
}

if (process.argv[2] === 'server') await runServer();
else await main();
