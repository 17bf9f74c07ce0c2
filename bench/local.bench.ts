// Local limiters per decision, side by side with what users would write or install instead: a
// naive token bucket that reads the clock on every call, and rate-limiter-flexible's
// RateLimiterMemory. Also measures heap allocation per call (the hot path must allocate nothing).
//
// Run: node --import tsx --expose-gc bench/local.bench.ts
// Env: BENCH_CALLS (default 10,000,000 per round), BENCH_ROUNDS (default 7),
//      BENCH_RLM_CALLS (default 2,000,000 per round), BENCH_RLM_ROUNDS (default 5);
//      BENCH_SMOKE=1: a few thousand calls per case, nothing written (bench/smoke.ts).
import { createRequire } from 'node:module';
import os from 'node:os';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { createGcra } from '../src/local/gcra.js';
import { createKeyedGcra } from '../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../src/local/keyed-token-bucket.js';
import { createTokenBucket } from '../src/local/token-bucket.js';
import { createDecisionHarness, type DecisionCaseResult } from './decision-harness.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, SMOKE, writeResultsFile } from './smoke.js';

const CALLS = benchSetting('BENCH_CALLS', 10_000_000, 20_000);
const ROUNDS = benchSetting('BENCH_ROUNDS', 7, 1);
const RLM_CALLS = benchSetting('BENCH_RLM_CALLS', 2_000_000, 2_000);
const RLM_ROUNDS = benchSetting('BENCH_RLM_ROUNDS', 5, 1);
/**
 * Timed loops run in chunks with a 1 ms pause between them (not timed), so the coarse clock ticks
 * and the limiters see time pass as in a server, where each event-loop turn decides a few calls.
 */
const CHUNK = 250_000;
const ALLOCATION_PROBE_CALLS = SMOKE ? 1_000 : 100_000;
const TARGET_NS = 30;
const TARGET_SPEEDUP = 10;

// Every limiter admits everything: the timed path is the full admit path (refill, compare, store).
const CAPACITY = 1e12;
const REFILL_PER_SEC = 1e12;

/**
 * The baseline the issue names: a plain bucket that reads the clock on every call. Its fields are
 * initialised as doubles like Spillway's, so the comparison isolates the clock read (a field that
 * first holds `undefined` would box every write and make the baseline look worse than it is).
 */
class NaiveDateNowBucket {
  private readonly capacity: number = Number.NaN;
  private readonly refillPerSec: number = Number.NaN;
  private tokens = Number.NaN;
  private lastMs = Number.NaN;
  constructor(capacity: number, refillPerSec: number) {
    this.capacity = capacity;
    this.refillPerSec = refillPerSec;
    this.tokens = capacity;
    this.lastMs = Date.now();
  }
  tryTake(cost = 1): boolean {
    const nowMs = Date.now();
    this.tokens = Math.min(this.capacity, this.tokens + ((nowMs - this.lastMs) * this.refillPerSec) / 1000);
    this.lastMs = nowMs;
    if (this.tokens < cost) return false;
    this.tokens -= cost;
    return true;
  }
}

/** The same with the monotonic clock, which Spillway's systemClock uses. */
class NaivePerformanceNowBucket {
  private readonly capacity: number = Number.NaN;
  private readonly refillPerSec: number = Number.NaN;
  private tokens = Number.NaN;
  private lastMs = Number.NaN;
  constructor(capacity: number, refillPerSec: number) {
    this.capacity = capacity;
    this.refillPerSec = refillPerSec;
    this.tokens = capacity;
    this.lastMs = performance.now();
  }
  tryTake(cost = 1): boolean {
    const nowMs = performance.now();
    this.tokens = Math.min(this.capacity, this.tokens + ((nowMs - this.lastMs) * this.refillPerSec) / 1000);
    this.lastMs = nowMs;
    if (this.tokens < cost) return false;
    this.tokens -= cost;
    return true;
  }
}

const sink = { admitted: 0, floor: 0 };

