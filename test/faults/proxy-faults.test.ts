import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { describe, it, type TestContext } from 'node:test';
import { Pool } from 'undici';
import { createLoadGenerator } from '../../src/cli/load-generator.js';
import { type FaultProxy, startFaultProxy } from '../helpers/fault-proxy.js';
import { type RedisServer, requireRedis, startRedis } from '../helpers/redis-server.js';
import { startUpstream } from '../http/proxy-harness.js';
import {
  type SpillwayProcess,
  scrape,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { BUCKET, Fleet, type HostReading, readHost, sleep } from './fleet.js';

// The sidecar `spillway proxy` under the same faults as `spillway host`: real processes on
// loopback, an open-loop HTTP load through the proxy, and every answer recorded. What must hold:
// the proxy answers every request itself (200 from the upstream or its own 429), whatever its
// control plane or its Redis does.
//
// How these fail if the proxy waited on its backend: a request decided only after a report came
// back would hang for the whole outage (no answer within REQUEST_TIMEOUT_MS: counted as an error);
// a proxy that dropped its ratio at once (or held it for good) fails the held / decayed bounds; a
// Redis call not bounded by timeoutMs holds requests for the 2 s pause (latency bound).

const INTERVAL_MS = 500;
/** The controller's limit for the bucket; the load offers OFFERED_RPS, so the ratio is ~0.4. */
const LIMIT_RPS = 120;
const OFFERED_RPS = 200;
/**
 * An answer later than this is a failure (counted as a timeout error, never waited out). Half the
 * outage: a proxy that waited on its control plane hangs for all of it. 2 s failed a run of the
 * full suite beside three CPU-burning processes (88 requests of the outage timed out); the deadline
 * is a timer in this process, and after a stall of it, timers fire before the replies waiting in
 * the sockets are read. The stalls of this process and the proxy's are printed with a failure.
 */
const REQUEST_TIMEOUT_MS = 4_000;
/** Kill to restart: long enough to see the hold end and the decay run for several seconds. */
const OUTAGE_MS = 8_000;
/** The limits file's default TTL (4 intervals) and the proxy's default stale hold (3 intervals). */
const TTL_MS = 4 * INTERVAL_MS;
const HOLD_MS = 3 * INTERVAL_MS;
const DECAY_MS = 10_000;
/**
 * The earliest the proxy's held ratio may start to decay after the kill: its last directive may be
 * up to one report interval old and its relayed TTL up to one forward interval short (jitter 10%).
 */
const EARLIEST_DECAY_MS = TTL_MS - 2 * INTERVAL_MS * 1.1 + HOLD_MS;
/** The latest: a directive received just before the kill, with its full TTL. */
const LATEST_DECAY_MS = TTL_MS + HOLD_MS;
/** A fault proxy's target before the process behind it listens (it resets connections meanwhile). */
const UNREACHABLE = '127.0.0.1:1';

interface Answer {
  /** performance.now() when the load generator offered the request. */
  sentMs: number;
  latencyMs: number;
  /** 0 when no HTTP answer came (see `error`). */
  status: number;
  error?: string;
  retryAfter?: string;
}

interface HttpLoad {
  readonly answers: Answer[];
  /** When each request was offered (performance.now()), answered or not. */
  readonly offeredMs: number[];
  readonly issued: number;
  /** Stops offering, waits for every request to be answered or to time out. */
  stop(): Promise<void>;
}

/**
 * Open-loop load: OFFERED_RPS whatever the answers' latency (a slow proxy does not slow the
 * offer), each answer recorded with its latency from the moment it was offered, queueing included.
 */
function startHttpLoad(base: string, rps: number, path: string): HttpLoad {
  const pool = new Pool(base, {
    connections: 32,
    pipelining: 1,
    headersTimeout: REQUEST_TIMEOUT_MS,
    bodyTimeout: REQUEST_TIMEOUT_MS,
    connectTimeout: REQUEST_TIMEOUT_MS,
  });
  const answers: Answer[] = [];
  const offeredMs: number[] = [];
  let inFlight = 0;
  const offer = () => {
    const sentMs = performance.now();
    offeredMs.push(sentMs);
    inFlight++;
    pool
      .request({ path, method: 'GET', signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) })
      .then(async (response) => {
        await response.body.dump();
        const retryAfter = response.headers['retry-after'];
        answers.push({
          sentMs,
          latencyMs: performance.now() - sentMs,
          status: response.statusCode,
          retryAfter: typeof retryAfter === 'string' ? retryAfter : undefined,
        });
      })
      .catch((error: unknown) => {
        // undici's codes (UND_ERR_*), or the DOMException's name (TimeoutError) for our deadline.
        const { code, name } = error as { code?: unknown; name?: string };
        const kind = typeof code === 'string' ? code : (name ?? String(error));
        answers.push({ sentMs, latencyMs: performance.now() - sentMs, status: 0, error: kind });
      })
      .finally(() => {
        inFlight--;
      });
  };
  const generator = createLoadGenerator([{ rps, offer }]);
  generator.start();
  return {
    answers,
    offeredMs,
    get issued() {
      return generator.issued[0]!;
    },
    async stop() {
      if (pool.destroyed) return;
      generator.stop();
      const deadline = performance.now() + REQUEST_TIMEOUT_MS + 1_000;
      while (inFlight > 0 && performance.now() < deadline) await sleep(20);
      await pool.destroy();
    },
  };
}

