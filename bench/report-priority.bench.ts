// What the report thread's priority buys the thread that serves requests when the two share a CPU.
//
// A host reports from a worker thread (createWorkerControlClient), so a report never blocks the
// request thread's event loop; but its few milliseconds of CPU still compete with that thread for
// a CPU whenever every CPU is busy (on a loaded host, or one with fewer CPUs than busy threads). The
// thread runs at nice 10 by default so that the scheduler hands the CPU to the request thread first.
// The end-to-end edge benchmark cannot resolve a difference this size on this VM (its p99 moves by
// tens of percent between rounds), so this one sets the contention up directly:
//
// - the measuring process is pinned to one CPU (`taskset -c 0`), request thread and report thread
//   alike; the report server runs in another process pinned to another CPU, so its work is not
//   in the contention;
// - the request thread stands in for a loaded server: every millisecond a timer fires and spins for
//   WORK_US (about a third of the CPU); the timer's lateness (how long past its due time it ran) is
//   what a request arriving then would wait before its handler starts;
// - the report thread sends a 10-bucket report every 100 ms (ten times the production rate, for
//   samples; each report is the same work as in production);
// - conditions take turns within each round (no reports, report thread at nice 0, at nice 10), the
//   order rotating from round to round, so drift in the VM spreads over all of them.
//
// Run: node --import tsx --expose-gc bench/report-priority.bench.ts
// Env: BENCH_ROUNDS (default 8), BENCH_ROUND_S (seconds per condition per round, default 10),
// BENCH_REPORT_EVERY_MS (default 100).
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';
import { create } from '@bufbuild/protobuf';
import { type ReportRequest, ReportRequestSchema } from '../src/gen/spillway/v1/control_pb.js';
import {
  createWorkerControlClient,
  type WorkerControlClient,
} from '../src/transport/worker-control-client.js';
import { median } from './paired-stats.js';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 8);
const ROUND_S = Number(process.env.BENCH_ROUND_S ?? 10);
const TICK_MS = 1;
const WORK_US = 300;
const REPORT_EVERY_MS = Number(process.env.BENCH_REPORT_EVERY_MS ?? 100);
const BUCKETS = 10;
const SELF = 'bench/report-priority.bench.ts';

type Condition = 'none' | 'nice0' | 'nice10';
const CONDITIONS: { id: Condition; label: string; nice?: number }[] = [
  { id: 'none', label: 'no reports' },
  { id: 'nice0', label: 'reports, thread at nice 0 (the process priority)', nice: 0 },
  { id: 'nice10', label: 'reports, thread at nice 10 (the default)', nice: 10 },
];

interface RoundResult {
  round: number;
  condition: Condition;
  latenessUs: { p50: number; p99: number; p999: number; max: number; samples: number };
  reports: number;
  reportRoundTripMs: { p50: number; p99: number };
  processCpuMs: number;
}

function reportOf(sequence: number): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId: 'bench-host-1',
    zone: 'z1',
    sequence: BigInt(sequence),
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
}

const quantile = (values: number[], q: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
};

/** P(X >= k) for X ~ Binomial(n, 1/2): a one-sided sign test. */
function signTestPValue(k: number, n: number): number {
  let p = 0;
  let choose = 1; // C(n, 0)
  for (let i = 0; i <= n; i++) {
    if (i >= k) p += choose / 2 ** n;
    choose = (choose * (n - i)) / (i + 1);
  }
  return p;
}

function spin(us: number): void {
  const end = performance.now() + us / 1000;
  while (performance.now() < end) {
    // busy: the request thread's work
  }
}

