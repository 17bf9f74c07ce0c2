import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { clipScale, perHostCapRps, validateReporterCap } from '../../src/control/reporter-cap.js';
import { ManualClock } from '../../src/core/clock.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { addAggregatorMetrics } from '../../src/ops/aggregator-metrics.js';
import { addControllerMetrics } from '../../src/ops/controller-metrics.js';
import { createMetrics, type SpillwayMetrics } from '../../src/ops/metrics.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { call, hostReport } from '../control/report-fixtures.js';

// One host that lies about its offered load (1e9 rps) must not drive the fleet's drop ratio to ~1:
// with a reporter cap it counts as at most k honest hosts (or the hard per-host bound).

const LIMIT_RPS = 300;
const HONEST_RPS = [100, 120, 80, 100];
const LIE_RPS = 1e9;

function controllerWith(reporterCap?: Parameters<typeof createController>[0]['reporterCap']) {
  const clock = new ManualClock(1_700_000_000_000);
  const controller = createController({
    id: 'ctl',
    scheduler: clock,
    reporterCap,
    config: {
      version: 1,
      intervalMs: 1000,
      ttlMs: 4000,
      ratioPolicy: { kind: 'plain' },
      buckets: [{ key: 'pay', limitRps: LIMIT_RPS, mode: 'enforce', scope: 'global' }],
    },
  });
  return { clock, controller };
}

function feed(handler: Parameters<typeof call>[0], endMs: number, liar = true): void {
  for (const [i, rps] of HONEST_RPS.entries()) {
    call(
      handler,
      hostReport({ id: `h${i}`, sequence: 1, endMs, buckets: [{ bucket: 'pay', offered: rps }] }),
    );
  }
  if (liar) {
    call(
      handler,
      hostReport({ id: 'liar', sequence: 1, endMs, buckets: [{ bucket: 'pay', offered: LIE_RPS }] }),
    );
  }
}

function ratioOf(controller: ReturnType<typeof createController>): number {
  return controller.snapshot().buckets.find((b) => b.key === 'pay')!.dropRatio;
}

