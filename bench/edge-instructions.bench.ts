// What a rate limit decision adds to a proxied request, in CPU instructions: counts that do not
// move with the machine's load, unlike the latency figures of bench/edge.bench.ts (a VM whose tail
// moves by milliseconds from run to run; see that file's A/A control and machine stalls).
//
// Each `spillway proxy` runs under valgrind's callgrind, which counts every instruction the process
// executes (all its threads: JIT-compiled code, the garbage collector, libuv). The load generator,
// upstream, Redis, controller and aggregator run natively.
//
// Paired in one process: each proxy's rules put one bucket on `/limited/…` and none on `/free/…`, so
// the same process, in the same JIT and heap state, serves requests decided by its backend and
// requests that only forward. Windows alternate (free, limited, limited, free, …), counters zeroed
// before and dumped after each; what a decision adds per request is the difference of a pair of
// adjacent windows, median over pairs. Background work (timers, the global backend's reports every
// second) is taken out of each window at the idle rate measured before and after the pairs.
//
// Needs: valgrind, callgrind_control, redis-server
// Run: node --import tsx bench/edge-instructions.bench.ts (needs valgrind; builds dist/ first).
// Env: BENCH_REQUESTS (2000 per window), BENCH_PAIRS (6), BENCH_CASES (ids, comma-separated; default all). Writes bench/results/edge-instructions.{md,json}.
//      BENCH_SMOKE=1: one pair of 20-request windows per case; only the first case's proxy runs
//      under callgrind, counting from its first window (valgrind starts a node four times faster
//      so), the others natively, uncounted (a node under valgrind costs ~10 s of CPU, their rules
//      and paths are what differs); dist/ as it is when built (npm test builds it first); nothing
//      written (bench/smoke.ts).
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readListening } from '../test/integration/spillway-process.js';
import { proxyRules, runOkUpstream } from './http-probes.js';
import { median } from './paired-stats.js';
import { benchEnv, sourceCommit } from './provenance.js';
import { benchSetting, inTurn, SMOKE, smokeCheck, writeResultsFile } from './smoke.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SELF = fileURLToPath(import.meta.url);
const COMMAND = 'node --import tsx bench/edge-instructions.bench.ts';
const REQUESTS = benchSetting('BENCH_REQUESTS', 2000, 20);
const PAIRS = benchSetting('BENCH_PAIRS', 6, 1);
const IDLE_S = SMOKE ? 0.2 : 5;
/** Per path, before anything is counted: until the hot code is optimized (single-threaded V8 compiles on the main thread). */
const WARMUP_REQUESTS = SMOKE ? 20 : 8000;
/** Requests in flight at once: enough to keep the (slow, instrumented) proxy busy, few enough that nothing queues long. */
const CONCURRENCY = 4;
const HIGH_LIMIT = 1_000_000_000;
const ENTRY = join(ROOT, 'dist/src/cli/entry.js');
/** Every spillway process here: free loopback ports (announced on its `listening` line), warnings only. */
const QUIET_LOOPBACK = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--log-level', 'warn'];

interface CaseSpec {
  id: string;
  label: string;
  backend: (env: Env) => string[];
  /** The bucket's key template (default: one fixed key). */
  key?: string;
  windowSec: number;
}

interface Env {
  upstream: string;
  aggregator: string;
  redis: string;
}

const CASES: CaseSpec[] = [
  {
    id: 'global',
    label: 'global backend, one fixed-key bucket',
    backend: ({ aggregator }) => ['kind: global', `aggregators: ["${aggregator}"]`, 'zone: z1'],
    windowSec: 1,
  },
  {
    id: 'global-client',
    label: 'global backend, bucket keyed by client address',
    backend: ({ aggregator }) => ['kind: global', `aggregators: ["${aggregator}"]`, 'zone: z1'],
    key: 'edge:{client}',
    windowSec: 1,
  },
  {
    id: 'local',
    label: 'local backend (token bucket), keyed by client address',
    backend: () => ['kind: local'],
    key: 'edge:{client}',
    windowSec: 1,
  },
  {
    id: 'redis',
    label: 'Redis backend, sliding window keyed by client address (loopback)',
    backend: ({ redis }) => [
      'kind: redis',
      `url: redis://${redis}`,
      'algorithm: sliding-counter',
      'timeoutMs: 100',
    ],
    key: 'edge:{client}',
    windowSec: 60,
  },
];

