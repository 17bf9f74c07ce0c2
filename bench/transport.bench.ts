// Unary Report calls over loopback: @grpc/grpc-js (Spillway's transport) vs @connectrpc/connect-node
// speaking the gRPC protocol over HTTP/2, each as client and as server (mixed pairs show which side
// costs what). One 50-bucket report up, 50 directives down, as a busy aggregator would exchange.
// Client and server share this process, so a figure is the combined CPU cost of both sides.
//
// Run: node --import tsx --expose-gc bench/transport.bench.ts
// Env: BENCH_ROUNDS (default 5), BENCH_ROUND_MS (default 2000), BENCH_WARMUP_MS (default 1000);
//      BENCH_SMOKE=1: one round of 100 ms per case, nothing written (bench/smoke.ts).
import http2 from 'node:http2';
import os from 'node:os';
import { create } from '@bufbuild/protobuf';
import { createClient } from '@connectrpc/connect';
import { connectNodeAdapter, createGrpcTransport, Http2SessionManager } from '@connectrpc/connect-node';
import {
  RateControl,
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../src/gen/spillway/v1/control_pb.js';
import type { ReportHandler } from '../src/transport/control-transport.js';
import { createGrpcControlClient } from '../src/transport/grpc-control-client.js';
import { startGrpcControlServer } from '../src/transport/grpc-control-server.js';
import { median } from './paired-stats.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, writeResultsFile } from './smoke.js';

const ROUNDS = benchSetting('BENCH_ROUNDS', 5, 1);
const ROUND_MS = benchSetting('BENCH_ROUND_MS', 2000, 100);
const WARMUP_MS = benchSetting('BENCH_WARMUP_MS', 1000, 50);
const IN_FLIGHT = [1, 32];
const BUCKETS = 50;

const request: ReportRequest = create(ReportRequestSchema, {
  reporterId: 'bench-host-1',
  zone: 'z1',
  sequence: 1n,
  windowStartMs: 1_700_000_000_000n,
  windowEndMs: 1_700_000_001_000n,
  hostCount: 1,
  buckets: Array.from({ length: BUCKETS }, (_, i) => ({
    bucket: `api:caller=tenant-${i}`,
    offered: 1000 + i,
    admitted: 900 + i,
    wouldDrop: 0,
  })),
});

/** Same answer shape as the controller: one directive per reported bucket. */
const handler: ReportHandler = (req) =>
  create(ReportResponseSchema, {
    responderId: 'bench-controller',
    epoch: 1n,
    reportIntervalMs: 1000,
    directives: req.buckets.map((b) => ({
      bucket: b.bucket,
      dropRatio: 0.1,
      mode: 1,
      limitRps: 900,
      offeredRps: b.offered,
      epoch: 1n,
      version: 1n,
      ttlMs: 3000,
    })),
  });

type Call = () => Promise<ReportResponse>;
interface Endpoint {
  address: string;
  close(): Promise<void>;
}
interface Caller {
  call: Call;
  close(): void;
}

async function grpcJsServer(): Promise<Endpoint> {
  return startGrpcControlServer({ handler });
}

async function connectServer(): Promise<Endpoint> {
  const server = http2.createServer(
    connectNodeAdapter({
      grpc: true,
      connect: false,
      grpcWeb: false,
      routes: (router) => router.service(RateControl, { report: async (req) => handler(req, { peer: '' }) }),
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    address: `127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
      }),
  };
}

function grpcJsClient(address: string): Caller {
  const client = createGrpcControlClient(address);
  return { call: () => client.report(request, { timeoutMs: 5000 }), close: () => client.close() };
}

function connectClient(address: string): Caller {
  const baseUrl = `http://${address}`;
  const sessionManager = new Http2SessionManager(baseUrl);
  const client = createClient(RateControl, createGrpcTransport({ baseUrl, sessionManager }));
  return { call: () => client.report(request, { timeoutMs: 5000 }), close: () => sessionManager.abort() };
}

interface RoundResult {
  callsPerSec: number;
  p50Ms: number;
  p99Ms: number;
}

async function measure(call: Call, inFlight: number, durationMs: number): Promise<RoundResult> {
  const latencies: number[] = [];
  const endAt = performance.now() + durationMs;
  const worker = async () => {
    while (performance.now() < endAt) {
      const t0 = performance.now();
      await call();
      latencies.push(performance.now() - t0);
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: inFlight }, worker));
  const elapsedS = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    callsPerSec: latencies.length / elapsedS,
    p50Ms: quantile(latencies, 0.5),
    p99Ms: quantile(latencies, 0.99),
  };
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

const pairs = [
  { client: 'grpc-js', server: 'grpc-js' },
  { client: 'connect-node', server: 'connect-node' },
  { client: 'grpc-js', server: 'connect-node' },
  { client: 'connect-node', server: 'grpc-js' },
] as const;

async function main(): Promise<void> {
  const loadAtStart = os.loadavg()[0]!;
  const servers = { 'grpc-js': await grpcJsServer(), 'connect-node': await connectServer() };
  const cases = pairs.flatMap((pair) =>
    IN_FLIGHT.map((inFlight) => {
      const address = servers[pair.server].address;
      const caller = pair.client === 'grpc-js' ? grpcJsClient(address) : connectClient(address);
      return { ...pair, inFlight, caller, rounds: [] as RoundResult[] };
    }),
  );
  for (const c of cases) {
    const check = await c.caller.call();
    if (check.directives.length !== BUCKETS) throw new Error(`${c.client}->${c.server}: wrong answer`);
    await measure(c.caller.call, c.inFlight, WARMUP_MS);
  }
  // Rounds interleave the cases so drift on a shared machine hits them all alike; medians are reported.
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of cases) {
      globalThis.gc?.();
      c.rounds.push(await measure(c.caller.call, c.inFlight, ROUND_MS));
    }
    process.stderr.write(`round ${round + 1}/${ROUNDS} done\n`);
  }
  for (const c of cases) c.caller.close();
  await Promise.all(Object.values(servers).map((s) => s.close()));

  const results = cases.map((c) => ({
    client: c.client,
    server: c.server,
    inFlight: c.inFlight,
    callsPerSec: median(c.rounds.map((r) => r.callsPerSec)),
    p50Ms: median(c.rounds.map((r) => r.p50Ms)),
    p99Ms: median(c.rounds.map((r) => r.p99Ms)),
    rounds: c.rounds,
  }));
  const find = (client: string, server: string, inFlight: number) =>
    results.find((r) => r.client === client && r.server === server && r.inFlight === inFlight)!;
  const ratios = IN_FLIGHT.map((inFlight) => ({
    inFlight,
    grpcJsOverConnect:
      find('grpc-js', 'grpc-js', inFlight).callsPerSec /
      find('connect-node', 'connect-node', inFlight).callsPerSec,
  }));

  const meta = {
    date: new Date().toISOString(),
    node: process.version,
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    cpu: `${os.cpus()[0]?.model ?? 'unknown'} x${os.cpus().length}`,
    // A loaded machine (load above the core count) makes every figure here meaningless; say so.
    loadAverage1m: { atStart: loadAtStart, atEnd: os.loadavg()[0]! },
    command: 'node --import tsx --expose-gc bench/transport.bench.ts',
    commit: sourceCommit(),
    rounds: ROUNDS,
    roundMs: ROUND_MS,
    warmupMs: WARMUP_MS,
    buckets: BUCKETS,
    libraries: {
      '@grpc/grpc-js': '1.14.7',
      '@connectrpc/connect-node': '2.1.2',
      '@bufbuild/protobuf': '2.12.0',
    },
  };
  writeResultsFile('bench/results/transport.json', `${JSON.stringify({ meta, results, ratios }, null, 2)}\n`);
  const fmt = (n: number, digits = 0) =>
    n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
  const md = [
    '# Transport: unary Report over loopback',
    '',
    `${meta.date} · Node ${meta.node} · ${meta.platform} · ${meta.cpu} · 1-min load average ${fmt(loadAtStart, 1)} at start, ${fmt(meta.loadAverage1m.atEnd, 1)} at end`,
    '',
    `Reproduce: \`${reproduce(meta.command)}\` (${ROUNDS} rounds of ${ROUND_MS} ms after ${WARMUP_MS} ms warmup per case, medians).`,
    `Each call sends a ${BUCKETS}-bucket ReportRequest and receives ${BUCKETS} directives. Client and server run in`,
    'the same process, so a figure is the combined CPU cost of both sides. Libraries: @grpc/grpc-js 1.14.7,',
    '@connectrpc/connect-node 2.1.2 (gRPC protocol, HTTP/2), @bufbuild/protobuf 2.12.0 on both.',
    '',
    '| client | server | in flight | calls/s | p50 ms | p99 ms |',
    '|---|---|---:|---:|---:|---:|',
    ...results.map(
      (r) =>
        `| ${r.client} | ${r.server} | ${r.inFlight} | ${fmt(r.callsPerSec)} | ${fmt(r.p50Ms, 3)} | ${fmt(r.p99Ms, 3)} |`,
    ),
    '',
    ...ratios.map(
      (r) =>
        `grpc-js/grpc-js over connect-node/connect-node, ${r.inFlight} in flight: **${fmt(r.grpcJsOverConnect, 2)}x** calls/s.`,
    ),
    '',
  ].join('\n');
  writeResultsFile('bench/results/transport.md', md);
  process.stdout.write(md);
}

await main();
