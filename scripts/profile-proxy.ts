// What `spillway proxy` costs per forwarded request, measured as CPU time of the proxy process
// (user + system from /proc/<pid>/stat) over a fixed-rate run and a full-speed run, and optionally
// a V8 CPU profile of the proxy summarized by self time per function. A working tool for
// optimizing the forwarding path; bench/edge.bench.ts is the reference benchmark.
//
//   node --import tsx scripts/profile-proxy.ts [--cases upstream,bare,local,global] [--rate 1000]
//        [--duration 10] [--max-duration 5] [--warmup 3] [--connections 50] [--rounds 1]
//        [--baseline DIR] [--body-bytes N] [--cpu-prof DIR] [--top 40] [--proxy-node-flags "..."]
//   node --import tsx scripts/profile-proxy.ts summarize FILE.cpuprofile [--top 40]
//
// For each proxy, its request thread's garbage collection pauses during the fixed-rate run, from
// its own /metrics (spillway_nodejs_gc_duration_seconds): pauses per second, milliseconds paused per
// second, and pauses over 5 ms per minute.
//
// Every process is separate: upstream (node:http, 200 "ok"), the proxy (the CLI, from source),
// autocannon (50 keep-alive connections) and, for `global`, one controller and one aggregator.
// `local` is a local-backend bucket (one key, limit far above the load); `global` one global
// bucket. With --cpu-prof, the proxy runs under `node --cpu-prof` and its profile (startup and
// warmup included) is summarized after it exits. --body-bytes N sends POSTs with an N-byte body
// instead of GETs. Linux only (/proc).
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { cpuSeconds, proxyRules, runOkUpstream } from '../bench/http-probes.js';
import { median } from '../bench/paired-stats.js';
import { readListening, scrape } from '../test/integration/spillway-process.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SELF = fileURLToPath(import.meta.url);
const HIGH_LIMIT = 1_000_000_000;

type CaseId = 'upstream' | 'bare' | 'local' | 'global';

interface LoadResult {
  requests: number;
  status2xx: number;
  other: number;
  errors: number;
  durationSec: number;
  p50Ms: number;
  p99Ms: number;
}

// ---------------------------------------------------------------------------------------------
// Child roles

type Autocannon = (
  options: Record<string, unknown>,
  callback: (error: Error | null, result: AutocannonResult) => void,
) => { on(event: 'response', listener: (client: unknown, status: number) => void): void };
interface AutocannonResult {
  errors: number;
  timeouts: number;
  duration: number;
  latency: { p50: number; p99: number };
}

async function runLoadgen(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      url: { type: 'string' },
      connections: { type: 'string' },
      duration: { type: 'string' },
      rate: { type: 'string', default: '0' },
      'body-bytes': { type: 'string', default: '0' },
    },
  });
  const autocannon = createRequire(import.meta.url)('autocannon') as Autocannon;
  const rate = Number(values.rate);
  const bodyBytes = Number(values['body-bytes']);
  let ok = 0;
  let other = 0;
  const result = await new Promise<AutocannonResult>((done, fail) => {
    const instance = autocannon(
      {
        url: values.url,
        connections: Number(values.connections),
        duration: Number(values.duration),
        ...(rate > 0 ? { overallRate: rate } : {}),
        ...(bodyBytes > 0
          ? {
              method: 'POST',
              body: 'x'.repeat(bodyBytes),
              headers: { 'content-type': 'application/octet-stream' },
            }
          : {}),
        timeout: 10,
      },
      (error, r) => (error ? fail(error) : done(r)),
    );
    instance.on('response', (_client, status) => {
      if (status >= 200 && status < 300) ok++;
      else other++;
    });
  });
  const out: LoadResult = {
    requests: ok + other,
    status2xx: ok,
    other,
    errors: result.errors + result.timeouts,
    durationSec: result.duration,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

// ---------------------------------------------------------------------------------------------
// Orchestrator

const children: ChildProcess[] = [];

async function startProcess(
  name: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<{ child: ChildProcess; listening: Record<string, unknown> }> {
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '', ...env },
  });
  children.push(child);
  const listening = await readListening(name, child, [], 60_000);
  return { child, listening };
}

