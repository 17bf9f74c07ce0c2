// The control plane's two costs that grow with a fleet, and the measurement that chose the ratio policy:
//  1. aggregator ingestion on one core: host reports of 50 buckets per second, through
//     `handleReport` on pre-built decoded requests, with `fromBinary` decode included, and with the
//     reply's `toBinary` too (the whole wire path minus the socket);
//  2. a controller tick computing ratios for 100,000 buckets (median and p99 over many ticks);
//  3. ratio policies compared in the closed loop of test/control/closed-loop-harness.ts.
//
// Run: node --import tsx --expose-gc bench/control.bench.ts
// Env: BENCH_REPORTS (default 20,000 per round), BENCH_ROUNDS (default 7), BENCH_TICKS (default 40),
//      BENCH_SEEDS (default 5 closed-loop seeds per scenario and policy), BENCH_SKIP_POLICIES=1 skips part 3;
//      BENCH_SMOKE=1: a few hundred reports, 2 ticks over 1,000 buckets, each policy and scenario
//      once with one seed, nothing written (bench/smoke.ts).
import os from 'node:os';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import type { RatioPolicySpec } from '../src/config/limits-config.js';
import { createAggregator } from '../src/control/aggregator.js';
import { createController } from '../src/control/controller.js';
import { createRatioPolicy, DEFAULT_RATIO_POLICY } from '../src/control/ratio-policy.js';
import { ManualClock, systemScheduler } from '../src/core/clock.js';
import {
  DirectiveSchema,
  Mode,
  type ReportRequest,
  ReportRequestSchema,
  ReportResponseSchema,
  Tier,
} from '../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../src/transport/control-transport.js';
import { decodeReportRequest, encodeReportResponse } from '../src/transport/report-codec.js';
import { runClosedLoop, standardScenarios } from '../test/control/closed-loop-harness.js';
import { median } from './paired-stats.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, SMOKE, writeResultsFile } from './smoke.js';

const REPORTS = benchSetting('BENCH_REPORTS', 20_000, 200);
const ROUNDS = benchSetting('BENCH_ROUNDS', 7, 1);
const TICKS = benchSetting('BENCH_TICKS', 40, 2);
const SEEDS = benchSetting('BENCH_SEEDS', 5, 1);
const SKIP_POLICIES = process.env.BENCH_SKIP_POLICIES === '1';
const HOSTS = SMOKE ? 200 : 2_000;
/** Reports through each ingestion path before its rounds. */
const WARMUP_REPORTS = SMOKE ? 100 : 5_000;
/** The controller tick's child entries: 40 aggregators of this many buckets each. */
const BUCKETS_PER_CHILD = SMOKE ? 100 : 10_000;
const BUCKETS_PER_REPORT = 50;
const BUCKET_POOL = 500;
const TARGET_REPORTS_PER_SEC = 10_000;
const TARGET_TICK_MS = 50;

const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with --expose-gc (see the header of this file)');

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!;
};
const fmt = (x: number, digits = 1) =>
  x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

// ---- 1. aggregator ingestion -------------------------------------------------------------------

function hostRequests(): ReportRequest[] {
  const nowMs = Math.floor(Date.now());
  return Array.from({ length: HOSTS }, (_, h) =>
    create(ReportRequestSchema, {
      reporterId: `host-${h}.zone-a.example:${10_000 + h}`,
      tier: Tier.HOST,
      zone: 'zone-a',
      sequence: 1n,
      windowStartMs: BigInt(nowMs - 1000),
      windowEndMs: BigInt(nowMs),
      hostCount: 1,
      buckets: Array.from({ length: BUCKETS_PER_REPORT }, (_, i) => {
        const offered = 50 + ((h * 31 + i * 7) % 200);
        return {
          bucket: `api:caller=tenant-${(h * 13 + i * 17) % BUCKET_POOL}`,
          offered,
          admitted: offered * 0.8,
          wouldDrop: 0,
        };
      }),
    }),
  );
}

