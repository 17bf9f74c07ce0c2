// The global limiter's data plane per decision: a resolved handle's `allow()`, the by-key form
// over 1,000 keys, shadow mode and the burst guard, next to the bare floor (one random draw and one
// increment) and rate-limiter-flexible's RateLimiterMemory. Also proves the hot path allocates
// nothing (heap growth and GC count over 10M calls) and measures the wire size of a report per bucket.
//
// Run: node --import tsx --expose-gc bench/global.bench.ts
// Env: BENCH_CALLS (default 10,000,000 per round), BENCH_ROUNDS (default 7),
//      BENCH_RLM_CALLS (default 1,000,000 per round), BENCH_RLM_ROUNDS (default 3);
//      BENCH_SMOKE=1: a few thousand calls per case, nothing written (bench/smoke.ts).
import { createRequire } from 'node:module';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { create, toBinary } from '@bufbuild/protobuf';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { ManualClock } from '../src/core/clock.js';
import {
  DirectiveSchema,
  Mode,
  type ReportRequest,
  ReportRequestSchema,
  ReportResponseSchema,
  Tier,
} from '../src/gen/spillway/v1/control_pb.js';
import { createGlobalLimiter, type GlobalLimiter } from '../src/global/index.js';
import { InMemoryNetwork } from '../src/transport/in-memory-network.js';
import { createDecisionHarness, type DecisionCaseResult } from './decision-harness.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, SMOKE, writeResultsFile } from './smoke.js';

const CALLS = benchSetting('BENCH_CALLS', 10_000_000, 20_000);
const ROUNDS = benchSetting('BENCH_ROUNDS', 7, 1);
const RLM_CALLS = benchSetting('BENCH_RLM_CALLS', 1_000_000, 2_000);
const RLM_ROUNDS = benchSetting('BENCH_RLM_ROUNDS', 3, 1);
const CHUNK = 1_000_000;
const ALLOCATION_PROBE_CALLS = SMOKE ? 1_000 : 100_000;
const TARGET_HANDLE_NS = 25;
const TARGET_BY_KEY_NS = 60;
/** The ratio every benchmarked bucket runs at: each call draws, 30% drop (enforce) or would-drop (shadow). */
const DROP_RATIO = 0.3;

const HOT_KEY = 'api:caller=acme';
const MANY_KEYS = Array.from({ length: 1_000 }, (_, i) => `api:caller=tenant-${i}`);

/**
 * A limiter whose buckets all hold a directive (ratio 0.3, a TTL that does not run out in virtual
 * time), delivered through the real reporter over the in-memory network.
 */
async function limiterWithDirectives(
  mode: Mode,
  burstGuard: boolean,
  guardSetup: { realTime?: boolean; warmupCost?: number } = {},
): Promise<GlobalLimiter> {
  const clock = new ManualClock(0);
  const network = new InMemoryNetwork({ scheduler: clock });
  network.listen('agg', (request) =>
    create(ReportResponseSchema, {
      epoch: 1n,
      directives: request.buckets.map((b) =>
        create(DirectiveSchema, {
          bucket: b.bucket,
          dropRatio: DROP_RATIO,
          mode,
          limitRps: 1e15,
          offeredRps: 1,
          epoch: 1n,
          version: 1n,
          ttlMs: 4_000_000_000,
        }),
      ),
    }),
  );
  const limiter = createGlobalLimiter({
    reporterId: 'bench',
    clients: [network.connect('agg')],
    // Without a scheduler the limiter runs on real time and its guard reads the shared coarse
    // clock, as in production; directives still arrive over the manual clock's network.
    ...(guardSetup.realTime ? {} : { scheduler: clock }),
    burstGuard: burstGuard ? {} : false,
  });
  // The guard's allowance is the hot key's rate in the report times (1 - ratio): a warmup cost of
  // 1e12 units makes it 7e11 units a second, so the armed guard's detector never reads the clock
  // nor trips in the loop below; a cost of 1 makes it 0.7, so the detector trips at once.
  limiter.allow(HOT_KEY, guardSetup.warmupCost ?? 1);
  for (const key of MANY_KEYS) limiter.allow(key);
  clock.advance(1_000);
  // A report measures a rate over at least half an interval of the limiter's own clock.
  if (guardSetup.realTime) await sleep(1_000);
  const flushed = limiter.flush();
  for (let i = 0; i < 10; i++) {
    clock.advance(0);
    await sleep(0);
  }
  await flushed;
  const snap = limiter.snapshot();
  const hot = snap.buckets.find((b) => b.key === HOT_KEY)!;
  if (hot.effectiveRatio !== DROP_RATIO || hot.guardArmed !== burstGuard) {
    throw new Error(`bench setup failed: ${JSON.stringify(hot)}`);
  }
  return limiter;
}

