import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LimitsConfig } from '../../src/config/limits-config.js';
import { createController, startEpoch } from '../../src/control/controller.js';
import { plainRatioPolicy } from '../../src/control/ratio-policy.js';
import { ManualClock } from '../../src/core/clock.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { Mode, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { call, hostReport } from './report-fixtures.js';

const START_MS = 1_700_000_000_000;

function config(overrides: Partial<LimitsConfig> = {}): LimitsConfig {
  return {
    version: 1,
    intervalMs: 1000,
    ttlMs: 4000,
    buckets: [
      { key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' },
      { key: 'audit', limitRps: 100, mode: 'shadow', scope: 'global' },
      { key: 'zonal', limitRps: 100, mode: 'enforce', scope: 'zone' },
      {
        template: 'api:caller=*',
        limitRps: 10,
        mode: 'enforce',
        scope: 'global',
        overrides: { acme: 50 },
        maxInstances: 3,
      },
    ],
    ratioPolicy: { kind: 'plain' },
    ...overrides,
  };
}

function setup(options: { config?: LimitsConfig; maxChildren?: number; maxBuckets?: number } = {}) {
  const clock = new ManualClock(START_MS);
  const controller = createController({
    id: 'ctl',
    config: options.config ?? config(),
    scheduler: clock,
    ...options,
  });
  return { clock, controller };
}

describe('controller', () => {
  it('sums offered (never admitted) over children as rates from each window length', () => {
    const { clock, controller } = setup();
    const now = clock.nowMs();
    // 300 offered over 2 s = 150 rps; admitted is ignored for the ratio.
    call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: 1,
        endMs: now,
        windowMs: 2000,
        buckets: [{ bucket: 'pay', offered: 300, admitted: 10 }],
      }),
    );
    // Another host's clock is far off: only its window length counts. 50 over 0.5 s = 100 rps.
    // (Its first report, judged against h1's arrival offset, is taken for a late one; its second
    // agrees with the first and sets its own usual: docs/reliability.md, "Reports that arrive late".)
    for (const sequence of [1, 2]) {
      call(
        controller.handleReport,
        hostReport({
          id: 'h2',
          sequence,
          endMs: 5,
          windowMs: 500,
          buckets: [{ bucket: 'pay', offered: 50, admitted: 50 }],
        }),
      );
    }
    assert.equal(controller.snapshot().counters.lateReports, 1);
    controller.tick();
    const bucket = controller.snapshot().buckets.find((b) => b.key === 'pay')!;
    assert.equal(bucket.offeredRps, 250);
    assert.equal(bucket.admittedRps, 105);
    assert.equal(bucket.children, 2);
    assert.ok(Math.abs(bucket.dropRatio - (250 - 100) / 250) < 1e-12);
  });

  it('replies with directives (epoch, version, ttl, limit, offered, mode) for the reported buckets', () => {
    const { clock, controller } = setup();
    const first = call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 200 }] }),
    );
    // A bucket nobody reported before gets its first ratio from the report that brings it.
    assert.equal(first.directives.length, 1, 'a first directive without waiting for a tick');
    assert.equal(first.directives[0]!.dropRatio, 0.5);
    assert.equal(first.directives[0]!.version, 1n);
    assert.equal(first.reportIntervalMs, 1000);
    assert.equal(first.epoch, BigInt(controller.epoch));
    assert.equal(first.responderId, 'ctl');
    controller.tick();
    const reply = call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 2, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 200 }] }),
    );
    assert.equal(reply.directives.length, 1);
    const d = reply.directives[0]!;
    assert.equal(d.bucket, 'pay');
    assert.equal(d.dropRatio, 0.5);
    assert.equal(d.mode, Mode.ENFORCE);
    assert.equal(d.limitRps, 100);
    assert.equal(d.offeredRps, 200);
    assert.equal(d.epoch, BigInt(controller.epoch));
    // The first report computed version 1, the tick 2; the default (stateless) policy recomputed on this report.
    assert.equal(d.version, 3n);
    assert.equal(d.ttlMs, 4000);
  });

  it('versions increase by one per computation (tick or report) within an epoch; a new controller has a later epoch', () => {
    const { clock, controller } = setup();
    const report = (seq: number) =>
      call(
        controller.handleReport,
        hostReport({
          id: 'h1',
          sequence: seq,
          endMs: clock.nowMs(),
          buckets: [{ bucket: 'pay', offered: 200 }],
        }),
      );
    report(1);
    controller.start();
    clock.advance(1000);
    assert.equal(report(2).directives[0]!.version, 3n, 'the first report, tick 1, then this report');
    clock.advance(1000);
    clock.advance(1000);
    assert.equal(report(3).directives[0]!.version, 6n, 'ticks 4 and 5, then this report');
    controller.stop();
    clock.advance(5000);
    assert.equal(controller.snapshot().version, 6, 'stopped: no more ticks');
    const restarted = createController({ id: 'ctl', config: config(), scheduler: clock });
    assert.ok(restarted.epoch > controller.epoch);
    // The start time in ms, then 10 random bits: a later millisecond wins whatever the bits.
    assert.ok(
      controller.epoch >= START_MS * 1024 && controller.epoch < (START_MS + 1) * 1024,
      `epoch ${controller.epoch}`,
    );
    assert.ok(startEpoch(START_MS + 1, () => 0) > startEpoch(START_MS, () => 0.9999999));
    assert.ok(Number.isSafeInteger(startEpoch(Date.UTC(2200, 0, 1), () => 0.9999999)));
    assert.equal(createController({ id: 'x', config: config(), scheduler: clock, epoch: 42 }).epoch, 42);
  });

  it('counts a duplicate (reporterId, sequence) once and still answers it', () => {
    const { clock, controller } = setup();
    const request = hostReport({
      id: 'h1',
      sequence: 7,
      endMs: clock.nowMs(),
      buckets: [{ bucket: 'pay', offered: 120 }],
    });
    call(controller.handleReport, request);
    controller.tick();
    const again = call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 7, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 999 }] }),
    );
    assert.equal(again.directives.length, 1);
    controller.tick();
    const snap = controller.snapshot();
    assert.equal(snap.buckets.find((b) => b.key === 'pay')!.offeredRps, 120);
    assert.equal(snap.counters.duplicateReports, 1);
    assert.equal(snap.counters.reports, 2);
  });

  it('a child silent past childExpiryMs stops counting; a silent bucket is forgotten after bucketExpiryMs', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({
      id: 'ctl',
      config: config(),
      scheduler: clock,
      childExpiryMs: 3000,
      bucketExpiryMs: 5000,
    });
    call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    call(
      controller.handleReport,
      hostReport({ id: 'h2', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    clock.advance(2000);
    call(
      controller.handleReport,
      hostReport({ id: 'h2', sequence: 2, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    controller.tick();
    assert.equal(
      controller.snapshot().buckets[0]!.offeredRps,
      200,
      'h1 is within expiry: its last rate still counts',
    );
    clock.advance(1500);
    controller.tick();
    let snap = controller.snapshot();
    assert.equal(snap.buckets[0]!.offeredRps, 100);
    assert.deepEqual(
      snap.children.map((c) => c.id),
      ['h2'],
    );
    assert.equal(snap.counters.expiredChildren, 1);
    clock.advance(10_000);
    controller.tick();
    snap = controller.snapshot();
    assert.equal(snap.children.length, 0);
    assert.equal(snap.buckets.length, 0);
    assert.equal(snap.counters.expiredBuckets, 1);
  });

  it('shadow buckets get directives in shadow mode with the ratio computed as for enforce', () => {
    const { clock, controller } = setup();
    call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: 1,
        endMs: clock.nowMs(),
        buckets: [{ bucket: 'audit', offered: 400, admitted: 400, wouldDrop: 300 }],
      }),
    );
    controller.tick();
    const reply = call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: 2,
        endMs: clock.nowMs(),
        buckets: [{ bucket: 'audit', offered: 400, admitted: 400, wouldDrop: 300 }],
      }),
    );
    assert.equal(reply.directives[0]!.mode, Mode.SHADOW);
    assert.equal(reply.directives[0]!.dropRatio, 0.75);
    const bucket = controller.snapshot().buckets[0]!;
    assert.equal(bucket.mode, 'shadow');
    assert.equal(bucket.wouldDropRps, 300);
  });

  it('zone-scoped buckets: the limit applies per zone, each zone gets its own ratio', () => {
    const { clock, controller } = setup();
    const now = clock.nowMs();
    call(
      controller.handleReport,
      hostReport({
        id: 'a1',
        zone: 'a',
        sequence: 1,
        endMs: now,
        buckets: [{ bucket: 'zonal', offered: 200 }],
      }),
    );
    call(
      controller.handleReport,
      hostReport({
        id: 'a2',
        zone: 'a',
        sequence: 1,
        endMs: now,
        buckets: [{ bucket: 'zonal', offered: 200 }],
      }),
    );
    call(
      controller.handleReport,
      hostReport({
        id: 'b1',
        zone: 'b',
        sequence: 1,
        endMs: now,
        buckets: [{ bucket: 'zonal', offered: 50 }],
      }),
    );
    controller.tick();
    const zoneA = call(
      controller.handleReport,
      hostReport({
        id: 'a1',
        zone: 'a',
        sequence: 2,
        endMs: now,
        buckets: [{ bucket: 'zonal', offered: 200 }],
      }),
    );
    const zoneB = call(
      controller.handleReport,
      hostReport({
        id: 'b1',
        zone: 'b',
        sequence: 2,
        endMs: now,
        buckets: [{ bucket: 'zonal', offered: 50 }],
      }),
    );
    assert.equal(zoneA.directives[0]!.dropRatio, 0.75); // 400 offered in zone a, limit 100
    assert.equal(zoneA.directives[0]!.offeredRps, 400);
    assert.equal(zoneB.directives[0]!.dropRatio, 0); // 50 in zone b
    const bucket = controller.snapshot().buckets[0]!;
    assert.equal(bucket.offeredRps, 450);
    assert.deepEqual(
      bucket.zones?.map((z) => [z.zone, z.offeredRps, z.dropRatio, z.children]),
      [
        ['a', 400, 0.75, 2],
        ['b', 50, 0, 1],
      ],
    );
  });

  it('templates: one bucket per instance, overrides by instance, instances capped, unknown keys counted and bounded', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({ id: 'ctl', config: config(), scheduler: clock, maxUnknownKeys: 2 });
    const buckets = [
      { bucket: 'api:caller=acme', offered: 100 },
      { bucket: 'api:caller=zed', offered: 100 },
      { bucket: 'api:caller=kim', offered: 100 },
      { bucket: 'api:caller=over', offered: 100 }, // fourth instance: over maxInstances 3
      { bucket: 'nope:1', offered: 5 },
      { bucket: 'nope:2', offered: 5 },
      { bucket: 'nope:3', offered: 5 },
    ];
    call(controller.handleReport, hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets }));
    controller.tick();
    const reply = call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 2, endMs: clock.nowMs(), buckets }),
    );
    const byBucket = new Map(reply.directives.map((d) => [d.bucket, d]));
    assert.deepEqual([...byBucket.keys()].sort(), ['api:caller=acme', 'api:caller=kim', 'api:caller=zed']);
    assert.equal(byBucket.get('api:caller=acme')!.limitRps, 50);
    assert.equal(byBucket.get('api:caller=acme')!.dropRatio, 0.5);
    assert.equal(byBucket.get('api:caller=zed')!.limitRps, 10);
    assert.equal(byBucket.get('api:caller=zed')!.dropRatio, 0.9);
    const snap = controller.snapshot();
    assert.equal(snap.counters.instancesOverCapacity, 2);
    assert.equal(snap.counters.unknownBuckets, 6);
    assert.deepEqual(snap.unknownBucketKeys, ['nope:1', 'nope:2']);
    assert.equal(snap.buckets.find((b) => b.key === 'api:caller=zed')!.rule, 'api:caller=*');
  });

  it('updateConfig keeps per-bucket memory, applies new limits and modes, drops buckets without a rule', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({
      id: 'ctl',
      config: config({ ratioPolicy: { kind: 'ewma', alpha: 0.5 } }),
      scheduler: clock,
    });
    const report = (seq: number, offered: number) =>
      call(
        controller.handleReport,
        hostReport({
          id: 'h1',
          sequence: seq,
          endMs: clock.nowMs(),
          buckets: [
            { bucket: 'pay', offered },
            { bucket: 'audit', offered },
          ],
        }),
      );
    report(1, 400);
    controller.tick(); // smoothed offered 400
    report(2, 200);
    controller.updateConfig({
      ...config({ ratioPolicy: { kind: 'ewma', alpha: 0.5 } }),
      buckets: [{ key: 'pay', limitRps: 150, mode: 'shadow', scope: 'global' }],
    });
    controller.tick(); // smoothed offered 300 (memory kept), limit 150 -> 0.5
    const reply = report(3, 200);
    assert.equal(reply.directives.length, 1, 'audit has no rule any more');
    const d = reply.directives[0]!;
    assert.equal(d.dropRatio, 0.5);
    assert.equal(d.limitRps, 150);
    assert.equal(d.mode, Mode.SHADOW);
    assert.deepEqual(
      controller.snapshot().buckets.map((b) => b.key),
      ['pay'],
    );
  });

  it('updateConfig with a different ratio policy starts fresh memory; an invalid config changes nothing', () => {
    const { clock, controller } = setup({ config: config({ ratioPolicy: { kind: 'ewma', alpha: 0.5 } }) });
    call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 400 }] }),
    );
    controller.tick();
    call(
      controller.handleReport,
      hostReport({ id: 'h1', sequence: 2, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 200 }] }),
    );
    assert.throws(
      () =>
        controller.updateConfig({
          ...config(),
          buckets: [{ key: 'pay', limitRps: -1, mode: 'enforce', scope: 'global' }],
        }),
      (error) =>
        isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG') &&
        /buckets\[0\]\.limitRps: must be >= 0/.test(error.message),
    );
    controller.updateConfig(config({ ratioPolicy: { kind: 'plain' } }));
    controller.tick();
    assert.equal(controller.snapshot().buckets[0]!.dropRatio, 0.5, 'plain on 200 offered, no EWMA memory');
    assert.deepEqual(controller.snapshot().ratioPolicy, { kind: 'plain' });
  });

  it('bounds children and buckets: a new child past maxChildren is refused, new buckets past maxBuckets ignored', () => {
    const { clock, controller } = setup({ maxChildren: 2, maxBuckets: 2 });
    const now = clock.nowMs();
    call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: 1,
        endMs: now,
        buckets: [
          { bucket: 'pay', offered: 1 },
          { bucket: 'audit', offered: 1 },
          { bucket: 'zonal', offered: 1 },
        ],
      }),
    );
    call(controller.handleReport, hostReport({ id: 'h2', sequence: 1, endMs: now, buckets: [] }));
    assert.throws(
      () => call(controller.handleReport, hostReport({ id: 'h3', sequence: 1, endMs: now, buckets: [] })),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_CAPACITY_EXCEEDED'),
    );
    const snap = controller.snapshot();
    assert.equal(snap.buckets.length, 2);
    assert.equal(snap.counters.bucketsOverCapacity, 1);
    assert.deepEqual(snap.counters.rejectedReports, { ERR_SPILLWAY_CAPACITY_EXCEEDED: 1 });
    // Once a child expires, a new one fits.
    clock.advance(3001);
    call(controller.handleReport, hostReport({ id: 'h3', sequence: 1, endMs: clock.nowMs(), buckets: [] }));
  });

  it('refuses an invalid report with ERR_SPILLWAY_INVALID_REPORT and counts it, state untouched', () => {
    const { clock, controller } = setup();
    assert.throws(
      () =>
        call(
          controller.handleReport,
          hostReport({
            id: 'h1',
            sequence: 1,
            endMs: clock.nowMs(),
            buckets: [{ bucket: 'pay', offered: Number.NaN }],
          }),
        ),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') && error.details?.field === 'offered',
    );
    const snap = controller.snapshot();
    assert.equal(snap.children.length, 0);
    assert.deepEqual(snap.counters.rejectedReports, { ERR_SPILLWAY_INVALID_REPORT: 1 });
  });

  it('records child identity: tier, zone, host count, sequence', () => {
    const { clock, controller } = setup();
    call(
      controller.handleReport,
      hostReport({
        id: 'agg-a',
        tier: Tier.AGGREGATOR,
        zone: 'a',
        hostCount: 40,
        sequence: 9,
        endMs: clock.nowMs(),
        buckets: [],
      }),
    );
    call(
      controller.handleReport,
      hostReport({ id: 'h1', hostCount: 0, sequence: 1, endMs: clock.nowMs(), buckets: [] }),
    );
    assert.deepEqual(
      controller
        .snapshot()
        .children.map((c) => [c.id, c.tier, c.zone, c.hostCount, c.sequence, c.lastSeenMs]),
      [
        ['agg-a', Tier.AGGREGATOR, 'a', 40, 9, START_MS],
        ['h1', Tier.HOST, 'z1', 1, 1, START_MS],
      ],
    );
  });

  it('an injected ratio policy wins over the config and survives reloads', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({
      id: 'ctl',
      config: config({ ratioPolicy: { kind: 'ewma', alpha: 0.1 } }),
      scheduler: clock,
      ratioPolicy: plainRatioPolicy(),
    });
    controller.updateConfig(config({ ratioPolicy: { kind: 'ewma', alpha: 0.2 } }));
    assert.deepEqual(controller.snapshot().ratioPolicy, { kind: 'plain' });
  });
  it('a bounded snapshot lists the busiest buckets and the first children, with totals over all', () => {
    const { clock, controller } = setup();
    const now = clock.nowMs();
    call(
      controller.handleReport,
      hostReport({
        id: 'h2',
        sequence: 1,
        endMs: now,
        buckets: [
          { bucket: 'pay', offered: 5 },
          { bucket: 'audit', offered: 50 },
          { bucket: 'zonal', offered: 20 },
        ],
      }),
    );
    call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: 1,
        endMs: now,
        buckets: [{ bucket: 'api:caller=acme', offered: 30 }],
      }),
    );
    controller.tick();
    const full = controller.snapshot();
    const bounded = controller.snapshot({ maxBuckets: 2, maxChildren: 1 });
    assert.deepEqual(
      bounded.buckets.map((b) => b.key),
      ['api:caller=acme', 'audit'],
      'the two busiest, sorted by key',
    );
    assert.deepEqual(
      bounded.buckets,
      full.buckets.filter((b) => b.key === 'audit' || b.key === 'api:caller=acme'),
    );
    assert.deepEqual(
      bounded.children.map((c) => c.id),
      ['h1'],
    );
    for (const snap of [full, bounded]) {
      assert.equal(snap.bucketsTotal, 4);
      assert.equal(snap.childrenTotal, 2);
      assert.equal(snap.hostsTotal, 2);
    }
    assert.equal(full.buckets.length, 4);
    assert.equal(controller.snapshot({ maxBuckets: 0, maxChildren: 0 }).buckets.length, 0);
    assert.equal(controller.snapshot({ maxBuckets: 0, maxChildren: 0 }).children.length, 0);
  });
});