function rulesFor(spec: CaseSpec, env: Env): string {
  return proxyRules(env.upstream, spec.backend(env), [
    '- name: edge',
    ...(spec.key === undefined ? [] : [`  key: "${spec.key}"`]),
    `  limit: ${HIGH_LIMIT}`,
    `  windowSec: ${spec.windowSec}`,
    '  match:',
    '    prefix: /limited',
  ]);
}

interface Window {
  path: 'free' | 'limited';
  instructions: number;
  seconds: number;
  failures: number;
}

const children: ChildProcess[] = [];

async function startNative(name: string, args: string[]): Promise<Record<string, unknown>> {
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '' },
  });
  children.push(child);
  return readListening(name, child, [], 60_000);
}

/**
 * A proxy under callgrind. valgrind execs the tool in place: the child's pid is the counted process.
 * Uncounted (a smoke run's cases after the first), the proxy runs natively and outFile is undefined.
 */
async function startCounted(
  id: string,
  rulesPath: string,
  outDir: string,
  counting: boolean,
): Promise<{ child: ChildProcess; pid: number; origin: string; outFile: string | undefined }> {
  const outFile = counting ? join(outDir, `${id}.callgrind`) : undefined;
  const proxyArgs = [ENTRY, 'proxy', '--config', rulesPath, ...QUIET_LOOPBACK];
  const valgrindArgs = [
    '--tool=callgrind',
    `--callgrind-out-file=${outFile}`,
    // Counting is switched on before the first counted window (countFromNow).
    ...(SMOKE ? ['--instr-atstart=no'] : []),
    // Totals are all this reads: no per-instruction or per-line data.
    '--dump-instr=no',
    '--dump-line=no',
    process.execPath,
    // No V8 helper threads (concurrent compilation, parallel GC): valgrind runs one thread at a
    // time, so a thread spinning while it waits for another burns instructions in proportion to
    // wall time, and the counts would move with the machine's load.
    '--single-threaded',
    ...proxyArgs,
  ];
  const child = spawn(counting ? 'valgrind' : process.execPath, counting ? valgrindArgs : proxyArgs, {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '' },
  });
  children.push(child);
  const listening = await readListening(id, child, [], 300_000);
  const address = listening.proxy;
  if (typeof address !== 'string') throw new Error(`${id}: no proxy address in ${JSON.stringify(listening)}`);
  return { child, pid: child.pid!, origin: `http://${address}`, outFile };
}

function callgrindControl(flags: '-z' | '-d' | '-i on', pid: number): void {
  const r = spawnSync('callgrind_control', [...flags.split(' '), String(pid)], {
    encoding: 'utf8',
    timeout: 120_000,
  });
  if (r.status !== 0) throw new Error(`callgrind_control ${flags} ${pid} failed: ${r.stderr || r.stdout}`);
}

/** The instruction total of dump number `n` of `outFile` (callgrind writes `<file>.<n>` per dump). */
function dumpTotal(outFile: string, n: number): number {
  const path = `${outFile}.${n}`;
  for (let attempt = 0; attempt < 100 && !existsSync(path); attempt++) spawnSync('sleep', ['0.1']);
  const match = /^(?:totals|summary): (\d+)/m.exec(readFileSync(path, 'utf8'));
  if (!match) throw new Error(`no totals line in ${path}`);
  rmSync(path);
  return Number(match[1]);
}