async function aggregatorIngestion() {
  // A parent that answers once with a directive for every bucket, so each host reply carries 50
  // relayed directives as in production.
  const parent: ControlClient = {
    target: 'controller',
    report: async (request) =>
      create(ReportResponseSchema, {
        epoch: 1n,
        reportIntervalMs: 1000,
        directives: request.buckets.map((b) =>
          create(DirectiveSchema, {
            bucket: b.bucket,
            dropRatio: 0.2,
            mode: Mode.ENFORCE,
            limitRps: 1000,
            offeredRps: 1250,
            epoch: 1n,
            version: 1n,
            ttlMs: 3_600_000,
          }),
        ),
      }),
    close() {},
  };
  const aggregator = createAggregator({
    id: 'agg',
    zone: 'zone-a',
    parents: [parent],
    scheduler: systemScheduler,
  });
  const requests = hostRequests();
  const binaries = requests.map((r) => toBinary(ReportRequestSchema, r));
  let sequence = 1n;
  for (const r of requests) aggregator.handleReport(r, { peer: 'bench' });
  await aggregator.flush();

  const modes = {
    decoded: (i: number) => {
      const request = requests[i % HOSTS]!;
      request.sequence = ++sequence;
      aggregator.handleReport(request, { peer: 'bench' });
    },
    decode: (i: number) => {
      const request = fromBinary(ReportRequestSchema, binaries[i % HOSTS]!);
      request.sequence = ++sequence;
      aggregator.handleReport(request, { peer: 'bench' });
    },
    wire: (i: number) => {
      const request = fromBinary(ReportRequestSchema, binaries[i % HOSTS]!);
      request.sequence = ++sequence;
      const response = aggregator.handleReport(request, { peer: 'bench' });
      if (response instanceof Promise) throw new Error('aggregator answers synchronously');
      toBinary(ReportResponseSchema, response);
    },
    fastDecode: (i: number) => {
      const request = decodeReportRequest(binaries[i % HOSTS]!);
      request.sequence = ++sequence;
      aggregator.handleReport(request, { peer: 'bench' });
    },
    fastWire: (i: number) => {
      const request = decodeReportRequest(binaries[i % HOSTS]!);
      request.sequence = ++sequence;
      const response = aggregator.handleReport(request, { peer: 'bench' });
      if (response instanceof Promise) throw new Error('aggregator answers synchronously');
      encodeReportResponse(response);
    },
  };
  /** The reflective codec paths are slow; fewer reports keep the run short. */
  const reportsFor = (name: string) =>
    name === 'decode' || name === 'wire' ? Math.ceil(REPORTS / 4) : REPORTS;
  const results: Record<string, { perSec: number[]; perCpuSec: number[] }> = {};
  for (const [name, fn] of Object.entries(modes)) {
    for (let i = 0; i < WARMUP_REPORTS; i++) fn(i);
    const perSec: number[] = [];
    const perCpuSec: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      gc!();
      const cpuStart = process.cpuUsage();
      const start = process.hrtime.bigint();
      const count = reportsFor(name);
      for (let i = 0; i < count; i++) fn(i);
      const seconds = Number(process.hrtime.bigint() - start) / 1e9;
      const cpu = process.cpuUsage(cpuStart);
      perSec.push(count / seconds);
      perCpuSec.push(count / ((cpu.user + cpu.system) / 1e6));
    }
    results[name] = { perSec, perCpuSec };
  }
  const sample = aggregator.handleReport(requests[0]!, { peer: 'bench' });
  const directivesPerReply = sample instanceof Promise ? 0 : sample.directives.length;
  await aggregator.stop();
  return {
    results,
    directivesPerReply,
    requestBytes: binaries[0]!.length,
    snapshotBuckets: aggregator.snapshot().buckets.length,
  };
}

// ---- 2. controller tick over 100,000 buckets ---------------------------------------------------