const between = (answers: readonly Answer[], fromMs: number, toMs: number) =>
  answers.filter((a) => a.sentMs >= fromMs && a.sentMs < toMs);
const share = (answers: readonly Answer[], status: number) =>
  answers.length === 0 ? Number.NaN : answers.filter((a) => a.status === status).length / answers.length;
const maxLatency = (answers: readonly Answer[]) => Math.max(...answers.map((a) => a.latencyMs));
const percent = (ratio: number) => `${(100 * ratio).toFixed(1)}%`;

/**
 * Wait until every request offered in [fromMs, toMs) has settled (answered, or timed out after
 * REQUEST_TIMEOUT_MS). A share of statuses taken earlier counts the fast 429s and misses the 200s
 * still on their way through the upstream: on a loaded machine CI read 34.0% 429s in the last 2 s
 * of an outage whose applied ratio averaged 25.6% there, and with two CPU-burning processes beside
 * the suite the steady window read 54.4% against 43.8% the proxy dropped (twice in two such runs).
 */
async function settled(load: HttpLoad, fromMs: number, toMs: number): Promise<void> {
  const offered = load.offeredMs.filter((ms) => ms >= fromMs && ms < toMs).length;
  await waitFor(
    "the window's requests to settle",
    async () => (between(load.answers, fromMs, toMs).length >= offered ? true : undefined),
    { timeoutMs: REQUEST_TIMEOUT_MS + 2_000, everyMs: 20 },
  );
}

/**
 * Every request offered in [fromMs, toMs) got an HTTP answer, and only one of `statuses`. Call it
 * once the last of them is settled (answered, or timed out after REQUEST_TIMEOUT_MS).
 */
function assertAnswered(
  load: HttpLoad,
  fromMs: number,
  toMs: number,
  statuses: readonly number[],
  what: string,
  context = '',
): Answer[] {
  const offered = load.offeredMs.filter((ms) => ms >= fromMs && ms < toMs).length;
  const answers = between(load.answers, fromMs, toMs);
  const kinds = new Map<string, number>();
  for (const a of answers) {
    if (statuses.includes(a.status)) continue;
    const kind = a.error ?? `HTTP ${a.status}`;
    kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
  }
  assert.deepEqual([...kinds], [], `${what}: answers other than ${statuses.join(' or ')}${context}`);
  assert.equal(answers.length, offered, `${what}: every offered request settled${context}`);
  return answers;
}

async function startProxyProcess(
  name: string,
  dir: string,
  rules: string,
  track: (p: Promise<SpillwayProcess>) => Promise<SpillwayProcess>,
): Promise<{ process: SpillwayProcess; base: string }> {
  const configPath = join(dir, `${name}.yaml`);
  writeFileSync(configPath, rules);
  const process = await track(
    startSpillway(name, [
      'proxy',
      '--config',
      configPath,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
      '--id',
      name,
      '--log-level',
      'warn',
    ]),
  );
  const line = process.output.find((l) => l.includes('"listening"'))!;
  return { process, base: `http://${(JSON.parse(line) as { proxy: string }).proxy}` };
}

/** What the proxy did over a window, from its own counters and the ratio sampled through it. */
interface ProxyWindow {
  fromMs: number;
  toMs: number;
  /** Requests offered per second, as the proxy counted them. */
  offeredRps: number;
  /** Share of the offered requests the proxy answered 429 (drop ratio and burst guard). */
  droppedShare: number;
  /** Share dropped by the burst guard alone. */
  guardShare: number;
  /** Mean of the effective ratio (the directive's, rescaled by the proxy's own rate) sampled. */
  meanApplied: number;
  /** Mean of the directive's ratio sampled. */
  meanDirective: number;
}

function proxyWindow(readings: readonly HostReading[]): ProxyWindow {
  const first = readings[0]!;
  const last = readings.at(-1)!;
  const offered = last.offered - first.offered;
  const dropped = offered - (last.admitted - first.admitted);
  const mean = (pick: (r: HostReading) => number) =>
    readings.reduce((sum, r) => sum + pick(r), 0) / readings.length;
  return {
    fromMs: first.atMs,
    toMs: last.atMs,
    offeredRps: (1000 * offered) / (last.atMs - first.atMs),
    droppedShare: offered === 0 ? Number.NaN : dropped / offered,
    guardShare: offered === 0 ? Number.NaN : (last.guardDropped - first.guardDropped) / offered,
    meanApplied: mean((r) => r.effectiveRatio),
    meanDirective: mean((r) => r.dropRatio),
  };
}

/** Reads the proxy every 250 ms for `durationMs`. */
async function watchProxy(read: () => Promise<HostReading>, durationMs: number): Promise<HostReading[]> {
  const readings = [await read()];
  const endMs = readings[0]!.atMs + durationMs;
  while (performance.now() < endMs) {
    await sleep(250);
    readings.push(await read());
  }
  return readings;
}