const tokenBucket = createTokenBucket({ capacity: CAPACITY, refillPerSec: REFILL_PER_SEC });
const keyedTokenBucket = createKeyedTokenBucket({ capacity: CAPACITY, refillPerSec: REFILL_PER_SEC });
const keyedTokenBucketManyKeys = createKeyedTokenBucket({ capacity: CAPACITY, refillPerSec: REFILL_PER_SEC });
const gcra = createGcra({ limit: REFILL_PER_SEC, periodMs: 1_000, burst: CAPACITY });
const keyedGcra = createKeyedGcra({ limit: REFILL_PER_SEC, periodMs: 1_000, burst: CAPACITY });
const naiveDateNow = new NaiveDateNowBucket(CAPACITY, REFILL_PER_SEC);
const naivePerformanceNow = new NaivePerformanceNowBucket(CAPACITY, REFILL_PER_SEC);
const rateLimiterMemory = new RateLimiterMemory({ points: CAPACITY, duration: 1 });

const HOT_KEY = 'api:caller=acme';
const MANY_KEYS = Array.from({ length: 1_000 }, (_, i) => `api:caller=tenant-${i}`);
keyedTokenBucket.tryTake(HOT_KEY);
keyedGcra.tryTake(HOT_KEY);
for (const key of MANY_KEYS) keyedTokenBucketManyKeys.tryTake(key);

// One loop function per case, so each call site stays monomorphic and is optimised on its own.
const loops = {
  tokenBucket(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (tokenBucket.tryTake()) admitted++;
    sink.admitted += admitted;
  },
  keyedTokenBucket(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (keyedTokenBucket.tryTake(HOT_KEY)) admitted++;
    sink.admitted += admitted;
  },
  keyedTokenBucketManyKeys(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (keyedTokenBucketManyKeys.tryTake(MANY_KEYS[i % 1_000]!)) admitted++;
    sink.admitted += admitted;
  },
  gcra(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (gcra.tryTake()) admitted++;
    sink.admitted += admitted;
  },
  keyedGcra(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (keyedGcra.tryTake(HOT_KEY)) admitted++;
    sink.admitted += admitted;
  },
  naiveDateNow(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (naiveDateNow.tryTake()) admitted++;
    sink.admitted += admitted;
  },
  naivePerformanceNow(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (naivePerformanceNow.tryTake()) admitted++;
    sink.admitted += admitted;
  },
  floor(calls: number): void {
    for (let i = 0; i < calls; i++) sink.floor++;
  },
};

type SyncCase = keyof typeof loops;

type CaseResult = DecisionCaseResult;

const harness = createDecisionHarness({
  calls: CALLS,
  rounds: ROUNDS,
  chunk: CHUNK,
  pauseMs: 1,
  allocationProbeCalls: ALLOCATION_PROBE_CALLS,
});

const measureSync = (id: SyncCase, label: string, withAllocation: boolean): Promise<CaseResult> =>
  harness.measureSync(id, label, loops[id], withAllocation);

async function rateLimiterMemoryLoop(calls: number): Promise<void> {
  let admitted = 0;
  for (let i = 0; i < calls; i++) {
    await rateLimiterMemory.consume(HOT_KEY);
    admitted++;
  }
  sink.admitted += admitted;
}

async function measureRateLimiterMemory(): Promise<CaseResult> {
  const { heapDeltaBytes, ...result } = await harness.measureAsync(
    'rateLimiterMemory',
    '(e) rate-limiter-flexible RateLimiterMemory.consume(key), awaited one by one',
    rateLimiterMemoryLoop,
    RLM_CALLS,
    RLM_ROUNDS,
    Math.min(RLM_CALLS, 500_000),
  );
  return {
    ...result,
    note: `promise-based: each decision allocates a promise and a RateLimiterRes; heap moved ${(heapDeltaBytes / 1e6).toFixed(1)} MB net over ${RLM_CALLS.toLocaleString('en-US')} calls with ${result.gcsDuringRun} GCs`,
  };
}