describe('reporter cap: one lying host', () => {
  it('without a cap, the lie drives the ratio to ~1 (what the cap prevents)', () => {
    const { clock, controller } = controllerWith();
    feed(controller.handleReport, clock.nowMs());
    controller.tick();
    assert.ok(ratioOf(controller) > 0.999, `ratio ${ratioOf(controller)}`);
  });

  it('medianMultiple: the liar counts as k times the median host', () => {
    const { clock, controller } = controllerWith({ medianMultiple: 4 });
    feed(controller.handleReport, clock.nowMs());
    controller.tick();
    // Per-host rates sorted: 80, 100, 100, 120, 1e9; lower median 100; the liar counts 400.
    const offered = HONEST_RPS.reduce((a, b) => a + b, 0) + 4 * 100;
    assert.equal(controller.snapshot().buckets[0]!.offeredRps, offered);
    assert.ok(Math.abs(ratioOf(controller) - (offered - LIMIT_RPS) / offered) < 1e-9);
    assert.deepEqual(controller.snapshot().counters.clippedUsages, { host: 1 });
  });

  it('honest skew under the bound is untouched (the cap never lowers honest reports)', () => {
    const { clock, controller } = controllerWith({ medianMultiple: 4 });
    feed(controller.handleReport, clock.nowMs(), false);
    controller.tick();
    assert.equal(controller.snapshot().buckets[0]!.offeredRps, 400);
    assert.deepEqual(controller.snapshot().counters.clippedUsages, {});
  });

  it('maxRps: a hard bound per host, scaled by the hosts an aggregator speaks for', () => {
    const { clock, controller } = controllerWith({ maxRps: 200 });
    feed(controller.handleReport, clock.nowMs());
    // An aggregator speaking for 10 hosts may claim 10 x 200.
    call(
      controller.handleReport,
      hostReport({
        id: 'agg',
        sequence: 1,
        endMs: clock.nowMs(),
        tier: Tier.AGGREGATOR,
        hostCount: 10,
        buckets: [{ bucket: 'pay', offered: 5000, admitted: 2500 }],
      }),
    );
    controller.tick();
    const bucket = controller.snapshot().buckets[0]!;
    assert.equal(bucket.offeredRps, 400 + 200 + 2000);
    // Admitted is scaled with offered: the aggregator's 2500 of 5000 becomes 1000 of 2000.
    assert.equal(bucket.admittedRps, 400 + 200 + 1000);
  });

  it('the aggregator clips its hosts before summing the zone', async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const sent: number[] = [];
    const parent: ControlClient = {
      target: 'p',
      report: async (request) => {
        const windowSec = Number(request.windowEndMs - request.windowStartMs) / 1000;
        sent.push(request.buckets.find((b) => b.bucket === 'pay')!.offered / windowSec);
        return {
          $typeName: 'spillway.v1.ReportResponse',
          directives: [],
          reportIntervalMs: 1000,
          epoch: 1n,
          responderId: 'p',
        };
      },
      close() {},
    };
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [parent],
      scheduler: clock,
      reporterCap: { medianMultiple: 4, floorRps: 50 },
    });
    feed(aggregator.handleReport, clock.nowMs());
    aggregator.start();
    clock.advance(1000);
    await aggregator.flush();
    await aggregator.stop();
    // Honest 400 rps plus the liar clipped to 4 x the lower median (100): 800 rps forwarded.
    assert.ok(sent.length >= 1);
    assert.ok(Math.abs(sent.at(-1)! - 800) < 1e-6, `forwarded offered ${sent.at(-1)} rps`);
    assert.ok((aggregator.snapshot().counters.clippedUsages.host ?? 0) > 0);
  });

  it('a liar claiming to speak for many hosts is counted as one host, or refused as an aggregator', () => {
    const clock = new ManualClock(1_700_000_000_000);
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [{ target: 'p', report: () => new Promise(() => {}), close() {} }],
      scheduler: clock,
      reporterCap: { medianMultiple: 4, floorRps: 50 },
    });
    feed(aggregator.handleReport, clock.nowMs(), false);
    // A host-tier report's host_count is not believed: the cap still sees one host.
    call(
      aggregator.handleReport,
      hostReport({
        id: 'liar',
        sequence: 1,
        endMs: clock.nowMs(),
        hostCount: 1_000_000,
        buckets: [{ bucket: 'pay', offered: LIE_RPS }],
      }),
    );
    const liar = aggregator.snapshot().hosts.find((h) => h.id === 'liar')!;
    assert.equal(liar.hostCount, 1);
    // Claiming the aggregator tier instead is refused: a zone aggregator's children are hosts.
    assert.throws(
      () =>
        call(
          aggregator.handleReport,
          hostReport({
            id: 'liar-2',
            sequence: 1,
            endMs: clock.nowMs(),
            tier: Tier.AGGREGATOR,
            hostCount: 1_000_000,
            buckets: [{ bucket: 'pay', offered: LIE_RPS }],
          }),
        ),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') && error.details?.field === 'tier',
    );
    assert.equal(
      aggregator.snapshot().hosts.find((h) => h.id === 'liar-2'),
      undefined,
    );
  });

  it('validates its options and computes the documented bound', () => {
    assert.throws(
      () => validateReporterCap({ medianMultiple: 0.5 }),
      (e) => isSpillwayError(e, 'ERR_SPILLWAY_INVALID_OPTION'),
    );
    assert.throws(
      () => validateReporterCap({ maxRps: -1 }),
      (e) => isSpillwayError(e, 'ERR_SPILLWAY_INVALID_OPTION'),
    );
    // A floor without the median bound it limits would be ignored in silence.
    assert.throws(
      () => validateReporterCap({ floorRps: 50, maxRps: 100 }),
      (e) =>
        isSpillwayError(e, 'ERR_SPILLWAY_INVALID_OPTION') && /medianMultiple too/.test((e as Error).message),
    );
    assert.equal(perHostCapRps({}, [1, 2, 3]), Number.POSITIVE_INFINITY);
    assert.equal(perHostCapRps({ medianMultiple: 2 }, [1, 1e9]), 2, 'lower median: a pair cannot lift it');
    assert.equal(perHostCapRps({ medianMultiple: 2, floorRps: 50 }, [1, 1e9]), 50);
    assert.equal(perHostCapRps({ medianMultiple: 2, floorRps: 50, maxRps: 10 }, [1, 1e9]), 10);
    assert.equal(clipScale(100, 1, 200), 1);
    assert.equal(clipScale(400, 1, 200), 0.5);
    assert.equal(clipScale(400, 4, 200), 1);
  });
});