/** Sends `count` GETs to `origin + path`, `CONCURRENCY` at a time on keep-alive connections; returns the failures. */
async function send(origin: string, path: string, count: number): Promise<number> {
  const { Pool } = await import('undici');
  const pool = new Pool(origin, { connections: CONCURRENCY, pipelining: 1 });
  let sent = 0;
  let failures = 0;
  const worker = async () => {
    while (sent < count) {
      sent++;
      try {
        const response = await pool.request({ path, method: 'GET' });
        await response.body.dump();
        if (response.statusCode !== 200) failures++;
      } catch {
        failures++;
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  await pool.close();
  return failures;
}

interface CaseResult {
  windows: Window[];
  idlePerSecond: number;
}

/** `counting` false: a smoke run's uncounted case (startCounted); its instructions are NaN. */
async function measureCase(spec: CaseSpec, env: Env, dir: string, counting: boolean): Promise<CaseResult> {
  const rulesPath = join(dir, `${spec.id}.yaml`);
  writeFileSync(rulesPath, rulesFor(spec, env));
  const proxy = await startCounted(spec.id, rulesPath, dir, counting);
  const { outFile } = proxy;
  let dumps = 0;
  const counted = async <T>(
    work: () => Promise<T>,
  ): Promise<{ value: T; instructions: number; seconds: number }> => {
    if (outFile !== undefined) callgrindControl('-z', proxy.pid);
    const started = performance.now();
    const value = await work();
    if (outFile !== undefined) callgrindControl('-d', proxy.pid);
    const seconds = (performance.now() - started) / 1000;
    return { value, instructions: outFile === undefined ? Number.NaN : dumpTotal(outFile, ++dumps), seconds };
  };
  try {
    await send(proxy.origin, '/free/warmup', WARMUP_REQUESTS);
    await send(proxy.origin, '/limited/warmup', WARMUP_REQUESTS);
    if (SMOKE && outFile !== undefined) callgrindControl('-i on', proxy.pid);
    const idle = () => counted(() => new Promise((resolve) => setTimeout(resolve, IDLE_S * 1000)));
    const idleBefore = await idle();
    const windows: Window[] = [];
    // free, limited | limited, free | free, limited …: each pair's order alternates, so a slow drift
    // (the heap growing, code tiering up) does not always favour the same side.
    for (let pair = 0; pair < PAIRS; pair++) {
      const order: Window['path'][] = pair % 2 === 0 ? ['free', 'limited'] : ['limited', 'free'];
      for (const path of order) {
        const w = await counted(() => send(proxy.origin, `/${path}/x`, REQUESTS));
        windows.push({ path, instructions: w.instructions, seconds: w.seconds, failures: w.value });
      }
      const [a, b] = windows.slice(-2) as [Window, Window];
      const free = a.path === 'free' ? a : b;
      const limited = a.path === 'free' ? b : a;
      process.stdout.write(
        `${spec.id} pair ${pair + 1}: free ${fmt(free.instructions / REQUESTS)}, limited ${fmt(limited.instructions / REQUESTS)} instructions/request (background included), windows ${free.seconds.toFixed(1)} / ${limited.seconds.toFixed(1)} s\n`,
      );
    }
    const idleAfter = await idle();
    return {
      windows,
      idlePerSecond:
        (idleBefore.instructions + idleAfter.instructions) / (idleBefore.seconds + idleAfter.seconds),
    };
  } finally {
    proxy.child.kill('SIGKILL');
    await new Promise((resolve) => proxy.child.once('exit', resolve));
  }
}

const fmt = (n: number) => Math.round(n).toLocaleString('en-US');
const pct = (n: number) => `${n >= 0 ? '+' : ''}${(n * 100).toFixed(1)}%`;

async function main(): Promise<void> {
  if (spawnSync('valgrind', ['--version']).status !== 0) {
    console.error('valgrind is not installed (apt-get install -y valgrind); nothing measured');
    process.exit(1);
  }
  // The proxies run from dist/ (tsx under valgrind would count its own work): build what is measured.
  // A smoke run uses dist/ as built: `npm test` builds it first, and rebuilding it here would
  // rewrite files that tests running beside this one load.
  if (!SMOKE || !existsSync(ENTRY)) {
    const build = spawnSync('npm', ['run', 'build'], { cwd: ROOT, stdio: 'inherit' });
    if (build.status !== 0 || !existsSync(ENTRY)) {
      console.error('`npm run build` failed: nothing measured');
      process.exit(1);
    }
  }
  const only = process.env.BENCH_CASES?.split(',').filter((id) => id.length > 0);
  const selected = CASES.filter((c) => only === undefined || only.includes(c.id));
  const { startRedis } = await import('../test/helpers/redis-server.js');
  const dir = mkdtempSync(join(os.tmpdir(), 'spillway-edge-instructions-'));
  const redis = await startRedis();
  const stop = () => {
    for (const child of children)
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  };
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      stop();
      void redis.stop().finally(() => process.exit(130));
    });
  }
  const valgrindVersion = spawnSync('valgrind', ['--version'], { encoding: 'utf8' }).stdout.trim();
  const startedAt = new Date().toISOString();
  const results = new Map<string, CaseResult>();
  try {
    const upstream = await startNative('upstream', ['--import', 'tsx', SELF, 'upstream']);
    const limitsPath = join(dir, 'limits.yaml');
    writeFileSync(
      limitsPath,
      `version: 1\nintervalMs: 1000\nbuckets:\n  - key: edge\n    limitRps: ${HIGH_LIMIT}\n    mode: enforce\n`,
    );
    const tier = (args: string[]) => [ENTRY, ...args, ...QUIET_LOOPBACK];
    const controller = await startNative('controller', tier(['controller', '--config', limitsPath]));
    const aggregator = await startNative(
      'aggregator',
      tier(['aggregator', '--zone', 'z1', '--parent', String(controller.grpc)]),
    );
    const env: Env = {
      upstream: String(upstream.http),
      aggregator: String(aggregator.grpc),
      redis: `127.0.0.1:${redis.port}`,
    };
    await inTurn(selected, async (spec) => {
      results.set(spec.id, await measureCase(spec, env, dir, !SMOKE || spec === selected[0]));
    });
  } finally {
    stop();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  }

  const rows = selected.map((spec) => {
    const { windows, idlePerSecond } = results.get(spec.id)!;
    const pairs: { free: number; limited: number }[] = [];
    for (let i = 0; i + 1 < windows.length; i += 2) {
      const [a, b] = [windows[i]!, windows[i + 1]!];
      const free = a.path === 'free' ? a : b;
      const limited = a.path === 'free' ? b : a;
      // Background (timers, reports) is per second, and a window's length depends on the machine:
      // take it out at the idle rate measured before and after the pairs.
      const perRequest = (w: Window) => (w.instructions - idlePerSecond * w.seconds) / REQUESTS;
      pairs.push({ free: perRequest(free), limited: perRequest(limited) });
    }
    const added = pairs.map((p) => p.limited - p.free);
    const addedShare = pairs.map((p) => p.limited / p.free - 1);
    return {
      id: spec.id,
      label: spec.label,
      free: median(pairs.map((p) => p.free)),
      limited: median(pairs.map((p) => p.limited)),
      added: median(added),
      addedLow: Math.min(...added),
      addedHigh: Math.max(...added),
      addedShare: median(addedShare),
      addedShareLow: Math.min(...addedShare),
      addedShareHigh: Math.max(...addedShare),
      idlePerSecond,
      failures: windows.reduce((sum, w) => sum + w.failures, 0),
      pairs,
    };
  });
  for (const r of rows) {
    smokeCheck(r.failures === 0, `${r.id}: ${r.failures} requests failed`);
    smokeCheck(
      r.id !== selected[0]?.id || results.get(r.id)!.windows.every((w) => w.instructions > 0),
      `${r.id}: a window counted no instructions`,
    );
  }
  const lines = [
    '# Edge cost in instructions: what a decision adds to a proxied request',
    '',
    `${startedAt} · Node ${process.version} · ${valgrindVersion} · ${os.type()} ${os.release()} ${os.arch()}`,
    '',
    `Reproduce: \`git checkout ${sourceCommit(ROOT).split(' ')[0]} && ${benchEnv()}${COMMAND}\` (${PAIRS} pairs of windows per case, ${fmt(REQUESTS)} requests per window; code at ${sourceCommit(ROOT)}).`,
    '',
    'Each `spillway proxy` runs under valgrind (callgrind), which counts every instruction the process',
    'executes in all its threads: JIT-compiled JavaScript, the garbage collector, libuv (not the',
    "kernel's work for its syscalls). Instruction counts do not move with other load on the machine, so",
    'these figures hold on a VM whose latency tail does (bench/results/edge.md: its A/A control and machine stalls).',
    'The load generator, upstream, Redis, controller and aggregator run natively.',
    '',
    'Paired in one process: the rules put one bucket (limit far above the load) on `/limited/…` and',
    'none on `/free/…`, so the same process, in the same JIT and heap state, serves requests its backend',
    `decides and requests it only forwards. After ${fmt(WARMUP_REQUESTS)} warmup requests on each path, windows of`,
    `${fmt(REQUESTS)} requests (${CONCURRENCY} in flight, keep-alive) alternate free/limited, the order flipped every pair;`,
    'counters are zeroed before and dumped after each window. "Added" is the limited window minus the',
    'free one of each pair: median over pairs, range in brackets. Background work (timers, the global',
    "backend's report every second) is taken out of every window at the idle rate (measured for",
    `${IDLE_S} s before and after the pairs, nothing sent) times the window's length; it is shown for scale: at`,
    '1,000 req/s, 1,000,000 instructions/s of background is 1,000 per request.',
    '',
    '| backend | free path, instructions / request | limited path | added by the decision | added, share of the free path | idle, instructions / s | failures |',
    '|---|---:|---:|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${r.label} | ${fmt(r.free)} | ${fmt(r.limited)} | ${fmt(r.added)} [${fmt(r.addedLow)} … ${fmt(r.addedHigh)}] | ${pct(r.addedShare)} [${pct(r.addedShareLow)} … ${pct(r.addedShareHigh)}] | ${fmt(r.idlePerSecond)} | ${r.failures} |`,
    ),
    '',
    'The free path still matches the request against the rules (finding no bucket), so "added" is the',
    'decision itself: bucket key, limiter call, `RateLimit` header fields, counters. For the Redis backend it',
    'is the client side of one EVALSHA round trip; the wait for Redis costs no instructions here but is',
    'latency (bench/results/edge.md), which is what an in-process decision avoids.',
    '',
    'Why the ranges are wide: a full garbage collection of the heap (with one thread, on the main',
    'thread) costs about 100,000 instructions per request of the window it lands in, and comes every',
    'ten thousand requests or so, so one window of a pair in a few gets it. The median over pairs is',
    'the figure; the per-pair windows are in the JSON file.',
    '',
  ];
  const resultsDir = join(ROOT, 'bench/results');
  process.stdout.write(`${lines.join('\n')}\n`);
  writeResultsFile(join(resultsDir, 'edge-instructions.md'), lines.join('\n'));
  writeResultsFile(
    join(resultsDir, 'edge-instructions.json'),
    `${JSON.stringify({ startedAt, command: `${benchEnv()}${COMMAND}`, commit: sourceCommit(ROOT), node: process.version, valgrind: valgrindVersion, requests: REQUESTS, rows }, null, 2)}\n`,
  );
}

if (process.argv[2] === 'upstream') await runOkUpstream();
else await main();