function controllerTick(spec: RatioPolicySpec) {
  const clock = new ManualClock(1_700_000_000_000);
  const controller = createController({
    id: 'bench',
    scheduler: clock,
    childExpiryMs: 1e12,
    bucketExpiryMs: 1e12,
    maxBuckets: 20 * BUCKETS_PER_CHILD,
    config: {
      version: 1,
      intervalMs: 1000,
      ttlMs: 4000,
      buckets: [
        {
          template: 'api:caller=*',
          limitRps: 100,
          mode: 'enforce',
          scope: 'global',
          maxInstances: 20 * BUCKETS_PER_CHILD,
        },
      ],
      ratioPolicy: spec,
    },
  });
  // 40 aggregators of 10,000 buckets each (a full run); every bucket is reported by 4 of them
  // (100,000 buckets, 400,000 entries).
  const children = 40;
  const perChild = BUCKETS_PER_CHILD;
  for (let c = 0; c < children; c++) {
    const base = (c % 10) * perChild;
    controller.handleReport(
      create(ReportRequestSchema, {
        reporterId: `agg-${c}`,
        tier: Tier.AGGREGATOR,
        zone: `zone-${c % 4}`,
        sequence: 1n,
        windowStartMs: 0n,
        windowEndMs: 1000n,
        hostCount: 50,
        buckets: Array.from({ length: perChild }, (_, i) => {
          const offered = 20 + ((i * 7 + c) % 80);
          return { bucket: `api:caller=tenant-${base + i}`, offered, admitted: offered * 0.9, wouldDrop: 0 };
        }),
      }),
      { peer: 'bench' },
    );
  }
  const bucketCount = controller.snapshot().buckets.length;
  for (let i = 0; i < 3; i++) controller.tick(); // warmup
  const tickMs: number[] = [];
  const tickCpuMs: number[] = [];
  for (let i = 0; i < TICKS; i++) {
    clock.advance(1000);
    const cpuStart = process.cpuUsage();
    const start = process.hrtime.bigint();
    controller.tick();
    tickMs.push(Number(process.hrtime.bigint() - start) / 1e6);
    const cpu = process.cpuUsage(cpuStart);
    tickCpuMs.push((cpu.user + cpu.system) / 1e3);
  }
  return { spec, bucketCount, entries: children * perChild, tickMs, tickCpuMs };
}

// ---- 3. ratio policies in the closed loop ------------------------------------------------------

const POLICIES: RatioPolicySpec[] = [
  { kind: 'plain' },
  { kind: 'ewma', alpha: 0.5 },
  { kind: 'corrected', gain: 0.2, maxCorrection: 0.5 },
  { kind: 'corrected', gain: 0.3, maxCorrection: 0.5 },
  { kind: 'corrected', gain: 0.2, maxCorrection: 0.5, offeredAlpha: 0.5 },
];

function policyComparison() {
  const rows: {
    scenario: string;
    policy: string;
    meanError: number;
    rmsError: number;
    maxOvershoot: number;
  }[] = [];
  for (const [scenarioIndex, scenario] of standardScenarios().entries()) {
    for (const [policyIndex, spec] of POLICIES.entries()) {
      // A smoke run still runs every policy and every scenario, each once rather than each pair.
      if (SMOKE && policyIndex !== scenarioIndex % POLICIES.length) continue;
      let mean = 0;
      let rms = 0;
      let max = 0;
      for (let seed = 1; seed <= SEEDS; seed++) {
        const r = runClosedLoop(scenario, createRatioPolicy(spec), seed);
        mean += r.meanError / SEEDS;
        rms += r.rmsError / SEEDS;
        max += r.maxOvershoot / SEEDS;
      }
      rows.push({
        scenario: scenario.name,
        policy: policyName(spec),
        meanError: mean,
        rmsError: rms,
        maxOvershoot: max,
      });
    }
  }
  return rows;
}

function policyName(spec: RatioPolicySpec): string {
  switch (spec.kind) {
    case 'plain':
      return 'plain';
    case 'ewma':
      return `ewma α=${spec.alpha}`;
    case 'corrected':
      return `corrected gain=${spec.gain}${spec.offeredAlpha ? ` + ewma α=${spec.offeredAlpha}` : ''}`;
  }
}