const describeWindow = (w: ProxyWindow, clientShare: number) =>
  `${w.offeredRps.toFixed(0)} req/s offered, ratio applied ${w.meanApplied.toFixed(3)} (directive ${w.meanDirective.toFixed(3)}), proxy dropped ${percent(w.droppedShare)} (burst guard ${percent(w.guardShare)}), clients saw 429 on ${percent(clientShare)}`;

/**
 * A window of steady load, checked three ways. The clients' 429 share is what the proxy counted
 * it dropped; the proxy's ratio drops follow the ratio it applied; and that ratio is what the
 * limit implies for the rate offered in the same window. Each is compared within its own window
 * (2 s at 200 req/s: ~2.5 points of binomial spread), not with another window: on a loaded CI
 * machine the generator's rate, so the ratio, moves between windows (CI: a steady 429 share of
 * 64.5% against a band fixed at 25-55%, and 34.4% after restart against 44.7% before it).
 */
function assertWindowFollowsLimit(what: string, w: ProxyWindow, clientShare: number): void {
  assert.ok(
    Math.abs(clientShare - w.droppedShare) <= 0.05,
    `${what}: clients see what the proxy dropped: ${describeWindow(w, clientShare)}`,
  );
  assert.ok(
    Math.abs(w.droppedShare - w.guardShare - w.meanApplied) <= 0.08,
    `${what}: the proxy's ratio drops follow the ratio it applied: ${describeWindow(w, clientShare)}`,
  );
  const implied = Math.max(0, 1 - LIMIT_RPS / w.offeredRps);
  assert.ok(
    Math.abs(w.meanApplied - implied) <= 0.1,
    `${what}: ratio ${w.meanApplied.toFixed(3)} is what the limit implies (${implied.toFixed(3)}): ${describeWindow(w, clientShare)}`,
  );
}

const epochOf = (p: SpillwayProcess): number => {
  const line = p.output.find((l) => l.includes('"listening"'));
  return Number((JSON.parse(line!) as { epoch: number }).epoch);
};