/** POST bodies of this many bytes instead of GETs (--body-bytes). */
let loadBodyBytes = 0;

async function load(
  url: string,
  connections: number,
  durationSec: number,
  rate: number,
): Promise<LoadResult> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      SELF,
      'loadgen',
      '--url',
      url,
      '--connections',
      String(connections),
      '--duration',
      String(durationSec),
      '--rate',
      String(rate),
      '--body-bytes',
      String(loadBodyBytes),
    ],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, NODE_OPTIONS: '' } },
  );
  children.push(child);
  let stdout = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    stdout += chunk.toString();
  });
  const code = await new Promise<number | null>((done) => child.once('exit', done));
  if (code !== 0) throw new Error(`loadgen exited ${code}: ${stdout}`);
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as LoadResult;
}

async function measure(
  pid: number,
  url: string,
  connections: number,
  durationSec: number,
  rate: number,
): Promise<LoadResult & { cpuUsPerRequest: number }> {
  const before = cpuSeconds(pid);
  const result = await load(url, connections, durationSec, rate);
  const cpu = cpuSeconds(pid) - before;
  return { ...result, cpuUsPerRequest: (cpu * 1e6) / Math.max(1, result.requests) };
}

function spillway(args: string[]): string[] {
  return ['--import', 'tsx', 'src/cli/entry.ts', ...args, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'];
}

interface Target {
  name: string;
  pid: number;
  url: string;
  /** The proxy's ops address, for its GC metrics; none for the upstream. */
  ops: string | undefined;
  child: ChildProcess | undefined;
  profDir: string | undefined;
}

interface Summary {
  /** One per round, for proxies (none for the upstream). */
  gc: GcPauses[];
  fixedCpuUsPerReq: number[];
  maxCpuUsPerReq: number[];
  maxReqPerSec: number[];
}

async function main(argv: string[]): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      cases: { type: 'string', default: 'bare,local,global' },
      rate: { type: 'string', default: '1000' },
      duration: { type: 'string', default: '10' },
      'max-duration': { type: 'string', default: '5' },
      warmup: { type: 'string', default: '3' },
      connections: { type: 'string', default: '50' },
      rounds: { type: 'string', default: '1' },
      baseline: { type: 'string' },
      'body-bytes': { type: 'string', default: '0' },
      'cpu-prof': { type: 'string' },
      top: { type: 'string', default: '40' },
      'proxy-node-flags': { type: 'string', default: '' },
    },
  });
  const cases = String(values.cases).split(',') as CaseId[];
  for (const id of cases) {
    if (!['upstream', 'bare', 'local', 'global'].includes(id)) throw new Error(`unknown case ${id}`);
  }
  const rate = Number(values.rate);
  const durationSec = Number(values.duration);
  const maxDurationSec = Number(values['max-duration']);
  const warmupSec = Number(values.warmup);
  const connections = Number(values.connections);
  const rounds = Number(values.rounds);
  loadBodyBytes = Number(values['body-bytes']);
  const profDir = values['cpu-prof'] === undefined ? undefined : resolve(values['cpu-prof']);
  // Node flags for the proxies only (e.g. "--max-semi-space-size=4"), to see what a V8 heap
  // setting does to the request thread's collections.
  const proxyNodeFlags = String(values['proxy-node-flags'])
    .split(' ')
    .filter((flag) => flag !== '');
  // Another checkout (e.g. `git worktree add /tmp/base HEAD~1`): its proxy runs beside this one's,
  // round-robin, so a before/after comparison sees the same machine load.
  const trees: { label: string; root: string }[] = [{ label: '', root: ROOT }];
  if (values.baseline !== undefined) trees.unshift({ label: 'baseline:', root: resolve(values.baseline) });
  const dir = mkdtempSync(join(os.tmpdir(), 'spillway-profile-proxy-'));
  const loadStart = os.loadavg();
  process.once('SIGINT', () => {
    for (const child of children) child.kill('SIGKILL');
    process.exit(130);
  });
  const summaries = new Map<string, Summary>();
  try {
    const upstream = await startProcess('upstream', ['--import', 'tsx', SELF, 'upstream']);
    const upstreamAddress = String(upstream.listening.http);
    let aggregatorAddress = '';
    if (cases.includes('global')) {
      const limits = join(dir, 'limits.yaml');
      writeFileSync(
        limits,
        `version: 1\nintervalMs: 1000\nbuckets:\n  - key: edge\n    limitRps: ${HIGH_LIMIT}\n    mode: enforce\n`,
      );
      const controller = await startProcess(
        'controller',
        spillway(['controller', '--config', limits, '--log-level', 'warn']),
      );
      const aggregator = await startProcess(
        'aggregator',
        spillway([
          'aggregator',
          '--zone',
          'z1',
          '--parent',
          String(controller.listening.grpc),
          '--log-level',
          'warn',
        ]),
      );
      aggregatorAddress = String(aggregator.listening.grpc);
    }
    const bucket = ['- name: edge', `  limit: ${HIGH_LIMIT}`, '  windowSec: 1'];
    const targets: Target[] = [];
    for (const id of cases) {
      if (id === 'upstream') {
        targets.push({
          name: id,
          pid: upstream.child.pid!,
          url: `http://${upstreamAddress}/`,
          ops: undefined,
          child: undefined,
          profDir: undefined,
        });
        continue;
      }
      const rules =
        id === 'bare'
          ? proxyRules(upstreamAddress, ['kind: local'], [])
          : id === 'local'
            ? proxyRules(upstreamAddress, ['kind: local'], bucket)
            : proxyRules(
                upstreamAddress,
                ['kind: global', `aggregators: ["${aggregatorAddress}"]`, 'zone: z1'],
                bucket,
              );
      const rulesPath = join(dir, `${id}.yaml`);
      writeFileSync(rulesPath, rules);
      for (const tree of trees) {
        const name = `${tree.label}${id}`;
        const caseProfDir = profDir === undefined ? undefined : join(profDir, name.replace(':', '-'));
        if (caseProfDir !== undefined) mkdirSync(caseProfDir, { recursive: true });
        const nodeFlags = caseProfDir === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${caseProfDir}`];
        const proxy = await startProcess(name, [
          ...proxyNodeFlags,
          ...nodeFlags,
          '--import',
          'tsx',
          join(tree.root, 'src/cli/entry.ts'),
          'proxy',
          '--config',
          rulesPath,
          '--log-level',
          'warn',
          '--listen',
          '127.0.0.1:0',
          '--ops',
          '127.0.0.1:0',
        ]);
        targets.push({
          name,
          pid: proxy.child.pid!,
          url: `http://${String(proxy.listening.proxy)}/`,
          ops: String(proxy.listening.ops),
          child: proxy.child,
          profDir: caseProfDir,
        });
      }
    }
    // Warm up at full speed, then at the fixed rate (the first fixed-rate run after a full-speed
    // one still pays for optimizing code paths that only a slower rate exercises).
    for (const target of targets) {
      await load(target.url, connections, warmupSec, 0);
      await load(target.url, connections, warmupSec, rate);
    }
    for (let round = 0; round < rounds; round++) {
      for (const target of targets) {
        const gcBefore = target.ops === undefined ? undefined : await scrape(target.ops);
        const fixed = await measure(target.pid, target.url, connections, durationSec, rate);
        const gc =
          gcBefore === undefined
            ? undefined
            : gcPauses(gcBefore, await scrape(target.ops!), fixed.durationSec);
        const max = await measure(target.pid, target.url, connections, maxDurationSec, 0);
        const row = {
          case: target.name,
          round,
          fixedCpuUsPerReq: Math.round(fixed.cpuUsPerRequest),
          fixedReqPerSec: Math.round(fixed.requests / fixed.durationSec),
          fixedP50Ms: fixed.p50Ms,
          fixedP99Ms: fixed.p99Ms,
          gcPerSec: gc?.perSecond,
          gcPausedMsPerSec: gc?.pausedMsPerSecond,
          gcOver5msPerMin: gc?.over5msPerMinute,
          gcByKind: gc?.byKind,
          maxCpuUsPerReq: Math.round(max.cpuUsPerRequest),
          maxReqPerSec: Math.round(max.requests / max.durationSec),
          non2xx: fixed.other + max.other,
          errors: fixed.errors + max.errors,
          load1: os.loadavg()[0]!.toFixed(2),
        };
        process.stdout.write(`${JSON.stringify(row)}\n`);
        const summary = summaries.get(target.name) ?? {
          gc: [],
          fixedCpuUsPerReq: [],
          maxCpuUsPerReq: [],
          maxReqPerSec: [],
        };
        if (gc !== undefined) summary.gc.push(gc);
        summary.fixedCpuUsPerReq.push(row.fixedCpuUsPerReq);
        summary.maxCpuUsPerReq.push(row.maxCpuUsPerReq);
        summary.maxReqPerSec.push(row.maxReqPerSec);
        summaries.set(target.name, summary);
      }
    }
    process.stdout.write(
      "\nmedians over rounds (GC: the proxy's request thread during the fixed-rate run):\n| case | CPU µs/req at fixed rate | CPU µs/req at max | max req/s | GC pauses/s | ms paused/s | pauses > 5 ms per min |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (const [name, s] of summaries) {
      const gc = (pick: (pauses: GcPauses) => number, digits: number) =>
        s.gc.length === 0 ? '' : median(s.gc.map(pick)).toFixed(digits);
      process.stdout.write(
        `| ${name} | ${Math.round(median(s.fixedCpuUsPerReq))} | ${Math.round(median(s.maxCpuUsPerReq))} | ${Math.round(median(s.maxReqPerSec))} | ${gc((p) => p.perSecond, 2)} | ${gc((p) => p.pausedMsPerSecond, 2)} | ${gc((p) => p.over5msPerMinute, 1)} |\n`,
      );
    }
    for (const target of targets) {
      if (target.child === undefined) continue;
      const exited = new Promise((done) => target.child!.once('exit', done));
      target.child.kill('SIGTERM');
      await exited;
      if (target.profDir !== undefined) {
        for (const file of readdirSync(target.profDir).filter((f) => f.endsWith('.cpuprofile'))) {
          process.stdout.write(`\n== ${target.name}: ${join(target.profDir, file)}\n`);
          summarize(join(target.profDir, file), Number(values.top));
        }
      }
    }
  } finally {
    for (const child of children) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    rmSync(dir, { recursive: true, force: true });
  }
  const loadEnd = os.loadavg();
  process.stdout.write(
    `load average ${loadStart.map((l) => l.toFixed(2)).join(' / ')} at the start, ${loadEnd
      .map((l) => l.toFixed(2))
      .join(' / ')} at the end\n`,
  );
}

