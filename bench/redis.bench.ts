// The four Spillway Redis limiters vs rate-limiter-flexible's RateLimiterRedis, on one private
// redis-server, each through its own ioredis connection with the same (fail-fast) options.
//
// (a) latency: one call in flight, p50/p99 per call;
// (b) throughput: IN_FLIGHT calls in flight, calls/s over CALLS calls spread over KEYS keys,
//     once with limits high enough that every call is admitted, once with limit 1 so nearly every
//     call is rejected (rate-limiter-flexible rejects by throwing a RateLimiterRes: that cost is its own);
// (c) cost per call during (b): Redis CPU (INFO commandstats, usec of EVALSHA/EVAL per call) and
//     this process' CPU (process.cpuUsage). Wall-clock figures swing with other load on the
//     machine; these two move much less, so they show where a difference comes from.
// (d) floor: a minimal Lua script (TIME + INCR, no TTL, no decision), once straight through ioredis
//     and once through the Spillway call path: what any Redis-clock Lua limiter costs at least.
// Contenders run round-robin within each round, each round with fresh keys, so noise and Redis state
// growth fall on all of them alike. Reported figures are medians over rounds.
//
// Needs: redis-server
// Run: node --import tsx --expose-gc bench/redis.bench.ts
// Env: BENCH_ROUNDS (default 5), BENCH_LATENCY_CALLS (20000), BENCH_CALLS (100000),
//      BENCH_WARMUP_CALLS (5000), BENCH_IN_FLIGHT (100), BENCH_KEYS (1000);
//      BENCH_SMOKE=1: a few hundred calls per run, nothing written (bench/smoke.ts).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { Redis, type RedisOptions } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  ioredisAdapter,
  MAX_SLIDING_LOG_LIMIT,
  type RedisLimiter,
  type RedisScriptClient,
} from '../src/redis/index.js';
import type { LuaScript } from '../src/redis/lua-script.js';
import { createRedisLimiter } from '../src/redis/redis-limiter.js';
import { startRedis } from '../test/helpers/redis-server.js';
import { median } from './paired-stats.js';
import { reproduce, sourceCommit } from './provenance.js';
import { benchSetting, SMOKE, smokeCheck, writeResultsFile } from './smoke.js';

const ROUNDS = benchSetting('BENCH_ROUNDS', 5, 1);
const LATENCY_CALLS = benchSetting('BENCH_LATENCY_CALLS', 20_000, 200);
const CALLS = benchSetting('BENCH_CALLS', 100_000, 2_000);
const WARMUP_CALLS = benchSetting('BENCH_WARMUP_CALLS', 5_000, 100);
const IN_FLIGHT = benchSetting('BENCH_IN_FLIGHT', 100, 100);
const KEY_COUNT = benchSetting('BENCH_KEYS', 1_000, 100);
/** Calls per run of the Spillway call path over a fake client (measureCallPath). */
const CALL_PATH_CALLS = SMOKE ? 2_000 : 200_000;
/** Long enough that an epoch-aligned window boundary rarely falls inside a run. */
const WINDOW_SEC = 3600;
const WINDOW_MS = WINDOW_SEC * 1000;
/**
 * Admitted runs' limit: within every contender's bound (the sliding log refuses more than
 * MAX_SLIDING_LOG_LIMIT, one sorted-set member per unit) and above what any key is sent in a run,
 * so every call is admitted. A run's keys are fresh, so no count carries from one run to the next.
 */
const ADMITTED_LIMIT = 10_000;
const COMMAND = 'node --import tsx --expose-gc bench/redis.bench.ts';

/** docs/redis-operations.md, "Recommended ioredis options"; used for every contender alike. */
const clientOptions: RedisOptions = {
  enableOfflineQueue: false,
  maxRetriesPerRequest: 0,
  autoResendUnfulfilledCommands: false,
  connectTimeout: 1_000,
  socketTimeout: 1_000,
  retryStrategy: (attempt) => Math.min(attempt * 50, 500),
};