const enforce = await limiterWithDirectives(Mode.ENFORCE, false);
const shadow = await limiterWithDirectives(Mode.SHADOW, false);
const guarded = await limiterWithDirectives(Mode.ENFORCE, true, { warmupCost: 1e12 });
const tripped = await limiterWithDirectives(Mode.ENFORCE, true, { realTime: true });
const noDirective = createGlobalLimiter({ reporterId: 'bench', clients: [], scheduler: new ManualClock(0) });
const enforceHandle = enforce.bucket(HOT_KEY);
const shadowHandle = shadow.bucket(HOT_KEY);
const guardedHandle = guarded.bucket(HOT_KEY);
const trippedHandle = tripped.bucket(HOT_KEY);
const openHandle = noDirective.bucket(HOT_KEY);
const rateLimiterMemory = new RateLimiterMemory({ points: 1e12, duration: 1 });

const sink = { admitted: 0, floor: 0 };
/** The by-key floor: what a Map lookup over the same 1,000 keys costs on this machine. */
const floorMap = new Map(MANY_KEYS.map((key) => [key, { key, calls: 0 }]));

// One loop function per case, so each call site stays monomorphic and is optimised on its own.
const loops = {
  floor(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) {
      sink.floor++;
      if (Math.random() >= DROP_RATIO) admitted++;
    }
    sink.admitted += admitted;
  },
  mapFloor(calls: number): void {
    for (let i = 0; i < calls; i++) floorMap.get(MANY_KEYS[i % 1_000]!)!.calls++;
  },
  handle(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (enforceHandle.allow()) admitted++;
    sink.admitted += admitted;
  },
  handleNoDirective(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (openHandle.allow()) admitted++;
    sink.admitted += admitted;
  },
  byKeyOneKey(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (enforce.allow(HOT_KEY)) admitted++;
    sink.admitted += admitted;
  },
  byKeyManyKeys(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (enforce.allow(MANY_KEYS[i % 1_000]!)) admitted++;
    sink.admitted += admitted;
  },
  shadowHandle(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (shadowHandle.allow()) admitted++;
    sink.admitted += admitted;
  },
  guardedHandle(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (guardedHandle.allow()) admitted++;
    sink.admitted += admitted;
  },
  trippedHandle(calls: number): void {
    let admitted = 0;
    for (let i = 0; i < calls; i++) if (trippedHandle.allow()) admitted++;
    sink.admitted += admitted;
  },
};

type SyncCase = keyof typeof loops;

type CaseResult = DecisionCaseResult;

const harness = createDecisionHarness({
  calls: CALLS,
  rounds: ROUNDS,
  chunk: CHUNK,
  pauseMs: 0,
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
    '(r) rate-limiter-flexible RateLimiterMemory `await consume(key)`, one by one',
    rateLimiterMemoryLoop,
    RLM_CALLS,
    RLM_ROUNDS,
    Math.min(RLM_CALLS, 300_000),
  );
  return { ...result, note: `GCs counted over ${RLM_CALLS.toLocaleString('en-US')} calls` };
}

/** Realistic bucket keys: tenants, routes, callers, 14 to 45 bytes. */
function realisticKey(i: number): string {
  switch (i % 4) {
    case 0:
      return `api:caller=tenant-${String(i).padStart(5, '0')}`;
    case 1:
      return `payments:charge:region=eu-west-${i % 3}`;
    case 2:
      return `search:route=/v2/products/${i}`;
    default:
      return `grpc:orders.OrderService/Create:c=${i}`;
  }
}