/** One condition for `ms`: the request thread's timer lateness, and the reports made meanwhile. */
async function runCondition(
  round: number,
  condition: Condition,
  client: WorkerControlClient | undefined,
  ms: number,
  sequence: { next: number },
): Promise<RoundResult> {
  const lateness: RecordableHistogram = createHistogram();
  const roundTrips: number[] = [];
  let running = true;
  const reporting = (async () => {
    if (client === undefined) return;
    while (running) {
      const started = performance.now();
      await client.report(reportOf(sequence.next++), { timeoutMs: 2_000 });
      roundTrips.push(performance.now() - started);
      const waitMs = REPORT_EVERY_MS - (performance.now() - started);
      if (waitMs > 0) await new Promise((resolve) => setTimeout(resolve, waitMs));
    }
  })();
  const cpuBefore = process.cpuUsage();
  await new Promise<void>((resolve) => {
    const endAt = performance.now() + ms;
    let due = performance.now() + TICK_MS;
    const tick = () => {
      const now = performance.now();
      lateness.record(Math.max(1, Math.round((now - due) * 1000)));
      spin(WORK_US);
      if (now >= endAt) {
        resolve();
        return;
      }
      due = performance.now() + TICK_MS;
      setTimeout(tick, TICK_MS);
    };
    setTimeout(tick, TICK_MS);
  });
  const cpu = process.cpuUsage(cpuBefore);
  running = false;
  await reporting;
  return {
    round,
    condition,
    latenessUs: {
      p50: lateness.percentile(50),
      p99: lateness.percentile(99),
      p999: lateness.percentile(99.9),
      max: lateness.max,
      samples: lateness.count,
    },
    reports: roundTrips.length,
    reportRoundTripMs: { p50: quantile(roundTrips, 0.5), p99: quantile(roundTrips, 0.99) },
    processCpuMs: (cpu.user + cpu.system) / 1000,
  };
}

/** The pinned process: both report threads started once, then the rounds. Prints JSON. */
async function measure(address: string): Promise<void> {
  const clients = new Map<Condition, WorkerControlClient>();
  for (const c of CONDITIONS) {
    if (c.nice === undefined) continue;
    const client = createWorkerControlClient(address, { threadNice: c.nice });
    await client.whenReady();
    const priority = client.threadPriority();
    if (c.nice > 0 && !priority?.lowered)
      throw new Error(`nice ${c.nice} not applied: ${JSON.stringify(priority)}`);
    clients.set(c.id, client);
  }
  const sequence = { next: 1 };
  // Connections opened and the report path run for a while before anything is recorded.
  for (const client of clients.values()) {
    for (let i = 0; i < 20; i++) await client.report(reportOf(sequence.next++), { timeoutMs: 5_000 });
  }
  await runCondition(0, 'none', undefined, 2_000, sequence); // the timer loop's own warmup
  const results: RoundResult[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    const order = CONDITIONS.map((_, i) => CONDITIONS[(i + round) % CONDITIONS.length]!);
    for (const c of order) {
      const result = await runCondition(round, c.id, clients.get(c.id), ROUND_S * 1000, sequence);
      results.push(result);
      process.stderr.write(
        `round ${round} ${c.id}: lateness p99 ${(result.latenessUs.p99 / 1000).toFixed(2)} ms, p99.9 ${(result.latenessUs.p999 / 1000).toFixed(2)} ms; ${result.reports} reports\n`,
      );
    }
  }
  for (const client of clients.values()) client.close();
  process.stdout.write(`${JSON.stringify(results)}\n`);
}