/** One call; resolves with whether it was admitted. Every contender is wrapped to this shape. */
type Call = (key: string) => Promise<boolean>;

interface Contender {
  name: string;
  /** A limiter with a fresh key prefix, so every run starts from empty Redis state. */
  make(limit: number, prefix: string): Call;
  /** Calls that were not counted by Redis (timeouts, errors): must stay 0 for a fair figure. */
  faults(): number;
  /** Of those, the errors (a script or a command that failed, not a slow answer). */
  errors(): number;
  /** A floor row: never rejects, so it has no rejected run and no ratio to RateLimiterRedis. */
  floor?: boolean;
}

function spillway(name: string, create: (limit: number, prefix: string) => RedisLimiter): Contender {
  const made: RedisLimiter[] = [];
  return {
    name,
    make(limit, prefix) {
      const limiter = create(limit, prefix);
      made.push(limiter);
      return async (key) => (await limiter.limit(key)).allowed;
    },
    faults: () => made.reduce((sum, l) => sum + l.stats.timeouts + l.stats.errors, 0),
    errors: () => made.reduce((sum, l) => sum + l.stats.errors, 0),
  };
}

function rateLimiterFlexible(client: Redis): Contender {
  let faults = 0;
  return {
    name: 'rate-limiter-flexible RateLimiterRedis',
    make(limit, prefix) {
      const limiter = new RateLimiterRedis({
        storeClient: client,
        keyPrefix: prefix,
        points: limit,
        duration: WINDOW_SEC,
      });
      return async (key) => {
        try {
          await limiter.consume(key);
          return true;
        } catch (rejection) {
          if (rejection instanceof RateLimiterRes) return false;
          faults++;
          return true;
        }
      };
    },
    faults: () => faults,
    errors: () => faults,
  };
}

const spillwayLimiters: [
  string,
  (redis: RedisScriptClient, limit: number, prefix: string) => RedisLimiter,
][] = [
  [
    'spillway fixed window',
    (redis, limit, prefix) => createRedisFixedWindow({ redis, prefix, limit, windowMs: WINDOW_MS }),
  ],
  [
    'spillway sliding log',
    (redis, limit, prefix) => createRedisSlidingLog({ redis, prefix, limit, windowMs: WINDOW_MS }),
  ],
  [
    'spillway sliding counter',
    (redis, limit, prefix) => createRedisSlidingCounter({ redis, prefix, limit, windowMs: WINDOW_MS }),
  ],
  [
    'spillway token bucket',
    (redis, limit, prefix) =>
      createRedisTokenBucket({ redis, prefix, capacity: limit, refillPerSec: limit / WINDOW_SEC }),
  ],
];

/** The floor: read the Redis clock and count, nothing else (keys get no TTL; the bench flushes). */
const FLOOR_SOURCE = "local t = redis.call('TIME')\nreturn {1, redis.call('INCR', KEYS[1]), 0, 0}\n";
const floorScript: LuaScript = {
  name: 'floor',
  source: FLOOR_SOURCE,
  sha: createHash('sha1').update(FLOOR_SOURCE).digest('hex'),
};

function floorRaw(client: Redis): Contender {
  return {
    name: 'floor: TIME+INCR script, raw ioredis',
    floor: true,
    make(_limit, prefix) {
      return async (key) => {
        await client.evalsha(floorScript.sha, 1, `${prefix}:{${key}}:floor`);
        return true;
      };
    },
    faults: () => 0,
    errors: () => 0,
  };
}

function floorWrapped(redis: RedisScriptClient): Contender {
  const contender = spillway('floor: TIME+INCR script, Spillway call path', (limit, prefix) =>
    createRedisLimiter(
      { redis, prefix },
      {
        name: 'floor',
        script: floorScript,
        limit,
        integerCost: true,
        keys: (p, key) => [`${p}:{${key}}:floor`],
        args: () => [],
      },
    ),
  );
  return { ...contender, floor: true };
}

