// `spillway rls` answering Envoy's ShouldRateLimit: the global backend (decided in process from the
// controller's drop ratios) against the Redis backend (envoyproxy/ratelimit's shape: a Redis round
// trip per descriptor), in one run, with a second global instance as an A/A control (two identical
// servers: how far apart the machine alone puts them).
//
// (a) calls/s per core: IN_FLIGHT calls in flight from this process for DURATION_MS, the server's
//     own CPU time read from /proc (utime + stime) before and after: calls / CPU-seconds. On a shared
//     machine wall-clock throughput swings with the other load; CPU per call moves much less. The
//     Redis row is also given with redis-server's CPU added (INFO cpu), the whole cost of a call.
// (b) latency at half that rate, open loop (calls leave on a fixed schedule, never waiting for
//     answers), p50/p99 from each call's send to its answer; and at 5,000 calls/s, the target's rate.
// Every request carries two descriptors (a fixed bucket, and a bucket per client address among
// 1,000), both over their limits, so both backends count and decide every call.
// Contenders run in a rotated order each round; figures are medians over rounds.
//
// Run: npm run bench -- rls   (node --import tsx --expose-gc bench/rls.bench.ts)
// Env: BENCH_ROUNDS (default 3), BENCH_DURATION_MS (5000), BENCH_IN_FLIGHT (64),
//      BENCH_LATENCY_MS (5000), BENCH_SMOKE=1 (a handful of calls, nothing written).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { Redis } from 'ioredis';
import { compileRateLimits } from '../src/envoy/descriptor-rules.js';
import { createGlobalBackend } from '../src/envoy/global-backend.js';
import { createRateLimitService } from '../src/envoy/rate-limit-service.js';
import { parseRateLimitConfig } from '../src/envoy/ratelimit-config.js';
import { createRedisBackend } from '../src/envoy/redis-backend.js';
import type { RlsBackend } from '../src/envoy/rls-backend.js';
import {
  RateLimitRequestSchema,
  RateLimitResponseSchema,
} from '../src/gen/envoy/service/ratelimit/v3/rls_pb.js';
import { createGlobalLimiter } from '../src/global/global-limiter.js';
import { ioredisAdapter } from '../src/redis/redis-script-client.js';
import { createRlsClient, type RlsClient } from '../test/envoy/rls-client.js';
import { redisServerAvailable, startRedis } from '../test/helpers/redis-server.js';
import { type SpillwayProcess, startSpillway, stopSpillway } from '../test/integration/spillway-process.js';
import { median } from './paired-stats.js';
import { reproduce } from './provenance.js';

const SMOKE = process.env.BENCH_SMOKE === '1';
const ROUNDS = SMOKE ? 1 : Number(process.env.BENCH_ROUNDS ?? 3);
const DURATION_MS = SMOKE ? 300 : Number(process.env.BENCH_DURATION_MS ?? 5_000);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 64);
const LATENCY_MS = SMOKE ? 300 : Number(process.env.BENCH_LATENCY_MS ?? 5_000);
const TARGET_RATE = 5_000;
/** A rate one client process keeps up with on a shared machine: the server's own latency. */
const LOW_RATE = 500;
const COMMAND = 'npm run bench -- rls';
const ADDRESSES = 1_000;
/** Linux's USER_HZ: /proc times are in these ticks. */
const CLOCK_TICKS_PER_S = 100;

const CONFIG = `
domain: edge
descriptors:
  - key: generic_key
    value: checkout
    rate_limit: { unit: second, requests_per_unit: 1000 }
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1 }
`;

/** Pre-encoded requests, one per client address (encoding is the client's cost, not the server's). */
const requests = Array.from({ length: ADDRESSES }, (_, i) =>
  Buffer.from(
    toBinary(
      RateLimitRequestSchema,
      create(RateLimitRequestSchema, {
        domain: 'edge',
        descriptors: [
          { entries: [{ key: 'generic_key', value: 'checkout' }] },
          { entries: [{ key: 'remote_address', value: `10.1.${i >> 8}.${i & 255}` }] },
        ],
      }),
    ),
  ),
);

