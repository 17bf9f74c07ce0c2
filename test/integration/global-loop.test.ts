import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from './spillway-process.js';

// The whole GRL loop as an operator runs it: one controller, two zone aggregators and four host
// processes on loopback, speaking gRPC, each with its own /metrics. Load is uneven across hosts and
// zones and sums to 1.5x the limit; the assertion is on what the hosts themselves admitted.

const ENFORCE = 'payments:charge';
const SHADOW = 'search';
const LIMIT_RPS = 400;
const SHADOW_LIMIT_RPS = 100;
const HOSTS = [
  { id: 'h1', zone: 'z1', enforceRps: 300, shadowRps: 80 },
  { id: 'h2', zone: 'z1', enforceRps: 50, shadowRps: 20 },
  { id: 'h3', zone: 'z2', enforceRps: 150, shadowRps: 60 },
  { id: 'h4', zone: 'z2', enforceRps: 100, shadowRps: 40 },
];
const OFFERED_RPS = HOSTS.reduce((n, h) => n + h.enforceRps, 0); // 600
const SHADOW_OFFERED_RPS = HOSTS.reduce((n, h) => n + h.shadowRps, 0); // 200
const INTERVAL_MS = 500;
const MEASURE_MS = 6_000;

interface HostReading {
  atMs: number;
  series: Map<string, number>;
}

/** Per-host rates between two readings, summed over hosts (each host over its own elapsed time). */
function fleetRate(before: HostReading[], later: HostReading[], name: string, bucket: string): number {
  const key = seriesKey(name, { bucket });
  return later.reduce((sum, reading, i) => {
    const earlier = before[i]!;
    const delta = (reading.series.get(key) ?? 0) - (earlier.series.get(key) ?? 0);
    return sum + delta / ((reading.atMs - earlier.atMs) / 1000);
  }, 0);
}