// ---- run and write -----------------------------------------------------------------------------

const loadBefore = os.loadavg();
const ingestion = await aggregatorIngestion();
// The default policy (the target's row), then the costliest stateful one: per-bucket state carried
// from tick to tick. (This once ran `plain` twice: the default is plain.)
const ticks = [
  controllerTick(DEFAULT_RATIO_POLICY),
  controllerTick({ kind: 'corrected', gain: 0.2, maxCorrection: 0.5, offeredAlpha: 0.5 }),
];
const policies = SKIP_POLICIES ? [] : policyComparison();
const loadAfter = os.loadavg();

const cpus = os.cpus();
const machine = {
  date: new Date().toISOString(),
  commit: sourceCommit(),
  node: process.version,
  v8: process.versions.v8,
  os: `${os.type()} ${os.release()} ${os.arch()}`,
  cpu: `${cpus[0]?.model.trim() ?? 'unknown'} ×${cpus.length}`,
  loadAverage: [loadBefore[0], loadAfter[0]],
};
const ingestionRows = Object.entries(ingestion.results).map(([mode, r]) => ({
  mode,
  medianPerSec: median(r.perSec),
  minPerSec: Math.min(...r.perSec),
  maxPerSec: Math.max(...r.perSec),
  medianPerCpuSec: median(r.perCpuSec),
}));
const tickRows = ticks.map((t) => ({
  policy: policyName(t.spec),
  buckets: t.bucketCount,
  entries: t.entries,
  medianMs: median(t.tickMs),
  p99Ms: quantile(t.tickMs, 0.99),
  maxMs: Math.max(...t.tickMs),
  medianCpuMs: median(t.tickCpuMs),
  p99CpuMs: quantile(t.tickCpuMs, 0.99),
}));
const decodedRate = ingestionRows.find((r) => r.mode === 'decoded')!.medianPerSec;
const decodeRate = ingestionRows.find((r) => r.mode === 'decode')!.medianPerSec;
const fastDecodeRate = ingestionRows.find((r) => r.mode === 'fastDecode')!.medianPerSec;
const defaultTick = tickRows[0]!;
const targets = {
  ingestionDecoded: decodedRate >= TARGET_REPORTS_PER_SEC,
  ingestionWithDecode: Math.max(decodeRate, fastDecodeRate) >= TARGET_REPORTS_PER_SEC,
  tick100k: defaultTick.p99Ms <= TARGET_TICK_MS,
};
const pass = (ok: boolean) => (ok ? 'pass' : '**FAIL**');
const pct = (x: number) => `${x >= 0 ? '+' : ''}${fmt(100 * x, 2)}%`;
const modeLabel: Record<string, string> = {
  decoded: '`handleReport` on pre-built decoded requests',
  decode: '`fromBinary` + `handleReport`',
  wire: '`fromBinary` + `handleReport` + `toBinary(reply)`',
  fastDecode: '`decodeReportRequest` + `handleReport`',
  fastWire: '`decodeReportRequest` + `handleReport` + `encodeReportResponse(reply)`',
};