interface Contender {
  name: string;
  process: SpillwayProcess;
  client: RlsClient;
  /** CPU-seconds of processes besides the server that each call costs (redis-server). */
  extraCpuSeconds?: () => Promise<number>;
}

function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the `(comm) ` part.
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_S;
}

async function throughput(
  contender: Contender,
): Promise<{ callsPerS: number; perCore: number; perCoreWithExtra?: number; errors: number }> {
  let calls = 0;
  let errors = 0;
  let next = 0;
  const deadline = performance.now() + DURATION_MS;
  const cpuBefore = cpuSeconds(contender.process.child.pid!);
  const extraBefore = (await contender.extraCpuSeconds?.()) ?? 0;
  const startedMs = performance.now();
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (performance.now() < deadline) {
        try {
          await contender.client.callRaw(requests[next++ % ADDRESSES]!);
          calls++;
        } catch {
          errors++;
        }
      }
    }),
  );
  const elapsedS = (performance.now() - startedMs) / 1000;
  const cpu = cpuSeconds(contender.process.child.pid!) - cpuBefore;
  const extra = contender.extraCpuSeconds ? (await contender.extraCpuSeconds()) - extraBefore : undefined;
  return {
    callsPerS: calls / elapsedS,
    perCore: calls / Math.max(cpu, 1 / CLOCK_TICKS_PER_S),
    ...(extra !== undefined
      ? { perCoreWithExtra: calls / Math.max(cpu + extra, 1 / CLOCK_TICKS_PER_S) }
      : {}),
    errors,
  };
}

/** Open loop at `rate`: every 1 ms, the calls that fell due leave; latency from each call's send to its answer. */
async function latency(
  contender: Contender,
  rate: number,
): Promise<{ p50Ms: number; p99Ms: number; sent: number; errors: number; answeredPerS: number }> {
  const latencies: number[] = [];
  let errors = 0;
  let sent = 0;
  let next = 0;
  const startedMs = performance.now();
  const pending: Promise<void>[] = [];
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => {
      const elapsedMs = performance.now() - startedMs;
      const due = Math.floor((Math.min(elapsedMs, LATENCY_MS) / 1000) * rate);
      while (sent < due) {
        sent++;
        const sentAt = performance.now();
        pending.push(
          contender.client.callRaw(requests[next++ % ADDRESSES]!).then(
            () => {
              latencies.push(performance.now() - sentAt);
            },
            () => {
              errors++;
            },
          ),
        );
      }
      if (elapsedMs >= LATENCY_MS) {
        clearInterval(timer);
        resolve();
      }
    }, 1);
  });
  await Promise.all(pending);
  latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? Number.NaN;
  return {
    p50Ms: at(0.5),
    p99Ms: at(0.99),
    sent,
    errors,
    answeredPerS: latencies.length / ((performance.now() - startedMs) / 1000),
  };
}

/**
 * The decision alone, in this process, without gRPC: decode, ShouldRateLimit, encode; IN_FLIGHT at
 * once for the Redis backend. CPU of this process (and of redis-server, given) per call.
 */
