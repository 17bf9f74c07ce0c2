import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { BucketUsageSchema, type ReportRequest } from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { advance, call, hostReport } from './report-fixtures.js';

/** Reports an attacker (or a bug) could send. Every one is refused or bounded; state stays bounded. */
function receivers() {
  const clock = new ManualClock(1_700_000_000_000);
  const controller = createController({
    id: 'ctl',
    scheduler: clock,
    maxBuckets: 5000,
    maxChildren: 100,
    config: {
      version: 1,
      intervalMs: 1000,
      ttlMs: 4000,
      buckets: [
        { key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' },
        {
          template: 'api:caller=*',
          limitRps: 10,
          mode: 'enforce',
          scope: 'global',
          maxInstances: 1000,
          overrides: {},
        },
      ],
    },
  });
  const parent: ControlClient = { target: 'p', report: () => new Promise(() => {}), close() {} };
  const aggregator = createAggregator({
    id: 'agg',
    zone: 'a',
    parents: [parent],
    scheduler: clock,
    maxBuckets: 5000,
    maxHosts: 100,
  });
  return { clock, controller, aggregator };
}

function refusedBoth(request: ReportRequest, field: string): void {
  const { controller, aggregator } = receivers();
  for (const handler of [controller.handleReport, aggregator.handleReport]) {
    assert.throws(
      () => call(handler, request),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') && error.details?.field === field,
      `expected a refusal on ${field}`,
    );
  }
  assert.equal(controller.snapshot().children.length, 0);
  assert.equal(aggregator.snapshot().hosts.length, 0);
}

describe('hostile reports', () => {
  it('refuses NaN, negative and infinite counts', () => {
    for (const value of [Number.NaN, -1, Number.POSITIVE_INFINITY, -0.5]) {
      refusedBoth(
        hostReport({
          id: 'h',
          sequence: 1,
          endMs: 1e6,
          buckets: [{ bucket: 'pay', offered: value, admitted: 0 }],
        }),
        'offered',
      );
    }
  });

  it('refuses a report of 1,000,000 buckets before looking at any of them', () => {
    const request = hostReport({ id: 'h', sequence: 1, endMs: 1e6, buckets: [] });
    const usage = create(BucketUsageSchema, { bucket: 'pay', offered: 1, admitted: 1 });
    request.buckets = new Array(1_000_000).fill(usage);
    refusedBoth(request, 'buckets');
  });

  it('refuses huge strings (1 MB reporter id, bucket key, zone)', () => {
    const huge = 'x'.repeat(1 << 20);
    refusedBoth(hostReport({ id: huge, sequence: 1, endMs: 1e6, buckets: [] }), 'reporterId');
    refusedBoth(
      hostReport({ id: 'h', sequence: 1, endMs: 1e6, buckets: [{ bucket: huge, offered: 1 }] }),
      'bucket',
    );
    refusedBoth(hostReport({ id: 'h', zone: huge, sequence: 1, endMs: 1e6, buckets: [] }), 'zone');
  });

  it('stays bounded under 1,000,000 distinct keys over many reports from many reporters', () => {
    const { clock, controller, aggregator } = receivers();
    const heapBefore = process.memoryUsage().heapUsed;
    let refusedReporters = 0;
    let maxControllerBuckets = 0;
    let maxAggregatorBuckets = 0;
    for (let report = 0; report < 1000; report++) {
      const buckets = Array.from({ length: 1000 }, (_, i) => ({
        // Half template instances, half keys matching no rule.
        bucket: i % 2 === 0 ? `api:caller=c${report}-${i}` : `junk:${report}-${i}`,
        offered: 1,
      }));
      const request = hostReport({ id: `host-${report}`, sequence: 1, endMs: clock.nowMs(), buckets });
      for (const handler of [controller.handleReport, aggregator.handleReport]) {
        try {
          call(handler, request);
        } catch (error) {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_CAPACITY_EXCEEDED'));
          refusedReporters++;
        }
      }
      if (report % 100 === 99) {
        // Past the controller's child expiry (3 s), within the aggregator's host expiry (10 s).
        clock.advance(4000);
        controller.tick();
        maxControllerBuckets = Math.max(maxControllerBuckets, controller.snapshot().buckets.length);
        maxAggregatorBuckets = Math.max(maxAggregatorBuckets, aggregator.snapshot().buckets.length);
      }
    }
    const ctl = controller.snapshot();
    assert.ok(ctl.buckets.length <= 1000, `template instances capped: ${ctl.buckets.length}`);
    assert.equal(ctl.counters.unknownBuckets, 500_000);
    assert.ok(ctl.unknownBucketKeys.length <= 64);
    assert.ok(ctl.children.length <= 100);
    // Idle instances expire (10 intervals), so a few generations of 1000 get in; the rest are refused.
    assert.ok(ctl.counters.instancesOverCapacity > 400_000, `${ctl.counters.instancesOverCapacity}`);
    assert.ok(maxControllerBuckets <= 1000 && maxAggregatorBuckets <= 5000);
    const agg = aggregator.snapshot();
    assert.ok(agg.buckets.length <= 5000, `aggregator buckets: ${agg.buckets.length}`);
    assert.ok(agg.hosts.length <= 100);
    assert.ok(agg.counters.bucketsOverCapacity > 300_000, `${agg.counters.bucketsOverCapacity}`);
    assert.ok(
      refusedReporters >= 500,
      `reporters past the aggregator's maxHosts are refused: ${refusedReporters}`,
    );
    // A generous bound that an unbounded table (a million keys, ~100+ MB) would break.
    const grewMb = (process.memoryUsage().heapUsed - heapBefore) / 2 ** 20;
    assert.ok(grewMb < 80, `heap grew ${grewMb.toFixed(1)} MB`);
  });

  it('a zone whose hosts rotate past 10,000 keys in all keeps its busy buckets limited (defaults at both tiers)', async () => {
    // Each host reports 3,401 keys, under its own 5,000 and the aggregator's 10,000 per report;
    // the zone holds 10,201. One forward of all of them would be refused whole by the controller
    // (maxBucketsPerReport 10,000), and `pay` with it: every bucket of the zone would fail open.
    const clock = new ManualClock(1_700_000_000_000);
    const network = new InMemoryNetwork({ scheduler: clock, random: seededRandom(1) });
    const controller = createController({
      id: 'ctl',
      scheduler: clock,
      config: {
        version: 1,
        intervalMs: 1000,
        ttlMs: 4000,
        buckets: [
          { key: 'pay', limitRps: 10, mode: 'enforce', scope: 'global' },
          {
            template: 'api:caller=*',
            limitRps: 100,
            mode: 'enforce',
            scope: 'global',
            overrides: {},
            maxInstances: 100_000,
          },
        ],
      },
    });
    network.listen('ctl', controller.handleReport);
    const warnings: string[] = [];
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [network.connect('ctl', { from: 'agg' })],
      scheduler: clock,
      random: seededRandom(2),
      logger: { info: () => {}, warn: (_f, m) => warnings.push(m) },
    });
    controller.start();
    aggregator.start();
    try {
      for (let second = 1; second <= 4; second++) {
        for (let h = 0; h < 3; h++) {
          const buckets = [{ bucket: 'pay', offered: 100 }];
          for (let k = 0; k < 3_400; k++) buckets.push({ bucket: `api:caller=h${h}-${k}`, offered: 1 });
          call(
            aggregator.handleReport,
            hostReport({ id: `host-${h}`, sequence: second, endMs: clock.nowMs(), zone: 'z1', buckets }),
          );
        }
        await advance(clock, 1000, 50);
      }
      const pay = controller.snapshot().buckets.find((b) => b.key === 'pay');
      assert.ok(pay, 'the controller hears of pay');
      assert.ok(Math.abs(pay.offeredRps - 300) < 1e-6, String(pay.offeredRps));
      assert.ok(pay.dropRatio > 0.96, String(pay.dropRatio));
      assert.equal(aggregator.snapshot().lastForward?.buckets, 10_000);
      assert.ok(aggregator.snapshot().counters.bucketsLeftOutOfForwards >= 201);
      assert.equal(aggregator.snapshot().counters.forwardFailures, 0);
      assert.deepEqual(warnings, [
        'control: more buckets than one forward holds; the least busy are left out',
      ]);
    } finally {
      await aggregator.stop();
      controller.stop();
    }
  });
});