async function connect(port: number): Promise<Redis> {
  const client = new Redis({ host: '127.0.0.1', port, ...clientOptions });
  await new Promise<void>((resolve, reject) => {
    client.once('ready', resolve);
    client.once('error', reject);
  });
  return client;
}

function percentile(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

function collectGarbage(): void {
  (globalThis as { gc?: () => void }).gc?.();
}

const keys = Array.from({ length: KEY_COUNT }, (_, i) => `tenant-${i}:route`);

/** The most calls one key gets in a run of `calls` (calls go to key (i * 7) % KEY_COUNT). */
function mostCallsPerKey(calls: number): number {
  const perKey = new Uint32Array(KEY_COUNT);
  let most = 0;
  for (let i = 0; i < calls; i++) most = Math.max(most, ++perKey[(i * 7) % KEY_COUNT]!);
  return most;
}

const MOST_CALLS_PER_KEY = mostCallsPerKey(Math.max(CALLS, LATENCY_CALLS, WARMUP_CALLS * 4));
if (MOST_CALLS_PER_KEY >= ADMITTED_LIMIT || ADMITTED_LIMIT > MAX_SLIDING_LOG_LIMIT) {
  throw new Error(
    `admitted runs need a limit above the ${MOST_CALLS_PER_KEY} calls a key gets and at most ${MAX_SLIDING_LOG_LIMIT}; limit ${ADMITTED_LIMIT} is not (BENCH_CALLS / BENCH_KEYS too high)`,
  );
}

async function measureLatency(call: Call, calls: number): Promise<{ p50Us: number; p99Us: number }> {
  const samples = new Float64Array(calls);
  for (let i = 0; i < calls; i++) {
    const startMs = performance.now();
    await call(keys[(i * 7) % KEY_COUNT]!);
    samples[i] = (performance.now() - startMs) * 1000;
  }
  samples.sort();
  return { p50Us: percentile(samples, 0.5), p99Us: percentile(samples, 0.99) };
}

/** Microseconds Redis spent in script commands since the last CONFIG RESETSTAT. */
async function redisScriptUsec(admin: Redis): Promise<number> {
  const info = String(await admin.info('commandstats'));
  let usec = 0;
  // Commands run inside a script are listed too (cmdstat_hset...) but their time is already in
  // the script's EVALSHA/EVAL figure, so only those two are summed.
  for (const match of info.matchAll(/^cmdstat_(evalsha|eval):calls=\d+,usec=(\d+)/gm))
    usec += Number(match[2]);
  return usec;
}

interface Throughput {
  callsPerSec: number;
  admitted: number;
  redisUsPerCall: number;
  clientCpuUsPerCall: number;
}

async function measureThroughput(call: Call, calls: number, admin: Redis): Promise<Throughput> {
  let next = 0;
  let admitted = 0;
  const worker = async () => {
    while (next < calls) {
      const i = next++;
      if (await call(keys[(i * 7) % KEY_COUNT]!)) admitted++;
    }
  };
  await admin.config('RESETSTAT');
  const cpuBefore = process.cpuUsage();
  const startMs = performance.now();
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  const elapsedMs = performance.now() - startMs;
  const cpu = process.cpuUsage(cpuBefore);
  return {
    callsPerSec: (calls / elapsedMs) * 1000,
    admitted,
    redisUsPerCall: (await redisScriptUsec(admin)) / calls,
    clientCpuUsPerCall: (cpu.user + cpu.system) / calls,
  };
}

interface Samples {
  p50: number[];
  p99: number[];
  admitted: Throughput[];
  rejected: Throughput[];
}

/**
 * The Spillway call path alone (validation, deadline timer, reply parsing) over a fake client that
 * answers on the next microtask: CPU ns per call with 1 and with IN_FLIGHT calls in flight.
 */
async function measureCallPath(): Promise<{ inFlight: number; cpuNsPerCall: number }[]> {
  // As the scripts reply, Redis time last, so the clock estimate behind each deadline runs too.
  const reply = [1, 5, 0, 0, Date.now() * 1000];
  const fake: RedisScriptClient = { evalsha: async () => reply, eval: async () => reply };
  const limiter = createRedisFixedWindow({ redis: fake, limit: 100, windowMs: 1000 });
  const calls = CALL_PATH_CALLS;
  const results = [];
  for (const inFlight of [1, IN_FLIGHT]) {
    const samples: number[] = [];
    for (let round = 0; round < ROUNDS + 2; round++) {
      let next = 0;
      const worker = async () => {
        while (next < calls) {
          next++;
          await limiter.limit('tenant-1:route');
        }
      };
      collectGarbage();
      const cpuBefore = process.cpuUsage();
      await Promise.all(Array.from({ length: inFlight }, worker));
      const cpu = process.cpuUsage(cpuBefore);
      samples.push(((cpu.user + cpu.system) * 1000) / calls);
    }
    results.push({ inFlight, cpuNsPerCall: median(samples.slice(2)) });
  }
  return results;
}

async function main(): Promise<void> {
  const loadAverage1mAtStart = os.loadavg()[0] ?? 0;
  const server = await startRedis();
  // Ctrl-C must not leave the private redis-server running.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      void server.stop().finally(() => process.exit(130));
    });
  }
  const clients: Redis[] = [];
  const client = async () => {
    const c = await connect(server.port);
    clients.push(c);
    return c;
  };
  try {
    const admin = await client();
    const redisVersion = /redis_version:(\S+)/.exec(String(await admin.info('server')))?.[1] ?? 'unknown';
    const contenders: Contender[] = [];
    for (const [name, create] of spillwayLimiters) {
      const redis = ioredisAdapter(await client());
      contenders.push(spillway(name, (limit, prefix) => create(redis, limit, prefix)));
    }
    contenders.push(rateLimiterFlexible(await client()));
    const floorClient = await client();
    await floorClient.script('LOAD', floorScript.source);
    contenders.push(floorRaw(floorClient), floorWrapped(ioredisAdapter(await client())));

    // Warmup: JIT, script caches (EVALSHA), connections.
    for (const contender of contenders) {
      await measureLatency(contender.make(ADMITTED_LIMIT, 'warm-a'), WARMUP_CALLS);
      await measureThroughput(contender.make(ADMITTED_LIMIT, 'warm-b'), WARMUP_CALLS * 4, admin);
      await measureThroughput(contender.make(1, 'warm-c'), WARMUP_CALLS * 4, admin);
    }
    await admin.flushall();

    const samples = new Map<string, Samples>();
    for (const c of contenders) samples.set(c.name, { p50: [], p99: [], admitted: [], rejected: [] });
    for (let round = 0; round < ROUNDS; round++) {
      // Rotate the order each round so no contender always runs first or last.
      const order = contenders.map((_, i) => contenders[(i + round) % contenders.length]!);
      for (const contender of order) {
        const s = samples.get(contender.name)!;
        collectGarbage();
        const latency = await measureLatency(contender.make(ADMITTED_LIMIT, `r${round}-lat`), LATENCY_CALLS);
        s.p50.push(latency.p50Us);
        s.p99.push(latency.p99Us);
        collectGarbage();
        const admitted = await measureThroughput(
          contender.make(ADMITTED_LIMIT, `r${round}-adm`),
          CALLS,
          admin,
        );
        s.admitted.push(admitted);
        collectGarbage();
        const rejected = contender.floor
          ? {
              callsPerSec: Number.NaN,
              admitted: 0,
              redisUsPerCall: Number.NaN,
              clientCpuUsPerCall: Number.NaN,
            }
          : await measureThroughput(contender.make(1, `r${round}-rej`), CALLS, admin);
        s.rejected.push(rejected);
        // A figure is only meaningful if the run measured what it claims to.
        if (admitted.admitted !== CALLS)
          throw new Error(`${contender.name}: admitted run rejected some calls`);
        // One admitted call per key, two if a window boundary fell inside the run.
        if (rejected.admitted > 2 * KEY_COUNT)
          throw new Error(`${contender.name}: rejected run admitted ${rejected.admitted} calls`);
        process.stdout.write(
          `round ${round + 1}/${ROUNDS} ${contender.name}: p50 ${latency.p50Us.toFixed(0)} us, ` +
            `${admitted.callsPerSec.toFixed(0)} admitted calls/s, ${rejected.callsPerSec.toFixed(0)} rejected calls/s, ` +
            `redis ${admitted.redisUsPerCall.toFixed(2)}/${rejected.redisUsPerCall.toFixed(2)} us/call\n`,
        );
      }
      await admin.flushall();
    }

    // A fault policy answers a call whose script failed, so a broken script still "admits": the
    // errors are what show it.
    for (const c of contenders) smokeCheck(c.errors() === 0, `${c.name}: ${c.errors()} calls failed`);
    const rows = contenders.map((c) => {
      const s = samples.get(c.name)!;
      const m = (runs: Throughput[], field: keyof Throughput) => median(runs.map((run) => run[field]));
      return {
        contender: c.name,
        latencyP50Us: median(s.p50),
        latencyP99Us: median(s.p99),
        admittedCallsPerSec: m(s.admitted, 'callsPerSec'),
        rejectedCallsPerSec: m(s.rejected, 'callsPerSec'),
        admittedRedisUsPerCall: m(s.admitted, 'redisUsPerCall'),
        rejectedRedisUsPerCall: m(s.rejected, 'redisUsPerCall'),
        admittedClientCpuUsPerCall: m(s.admitted, 'clientCpuUsPerCall'),
        rejectedClientCpuUsPerCall: m(s.rejected, 'clientCpuUsPerCall'),
        rejectedShare: 1 - m(s.rejected, 'admitted') / CALLS,
        faults: c.faults(),
      };
    });
    const baseline = rows.find((r) => r.contender.startsWith('rate-limiter-flexible'))!;
    // Ratios > 1 mean Spillway is faster (or cheaper) than RateLimiterRedis on that measure.
    const ratios = rows
      .filter((r) => r !== baseline && !contenders.find((c) => c.name === r.contender)?.floor)
      .map((r) => ({
        contender: r.contender,
        latencyP50: baseline.latencyP50Us / r.latencyP50Us,
        latencyP99: baseline.latencyP99Us / r.latencyP99Us,
        admittedThroughput: r.admittedCallsPerSec / baseline.admittedCallsPerSec,
        rejectedThroughput: r.rejectedCallsPerSec / baseline.rejectedCallsPerSec,
        admittedRedisCpu: baseline.admittedRedisUsPerCall / r.admittedRedisUsPerCall,
        admittedClientCpu: baseline.admittedClientCpuUsPerCall / r.admittedClientCpuUsPerCall,
      }));

    const version = (pkg: string) =>
      (JSON.parse(readFileSync(`node_modules/${pkg}/package.json`, 'utf8')) as { version: string }).version;
    const callPath = await measureCallPath();
    const meta = {
      date: new Date().toISOString(),
      node: process.version,
      redis: redisVersion,
      ioredis: version('ioredis'),
      rateLimiterFlexible: version('rate-limiter-flexible'),
      platform: `${os.type()} ${os.release()} ${os.arch()}`,
      cpu: `${os.cpus()[0]?.model ?? 'unknown'} x${os.cpus().length}`,
      loadAverage1mAtStart,
      loadAverage1m: os.loadavg()[0] ?? 0,
      command: COMMAND,
      commit: sourceCommit(),
      rounds: ROUNDS,
      latencyCalls: LATENCY_CALLS,
      throughputCalls: CALLS,
      inFlight: IN_FLIGHT,
      keys: KEY_COUNT,
      windowSec: WINDOW_SEC,
      admittedLimit: ADMITTED_LIMIT,
      mostCallsPerKey: MOST_CALLS_PER_KEY,
    };
    writeResultsFile(
      'bench/results/redis.json',
      `${JSON.stringify({ meta, rows, ratios, callPath }, null, 2)}\n`,
    );

    const n = (value: number, digits = 0) =>
      Number.isNaN(value)
        ? '–'
        : value.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
    // Redis CPU per admitted call is the verdict's measure: it barely moves with other load on the
    // machine, unlike latency and throughput (which are shown, and compared, in the tables below).
    function conclusion(): string[] {
      const redisUs = (name: string) =>
        rows.find((r) => r.contender === name)?.admittedRedisUsPerCall ?? Number.NaN;
      const floorUs = redisUs('floor: TIME+INCR script, raw ioredis');
      const verdicts = ratios.map((r) => {
        const us = redisUs(r.contender);
        const gap = us - baseline.admittedRedisUsPerCall;
        const verdict =
          gap <= 0.1 * baseline.admittedRedisUsPerCall
            ? 'at parity or cheaper'
            : `${n(gap, 1)} µs more per call (${n(us / baseline.admittedRedisUsPerCall, 2)} ×)`;
        return `- ${r.contender}: ${n(us, 2)} µs — ${verdict}; p50 ${n(r.latencyP50, 2)}, admitted throughput ${n(r.admittedThroughput, 2)}, rejected throughput ${n(r.rejectedThroughput, 2)} of RateLimiterRedis.`;
      });
      const faulted = rows.filter((r) => r.faults > 0);
      const faultNote =
        faulted.length === 0
          ? []
          : [
              '',
              `**Calls that timed out or failed: ${faulted.map((r) => `${r.contender} ${n(r.faults)}`).join(', ')}.** A stall of the machine times out every call in flight, so this run's latency and throughput ratios say as much about the machine as about the limiters; Redis CPU per call moves less.`,
            ];
      return [
        '## Conclusion',
        '',
        `Redis CPU per admitted call (commandstats; the steady measure on a shared machine): RateLimiterRedis ${n(baseline.admittedRedisUsPerCall, 2)} µs, the TIME+INCR floor ${n(floorUs, 2)} µs.`,
        ...verdicts,
        ...faultNote,
        '',
        "RateLimiterRedis's script is a fixed-window counter (SET NX EX, INCRBY, PTTL) that reads no",
        'clock, computes no decision and counts rejected calls too. Each Spillway script also reads',
        'the Redis TIME, changes nothing for a call past its deadline, and returns the whole decision',
        '(remaining, reset and retry on the Redis clock, and the time itself); a rejected call writes',
        'nothing. The floor row (TIME + INCR, nothing else) is the least a script on the Redis clock',
        'costs: TIME itself is cheap, the rest is the decision. The fixed window, sliding counter and',
        'token bucket are O(1) (3–4 Redis commands per call); the sliding log stores every admitted',
        'request in a sorted set (ZRANGE of its newest entry, to notice a clock that stepped back, then',
        'ZREMRANGEBYSCORE + ZCARD + ZADD, O(log n) per call) to be exact over any span: strictly more',
        'work than a counter, which it cannot match. With 1 call in flight the loopback round trip and',
        'the event loop dominate, so a few µs of script time hardly show in p50; with 100 in flight the',
        'Redis thread is the limit once its CPU per call is.',
      ];
    }

    const md = [
      '# Redis limiters vs rate-limiter-flexible',
      '',
      `${meta.date} · Node ${meta.node} · Redis ${meta.redis} · ioredis ${meta.ioredis} · rate-limiter-flexible ${meta.rateLimiterFlexible} · ${meta.platform} · ${meta.cpu} · load average ${n(meta.loadAverage1mAtStart, 1)} at the start, ${n(meta.loadAverage1m, 1)} at the end on ${os.cpus().length} CPUs`,
      '',
      `Reproduce: \`${reproduce(COMMAND)}\` (${ROUNDS} rounds after warmup, contenders round-robin, medians over rounds).`,
      'One private redis-server on loopback, no persistence; each contender has its own ioredis',
      'connection with the same options (docs/redis-operations.md). Spillway limiters use their defaults',
      `(timeoutMs 100, fail-open); RateLimiterRedis its defaults (points = limit, duration ${WINDOW_SEC} s),`,
      'which is a fixed window: the like-for-like row is "spillway fixed window".',
      `Latency: 1 call in flight, ${n(LATENCY_CALLS)} calls per round over ${n(KEY_COUNT)} keys, all admitted.`,
      `Throughput: ${IN_FLIGHT} calls in flight, ${n(CALLS)} calls per round over ${n(KEY_COUNT)} keys;`,
      `"admitted": limit ${n(ADMITTED_LIMIT)}, which no key reaches (at most ${n(MOST_CALLS_PER_KEY)} calls a key in a run, each run on fresh keys)`,
      `and within every limiter's bound (the sliding log's is ${n(MAX_SLIDING_LOG_LIMIT)}); "rejected": limit 1, so all but the first call per key are rejected.`,
      'The two floor rows run a minimal script (TIME + INCR, no TTL, no decision): the least any',
      'Lua limiter on the Redis clock can cost, raw through ioredis and through the Spillway call path.',
      '',
      ...conclusion(),
      '',
      '| limiter | p50 µs | p99 µs | admitted calls/s | rejected calls/s | faults |',
      '|---|---:|---:|---:|---:|---:|',
      ...rows.map(
        (r) =>
          `| ${r.contender} | ${n(r.latencyP50Us)} | ${n(r.latencyP99Us)} | ${n(r.admittedCallsPerSec)} | ${n(r.rejectedCallsPerSec)} | ${r.faults} |`,
      ),
      '',
      'The Spillway call path alone (validation, shared deadline timer, reply parsing; a fake client',
      `answering at once): ${callPath.map((c) => `${n(c.cpuNsPerCall)} ns CPU per call with ${c.inFlight} in flight`).join(', ')}.`,
      '',
      'Cost per call during the throughput runs: Redis CPU in the script (INFO commandstats) and this',
      "Node process' CPU (client library + limiter). Less sensitive to other load than wall-clock figures.",
      '',
      '| limiter | Redis µs/call admitted | Redis µs/call rejected | client CPU µs/call admitted | client CPU µs/call rejected |',
      '|---|---:|---:|---:|---:|',
      ...rows.map(
        (r) =>
          `| ${r.contender} | ${n(r.admittedRedisUsPerCall, 2)} | ${n(r.rejectedRedisUsPerCall, 2)} | ${n(r.admittedClientCpuUsPerCall, 1)} | ${n(r.rejectedClientCpuUsPerCall, 1)} |`,
      ),
      '',
      'Relative to RateLimiterRedis (> 1.00 = Spillway faster or cheaper; latency and CPU ratios are RLF / Spillway):',
      '',
      '| limiter | p50 latency | p99 latency | admitted throughput | rejected throughput | Redis CPU (admitted) | client CPU (admitted) |',
      '|---|---:|---:|---:|---:|---:|---:|',
      ...ratios.map(
        (r) =>
          `| ${r.contender} | ${n(r.latencyP50, 2)} | ${n(r.latencyP99, 2)} | ${n(r.admittedThroughput, 2)} | ${n(r.rejectedThroughput, 2)} | ${n(r.admittedRedisCpu, 2)} | ${n(r.admittedClientCpu, 2)} |`,
      ),
      '',
      '"faults" counts calls that timed out or errored (decided by the fail policy, not counted by',
      'Redis) over the whole run; more than a handful means the machine was too loaded for the figures',
      'to mean much.',
      '',
    ].join('\n');
    writeResultsFile('bench/results/redis.md', md);
    process.stdout.write(`\n${md}`);
  } finally {
    for (const c of clients) c.disconnect();
    await server.stop();
  }
}

await main();
