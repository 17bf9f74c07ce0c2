import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAggregator } from '../../src/control/aggregator.js';
import { ManualClock } from '../../src/core/clock.js';
import { isSpillwayError } from '../../src/core/errors.js';
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