function hasTaskset(): boolean {
  try {
    execFileSync('taskset', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

async function main(): Promise<void> {
  const cpus = os.availableParallelism();
  if (process.platform !== 'linux' || cpus < 2 || !hasTaskset()) {
    throw new Error('this benchmark needs Linux, taskset and at least 2 CPUs (it pins processes to CPUs)');
  }
  const loadAtStart = os.loadavg();
  const server = spawn(
    'taskset',
    ['-c', '1', process.execPath, '--import', 'tsx', 'bench/report-thread.bench.ts', 'server'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const address = await new Promise<string>((resolve, reject) => {
    server.stdout.once('data', (chunk) => resolve(String(chunk).trim()));
    server.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
  let output = '';
  try {
    const measurer = spawn(
      'taskset',
      ['-c', '0', process.execPath, '--import', 'tsx', SELF, 'measure', address],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
        env: process.env,
      },
    );
    measurer.stdout.on('data', (chunk) => {
      output += String(chunk);
    });
    const code = await new Promise<number | null>((resolve) => measurer.once('exit', resolve));
    if (code !== 0) throw new Error(`the measuring process exited with ${code}`);
  } finally {
    server.kill();
  }
  const rounds = JSON.parse(output) as RoundResult[];
  const of = (id: Condition) => rounds.filter((r) => r.condition === id);
  const summary = CONDITIONS.map((c) => {
    const rs = of(c.id);
    return {
      id: c.id,
      label: c.label,
      p50Us: median(rs.map((r) => r.latenessUs.p50)),
      p99Us: median(rs.map((r) => r.latenessUs.p99)),
      p999Us: median(rs.map((r) => r.latenessUs.p999)),
      maxUs: median(rs.map((r) => r.latenessUs.max)),
      p99RangeUs: [
        Math.min(...rs.map((r) => r.latenessUs.p99)),
        Math.max(...rs.map((r) => r.latenessUs.p99)),
      ],
      reportsPerRound: median(rs.map((r) => r.reports)),
      roundTripP50Ms: median(rs.map((r) => r.reportRoundTripMs.p50)),
      roundTripP99Ms: median(rs.map((r) => r.reportRoundTripMs.p99)),
      cpuMsPerSecond: median(rs.map((r) => r.processCpuMs / ROUND_S)),
    };
  });
  // Per round: what the reports added to the p99 and p99.9 over the same round's no-report turn.
  const added = (id: Condition, pick: (r: RoundResult) => number) =>
    Array.from({ length: ROUNDS }, (_, i) => {
      const none = of('none').find((r) => r.round === i + 1)!;
      const with_ = of(id).find((r) => r.round === i + 1)!;
      return pick(with_) - pick(none);
    });
  const p99 = (r: RoundResult) => r.latenessUs.p99;
  const p999 = (r: RoundResult) => r.latenessUs.p999;
  const addedP99 = { nice0: added('nice0', p99), nice10: added('nice10', p99) };
  const addedP999 = { nice0: added('nice0', p999), nice10: added('nice10', p999) };
  // The two report conditions paired by round: nice 10's figure minus nice 0's.
  const versus = (pick: (r: RoundResult) => number) => {
    const differences = Array.from({ length: ROUNDS }, (_, i) => {
      const at = (id: Condition) => pick(of(id).find((r) => r.round === i + 1)!);
      return at('nice10') - at('nice0');
    });
    const lower = differences.filter((d) => d < 0).length;
    const untied = differences.filter((d) => d !== 0).length;
    return { differences, medianUs: median(differences), lower, untied, p: signTestPValue(lower, untied) };
  };
  const nice10OverNice0 = { p99: versus(p99), p999: versus(p999) };
  const meta = {
    date: new Date().toISOString(),
    node: process.version,
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    cpu: `${os.cpus()[0]?.model ?? 'unknown'} x${cpus}`,
    loadAverage: { atStart: loadAtStart, atEnd: os.loadavg() },
    command: `${process.env.BENCH_ROUNDS ? `BENCH_ROUNDS=${ROUNDS} ` : ''}${process.env.BENCH_ROUND_S ? `BENCH_ROUND_S=${ROUND_S} ` : ''}${process.env.BENCH_REPORT_EVERY_MS ? `BENCH_REPORT_EVERY_MS=${REPORT_EVERY_MS} ` : ''}node --import tsx --expose-gc ${SELF}`,
    rounds: ROUNDS,
    roundSeconds: ROUND_S,
    tickMs: TICK_MS,
    workUs: WORK_US,
    reportEveryMs: REPORT_EVERY_MS,
    buckets: BUCKETS,
  };
  mkdirSync('bench/results', { recursive: true });
  writeFileSync(
    'bench/results/report-priority.json',
    `${JSON.stringify({ meta, summary, nice10OverNice0, addedP99, addedP999, rounds }, null, 2)}\n`,
  );
  const ms = (us: number) => (us / 1000).toFixed(2);
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' / ');
  const medianAdded = (values: number[]) => ms(median(values));
  const md = [
    "# What the report thread's priority buys the request thread on a shared CPU",
    '',
    `${meta.date} · Node ${meta.node} · ${meta.platform} · ${meta.cpu} · load average ${load(meta.loadAverage.atStart)} at the start, ${load(meta.loadAverage.atEnd)} at the end`,
    '',
    `Reproduce: \`${meta.command}\` (${ROUNDS} rounds of ${ROUND_S} s per condition, conditions taking turns in a rotating order).`,
    '',
    'One process pinned to one CPU holds a stand-in request thread and the report threads; the report',
    'server runs pinned to another CPU. Every millisecond the request thread wakes on a timer and',
    `spins ${WORK_US} µs (about a third of its CPU); "lateness" is how long past its due time the timer`,
    'ran: what a request arriving then waits before its handler starts. A report thread sends a',
    `${BUCKETS}-bucket report every ${REPORT_EVERY_MS} ms (${1000 / REPORT_EVERY_MS} times the production rate, for samples; the`,
    'work per report is the same). With a CPU to spare the report thread would run beside the request',
    'thread; pinned, every report competes with it, as on a host whose CPUs are all busy. The header',
    'of bench/report-priority.bench.ts says why the end-to-end edge benchmark cannot resolve this here.',
    '',
    '| condition | lateness p50 ms | p99 ms | p99.9 ms | max ms | p99 range over rounds ms | reports per round | report round trip p50 ms | p99 ms | process CPU ms/s |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...summary.map(
      (s) =>
        `| ${s.label} | ${ms(s.p50Us)} | ${ms(s.p99Us)} | ${ms(s.p999Us)} | ${ms(s.maxUs)} | ${ms(s.p99RangeUs[0]!)}–${ms(s.p99RangeUs[1]!)} | ${s.reportsPerRound} | ${s.id === 'none' ? '' : s.roundTripP50Ms.toFixed(2)} | ${s.id === 'none' ? '' : s.roundTripP99Ms.toFixed(2)} | ${s.cpuMsPerSecond.toFixed(0)} |`,
    ),
    '',
    'Medians over rounds. Nice 10 against nice 0, paired by round (the two turns of a round are',
    'seconds apart): the median of the per-round differences, the rounds in which nice 10 was lower,',
    'and a one-sided sign test (the chance of at least that many such rounds if neither were better):',
    '',
    ...(['p99', 'p999'] as const).map((q) => {
      const v = nice10OverNice0[q];
      return `- ${q === 'p99' ? 'p99' : 'p99.9'}: nice 10 minus nice 0 **${ms(v.medianUs)} ms**; nice 10 lower in ${v.lower} of ${v.untied} rounds (p = ${v.p.toFixed(3)}).`;
    }),
    '',
    'What the reports added over the same round’s turn without reports (median over rounds; the',
    'turn without reports varies from round to round as much as this, so read it as context):',
    '',
    `- p99: ${medianAdded(addedP99.nice0)} ms at nice 0, ${medianAdded(addedP99.nice10)} ms at nice 10.`,
    `- p99.9: ${medianAdded(addedP999.nice0)} ms at nice 0, ${medianAdded(addedP999.nice10)} ms at nice 10.`,
    '',
    '## Rounds',
    '',
    '| round | condition | lateness p99 ms | p99.9 ms | max ms | reports | round trip p50 ms |',
    '|---:|---|---:|---:|---:|---:|---:|',
    ...rounds.map(
      (r) =>
        `| ${r.round} | ${r.condition} | ${ms(r.latenessUs.p99)} | ${ms(r.latenessUs.p999)} | ${ms(r.latenessUs.max)} | ${r.reports} | ${r.condition === 'none' ? '' : r.reportRoundTripMs.p50.toFixed(2)} |`,
    ),
    '',
  ].join('\n');
  writeFileSync('bench/results/report-priority.md', md);
  process.stdout.write(md);
}

if (process.argv[2] === 'measure') await measure(process.argv[3]!);
else await main();
