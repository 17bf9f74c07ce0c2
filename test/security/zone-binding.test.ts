import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock } from '../../src/core/clock.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { Tier } from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { call, hostReport } from '../control/report-fixtures.js';

const parent: ControlClient = { target: 'p', report: () => new Promise(() => {}), close() {} };

describe('aggregator zone binding (acceptZones)', () => {
  it('refuses a report claiming another zone before it touches any state', () => {
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [parent],
      scheduler: new ManualClock(1_700_000_000_000),
      acceptZones: ['z1'],
    });
    const report = (zone: string, id: string) =>
      call(
        aggregator.handleReport,
        hostReport({
          id,
          zone,
          sequence: 1,
          endMs: 1_700_000_000_000,
          buckets: [{ bucket: 'pay', offered: 5 }],
        }),
      );
    assert.throws(
      () => report('z2', 'intruder'),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') && error.details?.field === 'zone',
    );
    assert.throws(() => report('', 'no-zone'), /refuses reports from zone/);
    report('z1', 'member');
    const snapshot = aggregator.snapshot();
    assert.deepEqual(
      snapshot.hosts.map((h) => h.id),
      ['member'],
    );
    assert.equal(snapshot.counters.rejectedReports.ERR_SPILLWAY_INVALID_REPORT, 2);
  });

  it('accepts any zone when unset (a regional aggregator of several zones)', () => {
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'region',
      parents: [parent],
      scheduler: new ManualClock(1_700_000_000_000),
    });
    for (const zone of ['z1', 'z2']) {
      call(
        aggregator.handleReport,
        hostReport({
          id: zone,
          zone,
          sequence: 1,
          endMs: 1_700_000_000_000,
          buckets: [{ bucket: 'pay', offered: 5 }],
        }),
      );
    }
    assert.equal(aggregator.snapshot().hosts.length, 2);
  });
});

// The gRPC server authenticates a report with a zone's token and says so in `context.tokenZone`;
// the receiving tier refuses a report claiming another zone, and keeps reporters of different
// zone tokens apart (tested with real processes in zone-tokens.test.ts).
describe('zone-bound tokens at the receiver (context.tokenZone)', () => {
  const NOW = 1_700_000_000_000;
  const controllerOf = () =>
    createController({
      id: 'ctl',
      scheduler: new ManualClock(NOW),
      config: {
        version: 1,
        intervalMs: 1000,
        ttlMs: 4000,
        ratioPolicy: { kind: 'plain' },
        buckets: [{ key: 'pay', limitRps: 100, mode: 'enforce', scope: 'zone' }],
      },
    });
  const zoneReport = (id: string, zone: string, offered: number, sequence = 1) =>
    hostReport({
      id,
      zone,
      sequence,
      endMs: NOW,
      tier: Tier.AGGREGATOR,
      hostCount: 5,
      buckets: [{ bucket: 'pay', offered }],
    });

  it("the controller refuses a report claiming a zone other than its token's, before any state", () => {
    const controller = controllerOf();
    assert.throws(
      () => controller.handleReport(zoneReport('agg-z1', 'z2', 500), { peer: 'p', tokenZone: 'z1' }),
      (error) =>
        isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') &&
        error.details?.field === 'zone' &&
        /bound to zone z1/.test(error.message),
    );
    assert.equal(controller.snapshot().children.length, 0);
    assert.equal(controller.snapshot().counters.rejectedReports.ERR_SPILLWAY_INVALID_REPORT, 1);
    call(
      (request) => controller.handleReport(request, { peer: 'p', tokenZone: 'z1' }),
      zoneReport('agg-z1', 'z1', 50),
    );
    // Without a token zone (shared token, or no authentication) any zone is accepted, as before.
    call(controller.handleReport, zoneReport('regional', 'z9', 50));
    assert.deepEqual(
      controller.snapshot().children.map((c) => [c.id, c.zone]),
      [
        ['agg-z1', 'z1'],
        ['regional', 'z9'],
      ],
    );
  });

  it("a zone token holder reusing another zone's reporter id neither replaces nor squats it", () => {
    const controller = controllerOf();
    const asZone = (zone: string) => (request: Parameters<typeof controller.handleReport>[0]) =>
      controller.handleReport(request, { peer: 'p', tokenZone: zone });
    call(asZone('z2'), zoneReport('agg-z2', 'z2', 300));
    // The holder of z1's token sends as "agg-z2" (claiming z1, the only zone it may claim).
    call(asZone('z1'), zoneReport('agg-z2', 'z1', 1, 99));
    controller.tick();
    const zones = controller.snapshot().buckets[0]!.zones!;
    assert.deepEqual(
      zones.map((z) => [z.zone, z.offeredRps]),
      [
        ['z1', 1],
        ['z2', 300],
      ],
      "z2's usage is untouched",
    );
    // And the real z2 reporter keeps reporting under its id with its next sequences.
    call(asZone('z2'), zoneReport('agg-z2', 'z2', 320, 2));
    controller.tick();
    assert.equal(controller.snapshot().buckets[0]!.zones!.find((z) => z.zone === 'z2')!.offeredRps, 320);
  });

  it('the aggregator applies the same binding', () => {
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'region',
      parents: [parent],
      scheduler: new ManualClock(NOW),
    });
    const asZone = (zone: string) => (request: Parameters<typeof aggregator.handleReport>[0]) =>
      aggregator.handleReport(request, { peer: 'p', tokenZone: zone });
    assert.throws(
      () => call(asZone('z1'), hostReport({ id: 'h', zone: 'z2', sequence: 1, endMs: NOW, buckets: [] })),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') && error.details?.field === 'zone',
    );
    call(
      asZone('z1'),
      hostReport({ id: 'h', zone: 'z1', sequence: 1, endMs: NOW, buckets: [{ bucket: 'pay', offered: 5 }] }),
    );
    call(
      asZone('z2'),
      hostReport({ id: 'h', zone: 'z2', sequence: 1, endMs: NOW, buckets: [{ bucket: 'pay', offered: 7 }] }),
    );
    assert.deepEqual(
      aggregator
        .snapshot()
        .hosts.map((h) => [h.id, h.zone])
        .sort(),
      [
        ['h', 'z1'],
        ['h', 'z2'],
      ],
    );
  });
});