function wireSizes(): { buckets: number; bytes: number; bytesPerBucket: number; meanKeyBytes: number }[] {
  const out = [];
  for (const n of [1, 10, 100, 1_000, 5_000]) {
    let keyBytes = 0;
    const buckets = Array.from({ length: n }, (_, i) => {
      const bucket = realisticKey(i);
      keyBytes += Buffer.byteLength(bucket);
      // Offered/admitted as a busy bucket reports them for a 1 s window; would-drop 0 as most are.
      const offered = 800 + ((i * 7919) % 4_000);
      return { bucket, offered, admitted: Math.floor(offered * 0.93), wouldDrop: 0 };
    });
    const request: ReportRequest = create(ReportRequestSchema, {
      reporterId: 'api-7f9c6d-2xk4p:4711',
      tier: Tier.HOST,
      zone: 'eu-west-1a',
      region: 'eu-west-1',
      sequence: 123_456n,
      windowStartMs: 1_764_460_800_000n,
      windowEndMs: 1_764_460_801_000n,
      buckets,
      hostCount: 1,
    });
    const bytes = toBinary(ReportRequestSchema, request).length;
    out.push({ buckets: n, bytes, bytesPerBucket: bytes / n, meanKeyBytes: keyBytes / n });
  }
  return out;
}

const startedAt = new Date();
const loadBefore = os.loadavg();
const results: CaseResult[] = [];
results.push(await measureSync('floor', '(f) floor: one `Math.random()` draw + one increment', true));
results.push(
  await measureSync(
    'mapFloor',
    '(m) floor for by-key: `Map.get(key)` + one increment on the value, 1,000 keys',
    false,
  ),
);
results.push(await measureSync('handle', '(a) `handle.allow()`, enforce, ratio 0.3', true));
results.push(
  await measureSync('handleNoDirective', '(a0) `handle.allow()`, no directive (ratio 0, no draw)', true),
);
results.push(await measureSync('byKeyOneKey', '(b) `limiter.allow(key)`, one key, ratio 0.3', true));
results.push(await measureSync('byKeyManyKeys', '(b2) `limiter.allow(key)`, 1,000 keys, ratio 0.3', true));
results.push(await measureSync('shadowHandle', '(c) `handle.allow()`, shadow, ratio 0.3', true));
results.push(
  await measureSync(
    'guardedHandle',
    '(d) `handle.allow()`, enforce + burst guard armed, ratio 0.3 (a busy bucket: its detector reads the clock once per 6.25 ms of allowance, never in this loop)',
    true,
  ),
);
results.push(
  await measureSync(
    'trippedHandle',
    '(d2) `handle.allow()`, burst guard tripped, 0.7 rps allowance, default clock (the shared 1 ms coarse clock): two clock reads a call, the most a guarded call costs',
    true,
  ),
);
results.push(await measureRateLimiterMemory());
const loadAfter = os.loadavg();
const wire = wireSizes();