/** The value of one series in a scrape of `metrics`, undefined when absent. */
async function seriesValue(metrics: SpillwayMetrics, series: string): Promise<number | undefined> {
  for (const line of (await metrics.registry.metrics()).split('\n')) {
    if (line.startsWith(`${series} `)) return Number(line.slice(series.length + 1));
  }
  return undefined;
}

describe('reporter cap: operators see the clipping', () => {
  const controllerClipped = (tier: string) =>
    `spillway_controller_reporter_cap_clipped_total{tier="${tier}"}`;

  it('spillway_controller_reporter_cap_clipped_total rises by tier when a reporter lies, not before', async () => {
    const { clock, controller } = controllerWith({ medianMultiple: 4, maxRps: 200 });
    const metrics = createMetrics({ component: 'controller', id: 'ctl', processMetrics: false });
    addControllerMetrics(metrics, controller);
    // Zero from the start, for every tier: increase() sees the first clip.
    for (const tier of ['host', 'aggregator', 'controller', 'unspecified'])
      assert.equal(await seriesValue(metrics, controllerClipped(tier)), 0, tier);

    feed(controller.handleReport, clock.nowMs(), false);
    controller.tick();
    assert.equal(await seriesValue(metrics, controllerClipped('host')), 0, 'honest hosts are not clipped');

    clock.advance(1000);
    feed(controller.handleReport, clock.nowMs());
    controller.tick();
    const afterLie = await seriesValue(metrics, controllerClipped('host'));
    assert.ok(afterLie !== undefined && afterLie >= 1, `host series ${afterLie}`);
    assert.equal(await seriesValue(metrics, controllerClipped('aggregator')), 0);

    // An aggregator claiming 10 hosts at 1,000 rps each is above maxRps (200 per host).
    call(
      controller.handleReport,
      hostReport({
        id: 'agg',
        sequence: 1,
        endMs: clock.nowMs(),
        tier: Tier.AGGREGATOR,
        hostCount: 10,
        buckets: [{ bucket: 'pay', offered: 10_000 }],
      }),
    );
    controller.tick();
    assert.ok((await seriesValue(metrics, controllerClipped('aggregator')))! >= 1);
    assert.ok((await seriesValue(metrics, controllerClipped('host')))! > afterLie, 'counts are cumulative');
    // Only the four tier names are ever label values: no per-reporter or per-bucket series.
    const series = (await metrics.registry.metrics())
      .split('\n')
      .filter((l) => l.startsWith('spillway_controller_reporter_cap_clipped_total{'));
    assert.equal(series.length, 4);
  });

  it('an unknown tier number on the wire is counted as unspecified (no new label value)', async () => {
    const { clock, controller } = controllerWith({ maxRps: 200 });
    const metrics = createMetrics({ component: 'controller', id: 'ctl', processMetrics: false });
    addControllerMetrics(metrics, controller);
    call(
      controller.handleReport,
      hostReport({
        id: 'odd',
        sequence: 1,
        endMs: clock.nowMs(),
        tier: 77 as Tier,
        hostCount: 1,
        buckets: [{ bucket: 'pay', offered: 5_000 }],
      }),
    );
    controller.tick();
    assert.equal(await seriesValue(metrics, controllerClipped('unspecified')), 1);
    assert.doesNotMatch(await metrics.registry.metrics(), /tier="77"/);
  });

  it('spillway_aggregator_reporter_cap_clipped_total rises when one of its hosts lies', async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const parent: ControlClient = {
      target: 'p',
      report: async () => ({
        $typeName: 'spillway.v1.ReportResponse',
        directives: [],
        reportIntervalMs: 1000,
        epoch: 1n,
        responderId: 'p',
      }),
      close() {},
    };
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [parent],
      scheduler: clock,
      reporterCap: { medianMultiple: 4, floorRps: 50 },
    });
    const metrics = createMetrics({ component: 'aggregator', id: 'agg', processMetrics: false });
    addAggregatorMetrics(metrics, aggregator);
    const clipped = 'spillway_aggregator_reporter_cap_clipped_total{tier="host"}';
    aggregator.start();
    feed(aggregator.handleReport, clock.nowMs(), false);
    clock.advance(1000);
    await aggregator.flush();
    assert.equal(await seriesValue(metrics, clipped), 0);
    feed(aggregator.handleReport, clock.nowMs());
    clock.advance(1000);
    await aggregator.flush();
    await aggregator.stop();
    assert.ok((await seriesValue(metrics, clipped))! >= 1);
  });
});