describe('global rate limiter across real processes', { timeout: 120_000 }, () => {
  const started: SpillwayProcess[] = [];
  let dir = '';
  let controller: SpillwayProcess;
  let aggregators: SpillwayProcess[] = [];
  let hosts: SpillwayProcess[] = [];

  const track = async (promise: Promise<SpillwayProcess>) => {
    const p = await promise;
    started.push(p);
    return p;
  };
  const readHosts = () =>
    Promise.all(
      hosts.map(
        async (h): Promise<HostReading> => ({ atMs: performance.now(), series: await scrape(h.ops) }),
      ),
    );

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-loop-'));
    const limitsPath = join(dir, 'limits.yaml');
    writeFileSync(
      limitsPath,
      [
        'version: 1',
        `intervalMs: ${INTERVAL_MS}`,
        'buckets:',
        `  - key: "${ENFORCE}"`,
        `    limitRps: ${LIMIT_RPS}`,
        '    mode: enforce',
        `  - key: "${SHADOW}"`,
        `    limitRps: ${SHADOW_LIMIT_RPS}`,
        '    mode: shadow',
        '',
      ].join('\n'),
    );
    const anyPort = ['--ops', '127.0.0.1:0'];
    controller = await track(
      startSpillway('controller', [
        'controller',
        '--config',
        limitsPath,
        '--listen',
        '127.0.0.1:0',
        ...anyPort,
        '--id',
        'ctl',
      ]),
    );
    aggregators = await Promise.all(
      ['z1', 'z2'].map((zone) =>
        track(
          startSpillway(`aggregator-${zone}`, [
            'aggregator',
            '--zone',
            zone,
            '--parent',
            controller.grpc!,
            '--listen',
            '127.0.0.1:0',
            ...anyPort,
            '--interval-ms',
            String(INTERVAL_MS),
            '--id',
            `agg-${zone}`,
          ]),
        ),
      ),
    );
    hosts = await Promise.all(
      HOSTS.map((h) =>
        track(
          startSpillway(h.id, [
            'host',
            '--aggregator',
            aggregators[h.zone === 'z1' ? 0 : 1]!.grpc!,
            '--zone',
            h.zone,
            '--bucket',
            `${ENFORCE}=${h.enforceRps},${SHADOW}=${h.shadowRps}`,
            ...anyPort,
            '--interval-ms',
            String(INTERVAL_MS),
            '--id',
            h.id,
            '--log-level',
            'warn',
          ]),
        ),
      ),
    );
  });

  after(async () => {
    // Runs on failure too: no process outlives the test.
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('settles: every host holds a drop ratio and admits about the limit', async () => {
    await waitFor('directives at every host', async () => {
      const readings = await readHosts();
      const ready = readings.every(
        (r) =>
          (r.series.get(seriesKey('spillway_drop_ratio', { bucket: ENFORCE })) ?? 0) > 0.1 &&
          r.series.get(seriesKey('spillway_bucket_shadow', { bucket: SHADOW })) === 1,
      );
      return ready ? true : undefined;
    });
    // Stable: two consecutive one-second windows each within 10% of the limit.
    let inBand = 0;
    await waitFor(
      'a stable admitted rate',
      async () => {
        const first = await readHosts();
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        const rate = fleetRate(first, await readHosts(), 'spillway_admitted_total', ENFORCE);
        inBand = Math.abs(rate - LIMIT_RPS) <= 0.1 * LIMIT_RPS ? inBand + 1 : 0;
        return inBand >= 2 ? true : undefined;
      },
      { timeoutMs: 30_000, everyMs: 0 },
    );
  });

  it(`admits ${LIMIT_RPS} rps ±5% fleet-wide from ${OFFERED_RPS} rps offered, and shadow only counts`, async (t) => {
    const first = await readHosts();
    await new Promise((resolve) => setTimeout(resolve, MEASURE_MS));
    const last = await readHosts();

    const offered = fleetRate(first, last, 'spillway_offered_total', ENFORCE);
    const admitted = fleetRate(first, last, 'spillway_admitted_total', ENFORCE);
    const summary = `offered ${offered.toFixed(1)} rps, admitted ${admitted.toFixed(1)} rps over ${MEASURE_MS} ms`;
    // If the load generators could not keep their rates the admitted figure would mean nothing.
    assert.ok(
      Math.abs(offered - OFFERED_RPS) <= 0.05 * OFFERED_RPS,
      `hosts did not offer ${OFFERED_RPS} rps: ${summary}`,
    );
    assert.ok(
      Math.abs(admitted - LIMIT_RPS) <= 0.05 * LIMIT_RPS,
      `admitted not within 5% of ${LIMIT_RPS}: ${summary}`,
    );

    const shadowOffered = fleetRate(first, last, 'spillway_offered_total', SHADOW);
    const shadowAdmitted = fleetRate(first, last, 'spillway_admitted_total', SHADOW);
    const wouldDrop = fleetRate(first, last, 'spillway_would_drop_total', SHADOW);
    const expectedWouldDrop = shadowOffered - SHADOW_LIMIT_RPS;
    t.diagnostic(
      `${ENFORCE}: ${summary}; ${SHADOW}: offered ${shadowOffered.toFixed(1)}, would-drop ${wouldDrop.toFixed(1)} rps`,
    );
    for (const reading of last) {
      assert.equal(
        reading.series.get(seriesKey('spillway_dropped_total', { bucket: SHADOW })),
        0,
        'shadow never drops',
      );
    }
    assert.ok(Math.abs(shadowAdmitted - shadowOffered) < 1e-9, 'shadow admits everything');
    assert.ok(
      Math.abs(shadowOffered - SHADOW_OFFERED_RPS) <= 0.05 * SHADOW_OFFERED_RPS,
      `shadow offered ${shadowOffered}`,
    );
    assert.ok(
      Math.abs(wouldDrop - expectedWouldDrop) <= 0.1 * expectedWouldDrop,
      `would-drop ${wouldDrop.toFixed(1)} rps, expected ${expectedWouldDrop.toFixed(1)} ±10%`,
    );

    // Real reporters' windows end on their clock: a healthy fleet's reports are not taken for late
    // ones. (A bound, not zero: a receiver stalled for an interval on a loaded machine may refuse
    // the reports that waited through the stall.)
    for (const [tier, processes] of [
      ['aggregator', aggregators],
      ['controller', [controller]],
    ] as const) {
      for (const p of processes) {
        const series = await scrape(p.ops);
        const reports = series.get(`spillway_${tier}_reports_total`) ?? 0;
        const late = series.get(`spillway_${tier}_late_reports_total`) ?? Number.NaN;
        t.diagnostic(`${p.name}: ${late} late of ${reports} reports`);
        assert.ok(reports > 0 && late <= 0.05 * reports, `${p.name}: ${late} late of ${reports} reports`);
      }
    }
  });

  it('hosts keep serving when the controller is killed', async () => {
    controller.child.kill('SIGKILL');
    await controller.exited;
    const first = await readHosts();
    const aggregatorFailures = await Promise.all(
      aggregators.map(
        async (a) => (await scrape(a.ops)).get('spillway_aggregator_forward_failures_total') ?? 0,
      ),
    );
    // Long enough for the directives to go stale (TTL 4 intervals) and the stale policy to act.
    await waitFor(
      'aggregators to notice the dead controller while hosts keep admitting',
      async () => {
        const failuresNow = await Promise.all(
          aggregators.map(
            async (a) => (await scrape(a.ops)).get('spillway_aggregator_forward_failures_total') ?? 0,
          ),
        );
        const elapsedMs = performance.now() - first[0]!.atMs;
        return failuresNow.every((n, i) => n > aggregatorFailures[i]!) && elapsedMs > 4 * INTERVAL_MS + 500
          ? true
          : undefined;
      },
      { timeoutMs: 15_000 },
    );
    const later = await readHosts();
    HOSTS.forEach((h, i) => {
      const key = seriesKey('spillway_admitted_total', { bucket: ENFORCE });
      const admittedSince = later[i]!.series.get(key)! - first[i]!.series.get(key)!;
      const seconds = (later[i]!.atMs - first[i]!.atMs) / 1000;
      // At least the share the last directive allowed (ratio ~1/3 dropped), with slack for timing.
      assert.ok(
        admittedSince >= 0.5 * h.enforceRps * seconds,
        `${h.id} admitted ${admittedSince} in ${seconds.toFixed(1)} s`,
      );
    });
    for (const p of [...hosts, ...aggregators]) {
      assert.ok(p.running, `${p.name} is still running`);
      const health = await fetch(`http://${p.ops}/healthz`);
      assert.equal(health.status, 200, `${p.name} healthy`);
    }
  });

  it('SIGTERM stops hosts and aggregators cleanly (exit code 0)', async () => {
    const codes = await Promise.all([...hosts, ...aggregators].map((p) => stopSpillway(p, 10_000)));
    assert.deepEqual(
      codes,
      [...hosts, ...aggregators].map(() => 0),
      [...hosts, ...aggregators].map((p) => `${p.name}:\n${p.output.slice(-5).join('\n')}`).join('\n'),
    );
  });
});