describe('spillway proxy keeps answering when its backend fails', { timeout: 120_000 }, () => {
  it('global backend: controller and aggregator killed, the proxy holds then decays; restarted, it recovers', async (t) => {
    const fleet = new Fleet(INTERVAL_MS, LIMIT_RPS);
    const faultProxies: FaultProxy[] = [];
    const upstream = await startUpstream();
    t.after(async () => {
      await fleet.close();
      await Promise.all(faultProxies.map((p) => p.close()));
      await upstream.close();
    });

    // proxy -> [fault proxy PA] -> aggregator -> [fault proxy AC] -> controller: the fault proxies
    // keep the addresses the proxy and the aggregator were configured with across the restart.
    // They reset connections until their target listens, so the three processes start at once.
    const proxyAC = await startFaultProxy(UNREACHABLE, { mode: 'reset' });
    const proxyPA = await startFaultProxy(UNREACHABLE, { mode: 'reset' });
    faultProxies.push(proxyAC, proxyPA);
    const track = (p: Promise<SpillwayProcess>) => fleet.track(p);
    const [firstController, firstAggregator, sidecar] = await Promise.all([
      fleet.controller('ctl-1'),
      fleet.aggregator('agg-1', 'z1', [proxyAC.address]),
      startProxyProcess(
        'proxy-global',
        fleet.dir,
        `version: 1
upstream:
  url: ${upstream.url}
backend:
  kind: global
  aggregators: [${proxyPA.address}]
  zone: z1
  intervalMs: ${INTERVAL_MS}
buckets:
  - name: ${BUCKET}
    limit: ${LIMIT_RPS}
    windowSec: 1
`,
        track,
      ),
    ]);
    let controller = firstController;
    let aggregator = firstAggregator;
    proxyAC.setTarget(controller.grpc!);
    proxyAC.setMode('pass');
    proxyPA.setTarget(aggregator.grpc!);
    proxyPA.setMode('pass');
    const read = (): Promise<HostReading> => readHost('proxy', sidecar.process);
    const expectedRatio = 1 - LIMIT_RPS / OFFERED_RPS;

    const loadStartMs = performance.now();
    const load = startHttpLoad(sidecar.base, OFFERED_RPS, '/v1/pay');
    t.after(() => load.stop());

    // Steady state: the loop closed, a fresh directive, the ratio the limit implies.
    const settleStartMs = performance.now();
    await waitFor(
      'the proxy to apply the steady ratio',
      async () => {
        const r = await read();
        return Math.abs(r.effectiveRatio - expectedRatio) <= 0.05 && r.directiveAgeMs <= 2 * INTERVAL_MS
          ? true
          : undefined;
      },
      { timeoutMs: 20_000, everyMs: 100 },
    );
    const settledMs = performance.now() - settleStartMs;
    const steadyReadings = await watchProxy(read, 2_000);
    const steady = proxyWindow(steadyReadings);
    // The clients' side of the steady window is checked after the outage, once its requests have
    // settled (see settled()): waiting for them here would delay the kill past the last reading.

    // Outage: both tiers above the proxy die at once.
    const killMs = performance.now();
    // This process's stalls through the outage, for a failure's message: a request times out on a
    // timer here (see REQUEST_TIMEOUT_MS).
    const loopDelay = monitorEventLoopDelay({ resolution: 10 });
    loopDelay.enable();
    t.after(() => loopDelay.disable());
    controller.child.kill('SIGKILL');
    aggregator.child.kill('SIGKILL');
    await Promise.all([controller.exited, aggregator.exited]);
    const readings: { atMs: number; reading: HostReading }[] = [];
    while (performance.now() - killMs < OUTAGE_MS) {
      await sleep(250);
      const reading = await read();
      readings.push({ atMs: reading.atMs - killMs, reading });
    }
    const outageEndMs = performance.now();
    // Answered through the outage: checked now for every request whose deadline has passed, so a
    // proxy that waits on its control plane fails here, by its timeouts, before anything else.
    loopDelay.disable();
    const stalls = `; longest stall through the outage: this process ${(loopDelay.max / 1e6).toFixed(0)} ms, the proxy ${Math.max(...readings.map((r) => r.reading.eventLoopLagMaxMs)).toFixed(0)} ms`;
    assertAnswered(
      load,
      killMs,
      outageEndMs - REQUEST_TIMEOUT_MS - 200,
      [200, 429],
      'during the outage',
      stalls,
    );
    const health = await fetch(`http://${sidecar.process.ops}/healthz`);
    assert.equal(health.status, 200, 'the proxy reports healthy without its control plane');
    assert.ok(
      readings.at(-1)!.reading.consecutiveFailures > 0,
      'the outage was real: the proxy’s reports failed',
    );

    const held = readings[0]!.reading;
    // The applied ratio the hold keeps: the median reading before the earliest decay, not the
    // first (CI once read 0.021 first, while this process's generator stalled, and then failed
    // every reading of 0.408 against it).
    const heldReadings = readings.filter(({ atMs }) => atMs < EARLIEST_DECAY_MS - 200);
    const heldApplied = median(heldReadings.map(({ reading }) => reading.effectiveRatio));
    const last = readings.at(-1)!;
    // Decay runs linearly over DECAY_MS from between EARLIEST and LATEST_DECAY_MS, so at the end of
    // the outage the ratio lies between these two fractions of the held one.
    const most = 1 - Math.max(0, last.atMs - LATEST_DECAY_MS) / DECAY_MS;
    const least = 1 - (last.atMs - EARLIEST_DECAY_MS) / DECAY_MS;
    const decayedFraction = last.reading.effectiveRatio / heldApplied;
    // The same seen from the clients, once the outage's requests have settled: the 429 share of
    // each second of the outage, and of its first and last two seconds (400 requests each: a
    // binomial spread of about 2.5 points).
    await settled(load, outageEndMs - 2_000, outageEndMs);
    const sharesPerSecond: number[] = [];
    for (let s = 0; s < OUTAGE_MS / 1000; s++) {
      sharesPerSecond.push(share(between(load.answers, killMs + s * 1000, killMs + (s + 1) * 1000), 429));
    }
    const heldShare = share(between(load.answers, killMs, killMs + 2_000), 429);
    const lastShare = share(between(load.answers, outageEndMs - 2_000, outageEndMs), 429);
    await settled(load, steady.fromMs, steady.toMs);
    const steadyShare = share(between(load.answers, steady.fromMs, steady.toMs), 429);
    assertWindowFollowsLimit('steady', steady, steadyShare);
    t.diagnostic(`settled in ${settledMs.toFixed(0)} ms; steady 2 s: ${describeWindow(steady, steadyShare)}`);
    t.diagnostic(
      `ratio held ${heldApplied.toFixed(3)} → ${last.reading.effectiveRatio.toFixed(3)} after ${last.atMs.toFixed(0)} ms (${percent(decayedFraction)} of held; policy bounds ${percent(least)}–${percent(most)}); 429 share first 2 s ${percent(heldShare)}, last 2 s ${percent(lastShare)}`,
    );
    t.diagnostic(`429 share per second of the outage: ${sharesPerSecond.map(percent).join(', ')}`);
    t.diagnostic(
      `applied ratio in the steady window (every 250 ms): ${steadyReadings.map((r) => r.effectiveRatio.toFixed(3)).join(' ')}`,
    );
    t.diagnostic(
      `applied ratio through the outage (every 250 ms): ${readings.map((r) => r.reading.effectiveRatio.toFixed(3)).join(' ')}`,
    );

    // Held: no directive can arrive, and until the earliest decay the applied ratio is the last one
    // (10%: local rescale by the proxy's own rate, which wobbles on a loaded machine).
    for (const { atMs, reading } of readings) {
      assert.equal(
        reading.dropRatio,
        held.dropRatio,
        `no directive through the outage (${atMs.toFixed(0)} ms)`,
      );
      if (
        atMs < EARLIEST_DECAY_MS - 200 &&
        Math.abs(reading.effectiveRatio - heldApplied) > 0.1 * heldApplied
      ) {
        // Local rescale follows the proxy's own rate: a reading off the held one is excused only when
        // the generator in this process was itself off its rate, by over 25% (2.5 Poisson standard
        // deviations) in a report window before the reading, as when it stalls and catches up.
        const offeredOff = [1, 2].some((windowsBack) => {
          const toMs = killMs + atMs - (windowsBack - 1) * INTERVAL_MS;
          const offered = load.offeredMs.filter((ms) => ms >= toMs - INTERVAL_MS && ms < toMs).length;
          return (
            Math.abs(offered - (OFFERED_RPS * INTERVAL_MS) / 1000) > (0.25 * OFFERED_RPS * INTERVAL_MS) / 1000
          );
        });
        assert.ok(
          offeredOff,
          `ratio held at ${atMs.toFixed(0)} ms: ${reading.effectiveRatio} vs ${heldApplied}, the load on its rate`,
        );
        t.diagnostic(
          `excused: ${reading.effectiveRatio.toFixed(3)} at ${atMs.toFixed(0)} ms, the load off its rate`,
        );
      }
    }
    assert.ok(
      decayedFraction <= most + 0.1 && decayedFraction >= least - 0.1,
      `after ${last.atMs.toFixed(0)} ms the ratio is ${percent(decayedFraction)} of the held one, expected ${percent(least)}–${percent(most)}`,
    );
    // Held as it was before the kill: the directive held through the outage is one the steady window
    // ran on (the last one, read every 250 ms until the kill; 10% and 0.02 of margin for one that
    // arrived between the last reading and the kill). The directive, not the ratio applied: local
    // rescale moves the applied one with the proxy's own rate, which an open-loop generator in this
    // loaded test process moves beyond Poisson noise when it stalls and catches up (with one
    // reporter, the fleet total moves with it). Compared with the steady window's applied range,
    // CI failed a proxy that held 0.317 after 0.386–0.416, all through the hold (and once 0.328
    // after a mean of 0.404). That the ratio applied is what the clients see is checked next.
    const directivesBefore = steadyReadings.map((r) => r.dropRatio);
    const lowestBefore = Math.min(...directivesBefore);
    const highestBefore = Math.max(...directivesBefore);
    assert.ok(
      held.dropRatio >= 0.9 * lowestBefore - 0.02 && held.dropRatio <= 1.1 * highestBefore + 0.02,
      `directive held: ${held.dropRatio.toFixed(3)} after ${lowestBefore.toFixed(3)}–${highestBefore.toFixed(3)} steady`,
    );
    const heldWindow = proxyWindow(readings.filter((r) => r.atMs <= 2_000).map((r) => r.reading));
    const heldWindowShare = share(between(load.answers, heldWindow.fromMs, heldWindow.toMs), 429);
    assert.ok(
      Math.abs(heldWindowShare - heldWindow.droppedShare) <= 0.05 &&
        Math.abs(heldWindow.droppedShare - heldWindow.guardShare - heldWindow.meanApplied) <= 0.08,
      `held: ${describeWindow(heldWindow, heldWindowShare)}`,
    );
    // The clients see what the proxy applies: in the last 2 s the 429 share follows the decaying
    // ratio read from the proxy in the same window (400 requests: ~2.5 points of binomial spread).
    // Compared with a fixed fraction of the held share instead, a decay that starts late within its
    // bounds on a loaded machine failed a correct proxy (CI: 30.1% after 38.5%).
    const lastApplied = readings.filter((r) => r.atMs >= OUTAGE_MS - 2_000);
    const appliedLast =
      lastApplied.reduce((sum, r) => sum + r.reading.effectiveRatio, 0) / lastApplied.length;
    assert.ok(
      Math.abs(lastShare - appliedLast) <= 0.08,
      `429 share in the last 2 s ${percent(lastShare)} follows the applied ratio ${percent(appliedLast)}`,
    );
    assert.ok(
      lastShare <= heldShare - 0.05,
      `429 share decays: ${percent(lastShare)} after ${percent(heldShare)}`,
    );

    // Restart both tiers (new processes, new ports, a new epoch) behind the same addresses.
    const restartMs = performance.now();
    [controller, aggregator] = await Promise.all([
      fleet.controller('ctl-2'),
      fleet.aggregator('agg-2', 'z1', [proxyAC.address]),
    ]);
    proxyAC.setTarget(controller.grpc!);
    proxyPA.setTarget(aggregator.grpc!);
    const listeningMs = performance.now() - restartMs;
    const epoch = epochOf(controller);
    const backMs = performance.now();
    // Recovered: a fresh directive of the new epoch whose ratio is back near the one the steady
    // window ran on. The directive's ratio, not the effective one: local rescale moves the latter
    // with every wobble of the generator's rate, and a band on it measured that wobble (CI: 11.6 s).
    // Where the time went, for the diagnostic and a failure's message: the first successful report
    // after the restart, the first reading on the new epoch, and each reading after that.
    const before = await read();
    const okBefore = before.reportsOk.get(proxyPA.address) ?? 0;
    let reportsUntilRecovered = new Map<string, number>();
    let firstReportMs: number | undefined;
    let newEpochMs: number | undefined;
    const onNewEpoch: string[] = [];
    await waitFor(
      'the steady ratio on the new epoch',
      async () => {
        const r = await read();
        const atMs = r.atMs - backMs;
        reportsUntilRecovered = new Map(
          [...r.reportsByResult].map(([result, n]) => [
            result,
            n - (before.reportsByResult.get(result) ?? 0),
          ]),
        );
        if (firstReportMs === undefined && (r.reportsOk.get(proxyPA.address) ?? 0) > okBefore)
          firstReportMs = atMs;
        if (r.epoch !== epoch) return undefined;
        newEpochMs ??= atMs;
        if (onNewEpoch.length < 40) {
          onNewEpoch.push(
            `${atMs.toFixed(0)}: ${r.dropRatio.toFixed(3)} (age ${r.directiveAgeMs.toFixed(0)})`,
          );
        }
        return r.directiveAgeMs <= 2 * INTERVAL_MS && Math.abs(r.dropRatio - steady.meanDirective) <= 0.1
          ? true
          : undefined;
      },
      { timeoutMs: 20_000, everyMs: 50 },
    );
    const recoveryMs = performance.now() - backMs;
    const aggregatorSeries = await scrape(aggregator.ops);
    const aggregatorCounts = [
      'forwards',
      'forward_failures',
      'cold_forwards',
      'reconnect_forwards',
      'withheld_directives',
    ]
      .map((name) => `${name} ${aggregatorSeries.get(`spillway_aggregator_${name}_total`) ?? 0}`)
      .join(', ');
    const reportsSent = [...reportsUntilRecovered.values()].reduce((a, b) => a + b, 0);
    const reportResults = [...reportsUntilRecovered].map(([result, n]) => `${n} ${result}`).join(', ');
    const milestones = `${reportsSent} reports until then (${reportResults}); first report ok at ${firstReportMs?.toFixed(0)} ms, new epoch at ${newEpochMs?.toFixed(0)} ms; the new aggregator: ${aggregatorCounts}; steady directive ${steady.meanDirective.toFixed(3)}; on the new epoch: ${onNewEpoch.join(', ')}`;
    const recovered = proxyWindow(await watchProxy(read, 2_000));
    await settled(load, recovered.fromMs, recovered.toMs);
    const recoveredShare = share(between(load.answers, recovered.fromMs, recovered.toMs), 429);
    await load.stop();

    const all = assertAnswered(load, 0, Number.POSITIVE_INFINITY, [200, 429], 'the whole run');
    const duringOutage = assertAnswered(load, killMs, outageEndMs, [200, 429], 'the whole outage', stalls);
    t.diagnostic(
      `outage ${OUTAGE_MS} ms: ${duringOutage.length} requests, all answered 200 or 429 (no error, 5xx or timeout), latency max ${maxLatency(duringOutage).toFixed(1)} ms${stalls}`,
    );
    t.diagnostic(
      `restart: listening after ${listeningMs.toFixed(0)} ms, steady ratio on the new epoch ${recoveryMs.toFixed(0)} ms later (${(recoveryMs / INTERVAL_MS).toFixed(1)} intervals); the 2 s after: ${describeWindow(recovered, recoveredShare)}; ${all.length} requests in ${((performance.now() - loadStartMs) / 1000).toFixed(1)} s, every one 200 or 429`,
    );
    // With both tiers new, the loop needs two reports: the proxy reports when its connection is back,
    // the new aggregator forwards at once, the proxy's next report brings the ratio; typically 1-2
    // intervals. Each tier's reconnect backoff is capped at one interval (+20% jitter), so up to two
    // reports may fail while the proxy's channel waits, and up to two more may be answered without
    // a ratio while the new aggregator's channel to the controller waits out a backoff: it starts
    // before this test points its fault proxy at the new controller, so its first forwards fail
    // (typically 2 failed forwards, then 1 reconnect forward). The bound is on reports, 6,
    // which a starved machine delays but does not multiply, and, as a regression bound, on time:
    // 6 intervals failed CI at 7.1 s on a run 1.5x slower than usual, before these milestones were
    // recorded, so the wall-clock bound is 16 intervals (the backoff grpc-js would otherwise reach,
    // 5 s, plus the reports and a margin) and a slow recovery is printed with where its time went.
    t.diagnostic(`recovery: ${milestones}`);
    assert.ok(reportsSent <= 6, `recovered after ${reportsSent} reports: ${milestones}`);
    assert.ok(recoveryMs <= 16 * INTERVAL_MS, `recovered in ${recoveryMs.toFixed(0)} ms: ${milestones}`);
    assertWindowFollowsLimit('recovered', recovered, recoveredShare);
  });

  it('redis backend: Redis paused 2 s, fail-open answers within timeoutMs, fail-closed answers 429', async (t) => {
    if (!requireRedis(t)) return;
    await redisPause(t);
  });
});