const byId = new Map(results.map((r) => [r.id, r]));
const ns = (id: string): number => byId.get(id)!.nsPerCall;
const hotPaths = [
  'handle',
  'handleNoDirective',
  'byKeyOneKey',
  'byKeyManyKeys',
  'shadowHandle',
  'guardedHandle',
  'trippedHandle',
];
const targets = {
  handleAtMost25Ns: ns('handle') <= TARGET_HANDLE_NS,
  byKeyManyKeysAtMost60Ns: ns('byKeyManyKeys') <= TARGET_BY_KEY_NS,
  zeroAllocationOnHotPaths: hotPaths.every((id) => byId.get(id)!.gcsDuringRun === 0),
};
const ratios = {
  handleVsRateLimiterMemory: ns('rateLimiterMemory') / ns('handle'),
  byKeyManyKeysVsRateLimiterMemory: ns('rateLimiterMemory') / ns('byKeyManyKeys'),
  handleOverFloorNs: ns('handle') - ns('floor'),
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
const command = 'node --import tsx --expose-gc bench/global.bench.ts';

const fmt = (value: number, digits = 2): string =>
  value.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
const pass = (ok: boolean): string => (ok ? 'pass' : '**FAIL**');
const rows = results.map(
  (r) =>
    `| ${r.label} | ${fmt(r.nsPerCall)} | ${fmt(r.minNs)}–${fmt(r.maxNs)} | ${r.callsPerRound.toLocaleString('en-US')} × ${r.rounds} | ${
      r.bytesPerCall === null ? '—' : fmt(r.bytesPerCall)
    } | ${r.gcsDuringRun === null ? '—' : r.gcsDuringRun} |`,
);
const wireRows = wire.map(
  (w) =>
    `| ${w.buckets.toLocaleString('en-US')} | ${fmt(w.meanKeyBytes, 1)} | ${w.bytes.toLocaleString('en-US')} | ${fmt(w.bytesPerBucket, 1)} |`,
);

const markdown = `# Global limiter data plane: nanoseconds per decision

${startedAt.toISOString()} · Node ${host.node} (V8 ${host.v8}) · ${host.os} · ${host.cpu} ×${host.cores} · load average ${fmt(
  host.loadAverage1mBefore,
)} → ${fmt(host.loadAverage1mAfter)}

Reproduce: \`${reproduce(command)}\`
(median of ${ROUNDS} rounds of ${CALLS.toLocaleString('en-US')} calls after warmup; RateLimiterMemory:
${RLM_ROUNDS} rounds of ${RLM_CALLS.toLocaleString('en-US')} calls; rate-limiter-flexible ${host.rateLimiterFlexible}).

Every bucket holds a directive with drop ratio ${DROP_RATIO} delivered by the real reporter over the in-memory
network, so each decision is the full hot path: cost check, offered bump, one xorshift32 draw
(the bucket's own generator, seeded from the injected RNG) against the ratio, admitted/dropped bump
(shadow: would-drop bump; guard: a counter and, every few units, its detector; tripped: token take). The by-key floor (m) is the least any keyed limiter
pays: a Map lookup and one write to what it found. The floor (f) is what the naive form costs: one
\`Math.random()\` draw and one increment — note its GC column: on this V8 every \`Math.random()\`
result is a fresh heap number, which is why the hot path does not call it. RateLimiterMemory only
has a promise API: its figure is one awaited \`consume()\` after another.

| case | ns/decision (median) | min–max | calls × rounds | bytes/call | GCs during ${CALLS.toLocaleString(
  'en-US',
)} calls |
|---|---:|---:|---:|---:|---:|
${rows.join('\n')}

bytes/call: growth of the V8 heap over ${ALLOCATION_PROBE_CALLS.toLocaleString('en-US')} calls right after a full GC.
GCs: garbage collections observed (PerformanceObserver 'gc') during ${CALLS.toLocaleString('en-US')} back-to-back
calls; even 8 bytes a call would fill the young generation many times over, so 0 means the path allocates nothing.

## Targets

| target | result |
|---|---|
| \`handle.allow()\` ≤ ${TARGET_HANDLE_NS} ns/decision | ${pass(targets.handleAtMost25Ns)} (${fmt(ns('handle'))} ns; floor ${fmt(ns('floor'))} ns) |
| \`limiter.allow(key)\`, 1,000 keys ≤ ${TARGET_BY_KEY_NS} ns/decision | ${pass(targets.byKeyManyKeysAtMost60Ns)} (${fmt(ns('byKeyManyKeys'))} ns; bare \`Map.get\` ${fmt(ns('mapFloor'))} ns) |
| no allocation on any \`allow\` path (0 GCs over ${CALLS.toLocaleString('en-US')} calls) | ${pass(targets.zeroAllocationOnHotPaths)} |

\`handle.allow()\` is ${fmt(ratios.handleVsRateLimiterMemory, 0)}x faster than RateLimiterMemory; \`limiter.allow(key)\` over
1,000 keys ${fmt(ratios.byKeyManyKeysVsRateLimiterMemory, 0)}x.

## Wire size of a host report

\`ReportRequest\` encoded with \`toBinary\`: realistic keys (\`api:caller=tenant-00042\`,
\`payments:charge:region=eu-west-1\`...), offered/admitted as doubles, would-drop 0 (a zero field costs nothing).

| buckets | mean key bytes | report bytes | bytes per bucket |
|---:|---:|---:|---:|
${wireRows.join('\n')}
`;

writeResultsFile('bench/results/global.md', markdown);
writeResultsFile(
  'bench/results/global.json',
  `${JSON.stringify({ date: startedAt.toISOString(), command, commit: sourceCommit(), host, results, ratios, targets, wire }, null, 2)}\n`,
);
console.log(`sink ${sink.admitted} ${sink.floor}`);