/**
 * Garbage collection pauses of the proxy's request thread between two scrapes of its /metrics
 * (prom-client's spillway_nodejs_gc_duration_seconds, buckets GC_PAUSE_BUCKETS_S in
 * src/ops/metrics.ts; every kind: scavenges, mark-compact, incremental steps). Each pause stops the
 * event loop: requests arriving during it wait.
 */
interface GcPauses {
  perSecond: number;
  pausedMsPerSecond: number;
  over5msPerMinute: number;
  /** By kind (minor: scavenges; major: mark-compact; incremental: marking steps): count/s and ms/s. */
  byKind: Record<string, { perSecond: number; pausedMsPerSecond: number }>;
}

function gcPauses(before: Map<string, number>, after: Map<string, number>, seconds: number): GcPauses {
  const name = 'spillway_nodejs_gc_duration_seconds';
  const kinds: Record<string, { count: number; sumS: number }> = {};
  let atMost5ms = 0;
  for (const [key, value] of after) {
    if (!key.startsWith(name)) continue;
    const delta = value - (before.get(key) ?? 0);
    const kind = /kind="([^"]+)"/.exec(key)?.[1] ?? 'unknown';
    const entry = kinds[kind] ?? { count: 0, sumS: 0 };
    kinds[kind] = entry;
    if (key.startsWith(`${name}_count`)) entry.count += delta;
    else if (key.startsWith(`${name}_sum`)) entry.sumS += delta;
    else if (key.startsWith(`${name}_bucket`) && key.includes('le="0.005"')) atMost5ms += delta;
  }
  const all = Object.values(kinds);
  const count = all.reduce((total, k) => total + k.count, 0);
  const sumS = all.reduce((total, k) => total + k.sumS, 0);
  return {
    perSecond: count / seconds,
    pausedMsPerSecond: (sumS * 1000) / seconds,
    over5msPerMinute: ((count - atMost5ms) * 60) / seconds,
    byKind: Object.fromEntries(
      Object.entries(kinds).map(([kind, k]) => [
        kind,
        { perSecond: k.count / seconds, pausedMsPerSecond: (k.sumS * 1000) / seconds },
      ]),
    ),
  };
}