/** Redis's per-call bound in the rules file, and what may come on top of it on a loaded machine. */
const REDIS_TIMEOUT_MS = 50;
const LATENCY_SLACK_MS = 250;
const PAUSE_MS = 2_000;
const REDIS_LIMIT = 90;
const REDIS_RPS = 150;
/** Load kept up after SIGCONT, to see the limits apply again. */
const AFTER_RESUME_MS = 3_000;
/**
 * Right after SIGCONT, Redis runs the scripts of the timed-out calls sitting in its socket buffer;
 * each is past its deadline on the Redis clock and changes nothing (docs/redis-operations.md,
 * "Timeouts no longer count"), so the window starts empty: the first ~90 requests pass at once and
 * the rest of that second is rejected. The tail figures start after it.
 */
const REFILL_MS = 1_500;

async function redisPause(t: TestContext): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-proxy-faults-'));
  const started: SpillwayProcess[] = [];
  let redis: RedisServer | undefined;
  const upstream = await startUpstream();
  t.after(async () => {
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    await redis?.stop();
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
  });
  redis = await startRedis();
  const track = async (p: Promise<SpillwayProcess>) => {
    const process = await p;
    started.push(process);
    return process;
  };
  const rules = (failPolicy: 'open' | 'closed') => `version: 1
upstream:
  url: ${upstream.url}
backend:
  kind: redis
  url: ${redis!.url}
  algorithm: sliding-counter
  timeoutMs: ${REDIS_TIMEOUT_MS}
  failPolicy: ${failPolicy}
  prefix: fail-${failPolicy}
buckets:
  - name: api
    limit: ${REDIS_LIMIT}
    windowSec: 1
`;
  const [open, closed] = await Promise.all([
    startProxyProcess('proxy-open', dir, rules('open'), track),
    startProxyProcess('proxy-closed', dir, rules('closed'), track),
  ]);
  const decisions = async (p: SpillwayProcess) => {
    const series = await scrape(p.ops);
    const get = (result: string) =>
      series.get(`spillway_proxy_decisions_total{bucket="api",result="${result}"}`) ?? 0;
    return { rejected: get('rejected'), failOpen: get('fail_open'), failClosed: get('fail_closed') };
  };
  // The connection to Redis opens in the background; decide nothing until both proxies limit.
  const loadOpen = startHttpLoad(open.base, REDIS_RPS, '/v1/items');
  const loadClosed = startHttpLoad(closed.base, REDIS_RPS, '/v1/items');
  t.after(async () => {
    await Promise.all([loadOpen.stop(), loadClosed.stop()]);
  });
  await waitFor(
    'both proxies limiting through Redis',
    async () =>
      (await decisions(open.process)).rejected > 0 && (await decisions(closed.process)).rejected > 0
        ? true
        : undefined,
    { timeoutMs: 10_000, everyMs: 100 },
  );
  const warmMs = performance.now();
  const warm = { open: await decisions(open.process), closed: await decisions(closed.process) };
  await sleep(1_500);
  const steadyFrom = performance.now() - 1_000;
  const before = { open: await decisions(open.process), closed: await decisions(closed.process) };

  const pauseMs = performance.now();
  redis.pause();
  await sleep(PAUSE_MS);
  const resumeMs = performance.now();
  redis.resume();
  await sleep(500);
  const afterResume = { open: await decisions(open.process), closed: await decisions(closed.process) };
  await sleep(AFTER_RESUME_MS - 500);
  const endMs = performance.now();
  const atEnd = { open: await decisions(open.process), closed: await decisions(closed.process) };
  await Promise.all([loadOpen.stop(), loadClosed.stop()]);

  // Requests offered while Redis cannot answer before their deadline. The proxy may take its share
  // of the latency slack to put a request's call on the wire on a loaded machine, so the window
  // ends that much earlier too: with only the call's timeout as margin, clean-clone CI (5119ae4)
  // saw one request of 295 in the window admitted by Redis on the fail-closed proxy (latency max
  // 121 ms against a 50 ms timeout), most likely one whose call reached Redis after SIGCONT.
  const pausedUntilMs = resumeMs - REDIS_TIMEOUT_MS - LATENCY_SLACK_MS;
  const paused = (load: HttpLoad) => between(load.answers, pauseMs, pausedUntilMs);
  const pausedOpen = paused(loadOpen);
  const pausedClosed = paused(loadClosed);
  const steadyOpen = between(loadOpen.answers, steadyFrom, pauseMs);
  const tailOpen = between(loadOpen.answers, resumeMs + REFILL_MS, endMs);
  const tailClosed = between(loadClosed.answers, resumeMs + REFILL_MS, endMs);
  const halfSeconds = (load: HttpLoad) =>
    Array.from({ length: (AFTER_RESUME_MS / 500) | 0 }, (_, i) =>
      percent(share(between(load.answers, resumeMs + i * 500, resumeMs + (i + 1) * 500), 429)),
    ).join(', ');

  t.diagnostic(
    `steady (fail-open proxy): 429 share ${percent(share(steadyOpen, 429))}, latency max ${maxLatency(steadyOpen).toFixed(1)} ms`,
  );
  t.diagnostic(
    `Redis paused ${PAUSE_MS} ms: fail-open proxy ${pausedOpen.length} requests, all 200: ${pausedOpen.every((a) => a.status === 200)}, latency max ${maxLatency(pausedOpen).toFixed(1)} ms (timeoutMs ${REDIS_TIMEOUT_MS}), fail_open decisions +${afterResume.open.failOpen - before.open.failOpen}`,
  );
  t.diagnostic(
    `fail-closed proxy ${pausedClosed.length} requests, all 429: ${pausedClosed.every((a) => a.status === 429)}, latency max ${maxLatency(pausedClosed).toFixed(1)} ms, fail_closed decisions +${afterResume.closed.failClosed - before.closed.failClosed}`,
  );
  t.diagnostic(
    `429 share per 500 ms after SIGCONT: fail-open proxy ${halfSeconds(loadOpen)}; fail-closed proxy ${halfSeconds(loadClosed)}`,
  );
  t.diagnostic(
    `after SIGCONT (+${REFILL_MS / 1000} s to +${((endMs - resumeMs) / 1000).toFixed(1)} s): fail-open proxy 429 share ${percent(share(tailOpen, 429))}, fail-closed proxy 429 share ${percent(share(tailClosed, 429))}; fail_open decisions in that time +${atEnd.open.failOpen - afterResume.open.failOpen}`,
  );

  assertAnswered(loadOpen, 0, Number.POSITIVE_INFINITY, [200, 429], 'fail-open proxy');
  assertAnswered(loadClosed, 0, Number.POSITIVE_INFINITY, [200, 429], 'fail-closed proxy');
  assert.ok(
    pausedOpen.length >= (0.8 * REDIS_RPS * (pausedUntilMs - pauseMs)) / 1000,
    `load during the pause: ${pausedOpen.length}`,
  );
  // What this machine adds to a request with Redis healthy is not charged to the timeout: on a VM
  // losing CPU time to steal, clean-clone CI (9eb42a2) saw one request of the pause answered in
  // 391 ms (bound 300 ms) with a steady-phase latency max of 123 ms, and another run a steady max of
  // 312 ms. A call that waited for Redis instead would take the rest of the 2 s pause.
  const machineMs = maxLatency(steadyOpen);
  const latencyBoundMs = REDIS_TIMEOUT_MS + LATENCY_SLACK_MS + machineMs;
  for (const a of pausedOpen) {
    assert.equal(a.status, 200, 'fail open: admitted while Redis is paused');
    assert.ok(
      a.latencyMs <= latencyBoundMs,
      `answered in ${a.latencyMs.toFixed(1)} ms, bound ${REDIS_TIMEOUT_MS} + ${LATENCY_SLACK_MS} + ${machineMs.toFixed(1)} (steady max)`,
    );
  }
  for (const a of pausedClosed) {
    assert.equal(a.status, 429, 'fail closed: rejected while Redis is paused');
    assert.equal(a.retryAfter, '1', 'fail closed: Retry-After of FAIL_CLOSED_RETRY_AFTER_MS');
    assert.ok(a.latencyMs <= latencyBoundMs, `answered in ${a.latencyMs.toFixed(1)} ms`);
  }
  // Every request of the pause was decided by the fail policy, and counted as such.
  assert.ok(afterResume.open.failOpen - before.open.failOpen >= pausedOpen.length);
  assert.ok(afterResume.closed.failClosed - before.closed.failClosed >= pausedClosed.length);
  // Limits apply again: Redis decides, and rejects past the limit. A call may still time out now and
  // then on a loaded machine (50 ms is tight): as often as it did in the steady phase before the
  // pause, twice over, or 10% of the requests, whichever is more (it was 2%: clean-clone CI at
  // 6cd2632, on a VM losing CPU time to steal, saw 26 of 405, with a steady-phase latency max of
  // 312 ms). A proxy still stuck on its fail policy would decide them all.
  const steadyCount = (load: HttpLoad) => between(load.answers, warmMs, pauseMs).length;
  const steadyOpenShare = (before.open.failOpen - warm.open.failOpen) / Math.max(1, steadyCount(loadOpen));
  const steadyClosedShare =
    (before.closed.failClosed - warm.closed.failClosed) / Math.max(1, steadyCount(loadClosed));
  const lateOpen = between(loadOpen.answers, resumeMs + 500, endMs).length;
  const lateClosed = between(loadClosed.answers, resumeMs + 500, endMs).length;
  t.diagnostic(
    `fail-policy decisions with Redis healthy before the pause: fail-open proxy ${percent(steadyOpenShare)}, fail-closed proxy ${percent(steadyClosedShare)}`,
  );
  assert.ok(
    atEnd.open.failOpen - afterResume.open.failOpen <=
      Math.max(3, 0.1 * lateOpen, 2 * steadyOpenShare * lateOpen),
    `Redis decides again: ${atEnd.open.failOpen - afterResume.open.failOpen} fail-open decisions of ${lateOpen} requests after the resume`,
  );
  assert.ok(
    atEnd.closed.failClosed - afterResume.closed.failClosed <=
      Math.max(3, 0.1 * lateClosed, 2 * steadyClosedShare * lateClosed),
    `Redis decides again: ${atEnd.closed.failClosed - afterResume.closed.failClosed} fail-closed decisions of ${lateClosed} requests after the resume`,
  );
  // Nothing of the pause is charged after it: before per-call deadlines, the backlog of timed-out
  // calls ran on resume and 51–100% of the first 500 ms got 429 (steady ~40%).
  const firstAfterResume = share(between(loadOpen.answers, resumeMs, resumeMs + 500), 429);
  assert.ok(
    firstAfterResume <= share(steadyOpen, 429) + 0.05,
    `fail-open proxy 429 share in the first 500 ms after SIGCONT ${percent(firstAfterResume)} (steady ${percent(share(steadyOpen, 429))})`,
  );
  assert.ok(atEnd.open.rejected > afterResume.open.rejected, 'the fail-open proxy limits again');
  assert.ok(
    share(tailOpen, 429) > 0.15,
    `fail-open proxy 429 share after the resume ${percent(share(tailOpen, 429))}`,
  );
  assert.ok(
    share(tailClosed, 200) > 0.3,
    `fail-closed proxy admits again: ${percent(share(tailClosed, 200))}`,
  );
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}