async function inProcess(
  backend: RlsBackend,
  extraCpuSeconds?: () => Promise<number>,
): Promise<{ perCore: number; perCoreWithExtra?: number }> {
  const service = createRateLimitService({
    limits: compileRateLimits([parseRateLimitConfig(CONFIG, 'bench.yaml')]),
    backend,
  });
  const one = async (i: number) => {
    const response = await service.shouldRateLimit(
      fromBinary(RateLimitRequestSchema, requests[i % ADDRESSES]!),
    );
    toBinary(RateLimitResponseSchema, response);
  };
  const run = async (ms: number) => {
    let calls = 0;
    const deadline = performance.now() + ms;
    await Promise.all(
      Array.from({ length: IN_FLIGHT }, async (_, lane) => {
        for (let i = lane; performance.now() < deadline; i += IN_FLIGHT) {
          await one(i);
          calls++;
        }
      }),
    );
    return calls;
  };
  await run(Math.min(1_000, DURATION_MS));
  const cpu = process.cpuUsage();
  const extraBefore = (await extraCpuSeconds?.()) ?? 0;
  const calls = await run(DURATION_MS);
  const used = process.cpuUsage(cpu);
  const seconds = (used.user + used.system) / 1e6;
  const extra = extraCpuSeconds ? (await extraCpuSeconds()) - extraBefore : undefined;
  return {
    perCore: calls / seconds,
    ...(extra !== undefined ? { perCoreWithExtra: calls / (seconds + extra) } : {}),
  };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-rls-bench-'));
  const config = join(dir, 'ratelimit.yaml');
  writeFileSync(config, CONFIG);
  const started: SpillwayProcess[] = [];
  const quiet = ['--log-level', 'warn'];
  const track = async (p: Promise<SpillwayProcess>) => {
    const process = await p;
    started.push(process);
    return process;
  };
  const redis = redisServerAvailable() ? await startRedis() : undefined;
  const contenders: Contender[] = [];
  let info: Redis | undefined;
  try {
    const controller = await track(
      startSpillway('controller', [
        'controller',
        '--config',
        config,
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        ...quiet,
      ]),
    );
    const aggregator = await track(
      startSpillway('aggregator', [
        'aggregator',
        '--zone',
        'z1',
        '--parent',
        controller.grpc!,
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        ...quiet,
      ]),
    );
    const rls = (name: string, args: string[]) =>
      track(
        startSpillway(name, [
          'rls',
          '--config',
          config,
          '--listen',
          '127.0.0.1:0',
          '--ops',
          '127.0.0.1:0',
          '--id',
          name,
          ...args,
          ...quiet,
        ]),
      );
    for (const name of ['global', 'global (A/A)']) {
      const process = await rls(name.replace(/\W+/g, '-'), [
        '--aggregator',
        aggregator.grpc!,
        '--zone',
        'z1',
      ]);
      contenders.push({ name, process, client: createRlsClient(process.grpc!) });
    }
    if (redis) {
      const process = await rls('redis', ['--backend', 'redis', '--redis-url', redis.url]);
      const redisInfo = new Redis(redis.url);
      info = redisInfo;
      contenders.push({
        name: 'redis',
        process,
        client: createRlsClient(process.grpc!),
        extraCpuSeconds: async () => {
          const text = await redisInfo.info('cpu');
          const value = (field: string) => Number(new RegExp(`${field}:([\\d.]+)`).exec(text)?.[1] ?? 0);
          return value('used_cpu_sys') + value('used_cpu_user');
        },
      });
    } else {
      console.log('redis-server not installed: the Redis backend is left out');
    }
    // Warm up: JIT, connections, the first directives (over-limit buckets get a ratio).
    for (const contender of contenders) await throughput({ ...contender });

    const perCore = new Map<string, number[]>();
    const perCoreWithRedis: number[] = [];
    const wallRate = new Map<string, number[]>();
    for (let round = 0; round < ROUNDS; round++) {
      const order = contenders.map((_, i) => contenders[(i + round) % contenders.length]!);
      for (const contender of order) {
        const result = await throughput(contender);
        if (result.errors > 0) throw new Error(`${contender.name}: ${result.errors} calls failed`);
        (perCore.get(contender.name) ?? perCore.set(contender.name, []).get(contender.name)!).push(
          result.perCore,
        );
        (wallRate.get(contender.name) ?? wallRate.set(contender.name, []).get(contender.name)!).push(
          result.callsPerS,
        );
        if (result.perCoreWithExtra !== undefined) perCoreWithRedis.push(result.perCoreWithExtra);
        console.log(
          `round ${round + 1} ${contender.name}: ${result.perCore.toFixed(0)} calls/s per core, ${result.callsPerS.toFixed(0)} calls/s wall`,
        );
      }
    }
    const rows = [];
    for (const contender of contenders) {
      const core = median(perCore.get(contender.name)!);
      const half = await latency(contender, Math.max(1, Math.floor(core / 2)));
      const atTarget = await latency(contender, TARGET_RATE);
      const atLow = await latency(contender, LOW_RATE);
      rows.push({
        name: contender.name,
        perCore: core,
        perCoreRounds: perCore.get(contender.name)!,
        wallCallsPerS: median(wallRate.get(contender.name)!),
        halfRate: Math.floor(core / 2),
        half,
        atTarget,
        atLow,
      });
      console.log(
        `${contender.name}: p50 ${half.p50Ms.toFixed(3)} ms, p99 ${half.p99Ms.toFixed(3)} ms at ${Math.floor(core / 2)}/s; ` +
          `p99 ${atTarget.p99Ms.toFixed(3)} ms at ${TARGET_RATE}/s`,
      );
    }
    const decideOnly: { name: string; perCore: number; perCoreWithRedis?: number }[] = [];
    const globalLimiter = createGlobalLimiter({ reporterId: 'bench', clients: [] });
    for (let round = 0; round < ROUNDS; round++) {
      const global = await inProcess(createGlobalBackend(globalLimiter));
      decideOnly.push({ name: 'global', perCore: global.perCore });
      if (redis && info) {
        const client = new Redis(redis.url);
        const redisInfo = info;
        const measured = await inProcess(
          createRedisBackend({ redis: ioredisAdapter(client), prefix: `bench${round}`, timeoutMs: 1_000 }),
          async () => {
            const text = await redisInfo.info('cpu');
            const value = (field: string) => Number(new RegExp(`${field}:([\\d.]+)`).exec(text)?.[1] ?? 0);
            return value('used_cpu_sys') + value('used_cpu_user');
          },
        );
        client.disconnect();
        decideOnly.push({
          name: 'redis',
          perCore: measured.perCore,
          perCoreWithRedis: measured.perCoreWithExtra!,
        });
      }
    }
    await globalLimiter.stop();
    const decide = (name: string, field: 'perCore' | 'perCoreWithRedis') =>
      median(decideOnly.filter((d) => d.name === name).map((d) => d[field] ?? Number.NaN));
    const decideRows = {
      global: decide('global', 'perCore'),
      redis: decide('redis', 'perCore'),
      redisWithServer: decide('redis', 'perCoreWithRedis'),
    };
    console.log(`decide only, calls/s per core: ${JSON.stringify(decideRows)}`);
    if (SMOKE) {
      console.log('BENCH_SMOKE=1: nothing written');
      return;
    }
    writeResults(rows, median(perCoreWithRedis.length > 0 ? perCoreWithRedis : [Number.NaN]), decideRows);
  } finally {
    for (const contender of contenders) contender.client.close();
    info?.disconnect();
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    await redis?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

type Row = {
  name: string;
  perCore: number;
  perCoreRounds: number[];
  wallCallsPerS: number;
  halfRate: number;
  half: { p50Ms: number; p99Ms: number; sent: number; errors: number; answeredPerS: number };
  atTarget: { p50Ms: number; p99Ms: number; sent: number; errors: number; answeredPerS: number };
  atLow: { p50Ms: number; p99Ms: number; sent: number; errors: number; answeredPerS: number };
};

function writeResults(
  rows: Row[],
  redisPerCoreWithServer: number,
  decideOnly: { global: number; redis: number; redisWithServer: number },
): void {
  const by = (name: string) => rows.find((r) => r.name === name);
  const global = by('global')!;
  const control = by('global (A/A)')!;
  const redis = by('redis');
  const ratio = redis ? global.perCore / redis.perCore : Number.NaN;
  const aaSpread = Math.abs(global.perCore - control.perCore) / Math.min(global.perCore, control.perCore);
  // A target is decided only when the A/A spread could not flip it.
  const throughputVerdict = !redis
    ? 'not measured (no redis-server)'
    : ratio / (1 + aaSpread) >= 3
      ? 'met'
      : ratio * (1 + aaSpread) < 3
        ? 'missed'
        : 'undecided (within the A/A spread)';
  const p99s = [global.atTarget.p99Ms, control.atTarget.p99Ms];
  const latencyVerdict = p99s.every((p) => p <= 1)
    ? 'met'
    : p99s.every((p) => p > 1)
      ? 'missed on this machine'
      : 'undecided (the A/A pair disagree)';
  const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? n.toFixed(digits) : 'n/a');
  const json = {
    command: COMMAND,
    reproduce: reproduce(COMMAND),
    settings: { ROUNDS, DURATION_MS, IN_FLIGHT, LATENCY_MS, TARGET_RATE, ADDRESSES },
    rows,
    redisPerCoreWithServer,
    decideOnly,
    globalOverRedisPerCore: ratio,
    aaSpread,
    targets: { throughput: throughputVerdict, latency: latencyVerdict },
  };
  writeFileSync('bench/results/rls.json', `${JSON.stringify(json, null, 2)}\n`);
  const lines = [
    '# spillway rls: ShouldRateLimit, global backend vs Redis backend',
    '',
    `Command: \`${COMMAND}\``,
    '',
    `Reproduce: \`${reproduce(COMMAND)}\``,
    '',
    `Settings: ${ROUNDS} rounds, ${DURATION_MS} ms of ${IN_FLIGHT} calls in flight per contender and round, ` +
      `latency runs of ${LATENCY_MS} ms; two descriptors per call (a fixed bucket and one of ${ADDRESSES} client addresses), both over their limits.`,
    'Calls/s per core: calls answered / CPU-seconds of the `spillway rls` process (/proc utime + stime).',
    'Latency: open loop from this process, send to answer, client included; "answered" is the rate the run',
    'achieved (calls answered per second of the run): below the asked rate, the generator or the machine was',
    'the limit and the latency is queueing, not the server.',
    '',
    '| backend | calls/s per core (median) | rounds | calls/s wall (median) | p50 / p99 at half the per-core rate (answered) | p50 / p99 at 5,000 calls/s (answered) | p50 / p99 at 500 calls/s (answered) |',
    '| --- | ---: | --- | ---: | --- | --- | --- |',
    ...rows.map(
      (r) =>
        `| ${r.name} | ${fmt(r.perCore)} | ${r.perCoreRounds.map((v) => fmt(v)).join(', ')} | ${fmt(r.wallCallsPerS)} | ` +
        `${fmt(r.half.p50Ms, 3)} / ${fmt(r.half.p99Ms, 3)} ms at ${r.halfRate}/s (${fmt(r.half.answeredPerS)}/s) | ` +
        `${fmt(r.atTarget.p50Ms, 3)} / ${fmt(r.atTarget.p99Ms, 3)} ms (${fmt(r.atTarget.answeredPerS)}/s) | ` +
        `${fmt(r.atLow.p50Ms, 3)} / ${fmt(r.atLow.p99Ms, 3)} ms (${fmt(r.atLow.answeredPerS)}/s) |`,
    ),
    '',
    `Redis backend with redis-server's CPU added: ${fmt(redisPerCoreWithServer)} calls/s per core.`,
    '',
    `Global over Redis, calls/s per core: ${fmt(ratio, 2)}x (target >= 3x): **${throughputVerdict}**. ` +
      `A/A spread between the two identical global servers: ${fmt(100 * aaSpread, 1)}%.`,
    '',
    '## The decision alone (no gRPC)',
    '',
    'Decode, ShouldRateLimit and encode in the bench process, IN_FLIGHT at once; CPU of this process per call',
    "(for Redis, also with redis-server's CPU added). What the backend choice changes, without the RPC layer both share.",
    '',
    '| backend | calls/s per core | with redis-server CPU |',
    '| --- | ---: | ---: |',
    `| global | ${fmt(decideOnly.global)} | |`,
    `| redis | ${fmt(decideOnly.redis)} | ${fmt(decideOnly.redisWithServer)} |`,
    '',
    `Global over Redis, decision alone: ${fmt(decideOnly.global / decideOnly.redis, 2)}x ` +
      `(${fmt(decideOnly.global / decideOnly.redisWithServer, 2)}x with redis-server's CPU). ` +
      'This is the ceiling of the ratio through gRPC: the RPC layer adds the same CPU to both backends, ' +
      `about ${fmt(1e6 / global.perCore - 1e6 / decideOnly.global)} µs a call here ` +
      `(1 / ${fmt(global.perCore)} s through gRPC, less 1 / ${fmt(decideOnly.global)} s for the decision).`,
    '',
    `p99 at 5,000 calls/s on the global backend (target <= 1 ms): ${p99s.map((p) => `${fmt(p, 3)} ms`).join(' and ')} ` +
      `(the A/A pair): **${latencyVerdict}**.`,
    '',
  ];
  writeFileSync('bench/results/rls.md', lines.join('\n'));
}

await main();