const markdown = `# Control plane: aggregator ingestion, controller tick, ratio policies

${machine.date} · Node ${machine.node} (V8 ${machine.v8}) · ${machine.os} · ${machine.cpu} · load average ${fmt(loadBefore[0]!, 2)} → ${fmt(loadAfter[0]!, 2)}

Reproduce: \`${reproduce('node --import tsx --expose-gc bench/control.bench.ts')}\`
(${ROUNDS} rounds of ${REPORTS.toLocaleString('en-US')} reports after warmup, a quarter of that on the protobuf-es codec paths; ${TICKS} ticks after 3 warmup ticks;
closed loop: ${SEEDS} seeds per scenario and policy).

## 1. Aggregator ingestion (one core)

${HOSTS.toLocaleString('en-US')} distinct hosts, each report ${BUCKETS_PER_REPORT} buckets out of ${BUCKET_POOL} (${ingestion.requestBytes} bytes on the wire);
every reply carries ${ingestion.directivesPerReply} relayed directives. Real clock (relayed TTLs refresh every 50 ms).

Wall rate is what one core delivered; CPU rate (reports per CPU-second of this process, GC
included) is the figure to trust when the machine is shared.

| path | reports/s (median wall) | min–max | reports per CPU-second (median) | target ≥ ${TARGET_REPORTS_PER_SEC.toLocaleString('en-US')}/s (wall) |
|---|---:|---:|---:|---|
${ingestionRows
  .map(
    (r) =>
      `| ${modeLabel[r.mode]} | ${fmt(r.medianPerSec, 0)} | ${fmt(r.minPerSec, 0)}–${fmt(r.maxPerSec, 0)} | ${fmt(r.medianPerCpuSec, 0)} | ${r.mode === 'wire' || r.mode === 'fastWire' ? '—' : pass(r.medianPerSec >= TARGET_REPORTS_PER_SEC)} |`,
  )
  .join('\n')}

## 2. Controller tick

${defaultTick.buckets.toLocaleString('en-US')} buckets (template instances), ${defaultTick.entries.toLocaleString('en-US')} child entries (40 aggregators × ${BUCKETS_PER_CHILD.toLocaleString('en-US')} buckets,
each bucket reported by 4): expire children, sum offered/admitted per bucket, run the ratio policy.

| ratio policy | buckets | median ms (wall) | p99 ms (wall) | max ms (wall) | median CPU ms | p99 CPU ms | target p99 ≤ ${TARGET_TICK_MS} ms (wall) |
|---|---:|---:|---:|---:|---:|---:|---|
${tickRows
  .map(
    (t) =>
      `| ${t.policy} | ${t.buckets.toLocaleString('en-US')} | ${fmt(t.medianMs, 2)} | ${fmt(t.p99Ms, 2)} | ${fmt(t.maxMs, 2)} | ${fmt(t.medianCpuMs, 2)} | ${fmt(t.p99CpuMs, 2)} | ${pass(t.p99Ms <= TARGET_TICK_MS)} |`,
  )
  .join('\n')}

## 3. Ratio policies in the closed loop

20 simulated hosts (skewed shares, Poisson arrivals, each reporting at its own phase) and the real
controller in virtual time, limit 1,000 rps (test/control/closed-loop-harness.ts). Error = admitted / limit − 1
per interval over the measured intervals where offered > limit; mean over ${SEEDS} seeds.
Default policy: \`${JSON.stringify(DEFAULT_RATIO_POLICY)}\`.

| scenario | policy | mean error | RMS error | max overshoot |
|---|---|---:|---:|---:|
${policies.map((r) => `| ${r.scenario} | ${r.policy} | ${pct(r.meanError)} | ${fmt(100 * r.rmsError, 2)}% | ${pct(r.maxOvershoot)} |`).join('\n')}

## Targets

| target | result |
|---|---|
| aggregator ingestion, decoded, ≥ ${TARGET_REPORTS_PER_SEC.toLocaleString('en-US')} reports/s | ${pass(targets.ingestionDecoded)} (${fmt(decodedRate, 0)}/s) |
| aggregator ingestion with decode, ≥ ${TARGET_REPORTS_PER_SEC.toLocaleString('en-US')} reports/s | ${pass(targets.ingestionWithDecode)} (${fmt(fastDecodeRate, 0)}/s with \`decodeReportRequest\`, ${fmt(decodeRate, 0)}/s with protobuf-es \`fromBinary\`) |
| controller tick, ${defaultTick.buckets.toLocaleString('en-US')} buckets, p99 ≤ ${TARGET_TICK_MS} ms | ${pass(targets.tick100k)} (${fmt(defaultTick.p99Ms, 2)} ms) |
`;

writeResultsFile('bench/results/control.md', markdown);
writeResultsFile(
  'bench/results/control.json',
  `${JSON.stringify({ machine, ingestion: ingestionRows, ticks: tickRows, policies, targets }, null, 2)}\n`,
);
console.log(markdown);