// ---------------------------------------------------------------------------------------------
// Profile summary

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

/** Self time per function, and per area (this project, undici, node internals, GC and idle). */
function summarize(file: string, top: number): void {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const selfUs = new Map<number, number>();
  for (let i = 0; i < profile.samples.length; i++) {
    const id = profile.samples[i]!;
    selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
  }
  const byFunction = new Map<string, number>();
  const byArea = new Map<string, number>();
  let total = 0;
  for (const [id, us] of selfUs) {
    const frame = byId.get(id)!.callFrame;
    const url = frame.url.replace(`file://${ROOT}`, '');
    const name = `${frame.functionName || '(anonymous)'} ${url}:${frame.lineNumber + 1}`;
    byFunction.set(name, (byFunction.get(name) ?? 0) + us);
    const area =
      frame.functionName === '(idle)'
        ? 'idle'
        : frame.functionName === '(garbage collector)'
          ? 'gc'
          : url.includes('node_modules/undici')
            ? 'undici'
            : url.includes('node_modules/prom-client')
              ? 'prom-client'
              : url.includes('node_modules/')
                ? 'other deps'
                : url.startsWith('src/')
                  ? 'spillway src'
                  : url.startsWith('node:')
                    ? 'node internals'
                    : 'native/program';
    byArea.set(area, (byArea.get(area) ?? 0) + us);
    total += us;
  }
  const busy = total - (byArea.get('idle') ?? 0);
  const pct = (us: number) => `${((100 * us) / busy).toFixed(1)}%`.padStart(6);
  process.stdout.write(`busy ${(busy / 1e6).toFixed(2)} s of ${(total / 1e6).toFixed(2)} s sampled\n`);
  for (const [area, us] of [...byArea].sort((a, b) => b[1] - a[1])) {
    if (area !== 'idle') process.stdout.write(`${pct(us)}  ${area}\n`);
  }
  process.stdout.write('\n');
  const sorted = [...byFunction].filter(([name]) => !name.startsWith('(idle)')).sort((a, b) => b[1] - a[1]);
  for (const [name, us] of sorted.slice(0, top)) process.stdout.write(`${pct(us)}  ${name}\n`);
}

const [role, ...rest] = process.argv.slice(2);
if (role === 'upstream') await runOkUpstream();
else if (role === 'loadgen') await runLoadgen(rest);
else if (role === 'summarize') {
  const { values, positionals } = parseArgs({
    args: rest,
    allowPositionals: true,
    options: { top: { type: 'string', default: '40' } },
  });
  for (const file of positionals) summarize(file, Number(values.top));
} else await main(process.argv.slice(2));