const startedAt = new Date();
const loadBefore = os.loadavg();
const results: CaseResult[] = [];
results.push(await measureSync('floor', '(f) floor: one counter increment per iteration', false));
results.push(await measureSync('tokenBucket', '(a) Spillway token bucket `tryTake()`', true));
results.push(
  await measureSync('keyedTokenBucket', '(b) Spillway keyed token bucket `tryTake(key)`, one key', true),
);
results.push(
  await measureSync(
    'keyedTokenBucketManyKeys',
    '(b2) Spillway keyed token bucket `tryTake(key)`, 1,000 keys',
    true,
  ),
);
results.push(await measureSync('gcra', '(c) Spillway GCRA `tryTake()`', true));
results.push(await measureSync('keyedGcra', '(c2) Spillway keyed GCRA `tryTake(key)`, one key', true));
results.push(await measureSync('naiveDateNow', '(d) naive token bucket, `Date.now()` every call', true));
results.push(
  await measureSync('naivePerformanceNow', '(d2) naive token bucket, `performance.now()` every call', true),
);
results.push(await measureRateLimiterMemory());
const loadAfter = os.loadavg();

const byId = new Map(results.map((r) => [r.id, r]));
const ns = (id: string): number => byId.get(id)!.nsPerCall;
const ratios = {
  tokenBucketVsNaiveDateNow: ns('naiveDateNow') / ns('tokenBucket'),
  tokenBucketVsNaivePerformanceNow: ns('naivePerformanceNow') / ns('tokenBucket'),
  tokenBucketVsRateLimiterMemory: ns('rateLimiterMemory') / ns('tokenBucket'),
  keyedTokenBucketVsRateLimiterMemory: ns('rateLimiterMemory') / ns('keyedTokenBucket'),
  gcraVsRateLimiterMemory: ns('rateLimiterMemory') / ns('gcra'),
};
const zeroAllocation = [
  'tokenBucket',
  'keyedTokenBucket',
  'keyedTokenBucketManyKeys',
  'gcra',
  'keyedGcra',
].every((id) => byId.get(id)!.gcsDuringRun === 0);
const targets = {
  tokenBucketAtMost30Ns: ns('tokenBucket') <= TARGET_NS,
  keyedTokenBucketAtMost30Ns: ns('keyedTokenBucket') <= TARGET_NS,
  gcraAtMost30Ns: ns('gcra') <= TARGET_NS,
  tokenBucket10xRateLimiterMemory: ratios.tokenBucketVsRateLimiterMemory >= TARGET_SPEEDUP,
  keyedTokenBucket10xRateLimiterMemory: ratios.keyedTokenBucketVsRateLimiterMemory >= TARGET_SPEEDUP,
  zeroAllocationOnHotPaths: zeroAllocation,
};

const cpus = os.cpus();
const host = {
  cpu: cpus[0]?.model ?? 'unknown',
  cores: cpus.length,
  os: `${os.type()} ${os.release()} ${os.arch()}`,
  node: process.version,
  v8: process.versions.v8,
  rateLimiterFlexible: createRequire(import.meta.url)('rate-limiter-flexible/package.json').version as string,
  loadAverage1mBefore: loadBefore[0] ?? 0,
  loadAverage1mAfter: loadAfter[0] ?? 0,
};
const command = 'node --import tsx --expose-gc bench/local.bench.ts';

const fmt = (value: number, digits = 2): string =>
  value.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
const pass = (ok: boolean): string => (ok ? 'pass' : '**FAIL**');
const rows = results.map(
  (r) =>
    `| ${r.label} | ${fmt(r.nsPerCall)} | ${fmt(r.minNs)}–${fmt(r.maxNs)} | ${fmt(r.cpuNsPerCall)} | ${r.callsPerRound.toLocaleString('en-US')} × ${r.rounds} | ${
      r.bytesPerCall === null ? '—' : fmt(r.bytesPerCall)
    } | ${r.gcsDuringRun === null ? '—' : r.gcsDuringRun} |`,
);

const markdown = `# Local limiters: nanoseconds per decision

${startedAt.toISOString()} · Node ${host.node} (V8 ${host.v8}) · ${host.os} · ${host.cpu} ×${host.cores} · load average ${fmt(
  host.loadAverage1mBefore,
)} → ${fmt(host.loadAverage1mAfter)}

Reproduce: \`${reproduce(command)}\`
(median of ${ROUNDS} rounds of ${CALLS.toLocaleString('en-US')} calls after warmup; RateLimiterMemory:
${RLM_ROUNDS} rounds of ${RLM_CALLS.toLocaleString('en-US')} calls; rate-limiter-flexible ${host.rateLimiterFlexible}).

Every limiter is configured so each call is admitted (the full admit path: refill, compare, store).
Timed loops run in chunks of ${CHUNK.toLocaleString('en-US')} calls with a 1 ms pause between chunks, so the
coarse clock ticks as it would between event-loop turns; the naive buckets read the clock on every
call. Within one chunk Spillway's limiters see no time pass and skip the refill arithmetic, as every
call within the same millisecond does in production; the refill path itself is exercised on every
call by test/local/hot-path-allocation.test.ts. RateLimiterMemory only has a promise API: its figure is one awaited \`consume()\` after another.

| case | ns/decision (median wall) | min–max | CPU ns/decision (median) | calls × rounds | bytes/call | GCs during ${CALLS.toLocaleString(
  'en-US',
)} calls |
|---|---:|---:|---:|---:|---:|---:|
${rows.join('\n')}

Targets are judged on the median wall time. CPU ns is process CPU time per decision: on a busy
machine it is less inflated by preemption than wall time (it also counts V8's helper threads).

bytes/call: growth of the V8 heap over ${ALLOCATION_PROBE_CALLS.toLocaleString('en-US')} calls right after a full GC.
GCs: garbage collections observed (PerformanceObserver 'gc') during ${CALLS.toLocaleString('en-US')} back-to-back
calls; even 8 bytes a call would fill the young generation many times over, so 0 means the path allocates nothing.
(Node 20's \`v8.getHeapStatistics()\` has no \`total_allocated_bytes\`; these two probes stand in for it.)
${byId.get('rateLimiterMemory')!.note ? `\nRateLimiterMemory: ${byId.get('rateLimiterMemory')!.note}.\n` : ''}
## Ratios

| comparison | speedup |
|---|---:|
| token bucket vs naive (\`Date.now()\`) | ${fmt(ratios.tokenBucketVsNaiveDateNow)}x |
| token bucket vs naive (\`performance.now()\`) | ${fmt(ratios.tokenBucketVsNaivePerformanceNow)}x |
| token bucket vs RateLimiterMemory | ${fmt(ratios.tokenBucketVsRateLimiterMemory)}x |
| keyed token bucket (one key) vs RateLimiterMemory (one key) | ${fmt(ratios.keyedTokenBucketVsRateLimiterMemory)}x |
| GCRA vs RateLimiterMemory | ${fmt(ratios.gcraVsRateLimiterMemory)}x |

## Targets

| target | result |
|---|---|
| token bucket ≤ ${TARGET_NS} ns/decision | ${pass(targets.tokenBucketAtMost30Ns)} (${fmt(ns('tokenBucket'))} ns) |
| keyed token bucket ≤ ${TARGET_NS} ns/decision | ${pass(targets.keyedTokenBucketAtMost30Ns)} (${fmt(ns('keyedTokenBucket'))} ns) |
| GCRA ≤ ${TARGET_NS} ns/decision | ${pass(targets.gcraAtMost30Ns)} (${fmt(ns('gcra'))} ns) |
| token bucket ≥ ${TARGET_SPEEDUP}x RateLimiterMemory | ${pass(targets.tokenBucket10xRateLimiterMemory)} (${fmt(ratios.tokenBucketVsRateLimiterMemory)}x) |
| keyed token bucket ≥ ${TARGET_SPEEDUP}x RateLimiterMemory | ${pass(targets.keyedTokenBucket10xRateLimiterMemory)} (${fmt(ratios.keyedTokenBucketVsRateLimiterMemory)}x) |
| no allocation on the \`tryTake\` paths (0 GCs) | ${pass(targets.zeroAllocationOnHotPaths)} |
`;

writeResultsFile('bench/results/local.md', markdown);
writeResultsFile(
  'bench/results/local.json',
  `${JSON.stringify({ date: startedAt.toISOString(), command, commit: sourceCommit(), host, results, ratios, targets }, null, 2)}\n`,
);
