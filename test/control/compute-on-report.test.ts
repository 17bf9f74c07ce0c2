import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LimitsConfig, RatioPolicySpec } from '../../src/config/limits-config.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock } from '../../src/core/clock.js';
import { call, hostReport } from './report-fixtures.js';

/**
 * With a stateless ratio policy (the default, plain) the controller recomputes a bucket's ratio
 * from the freshest sums when a report arrives, so the reply to an aggregator's forward already
 * reflects that forward (one interval less of loop lag, docs/accuracy.md).
 */
function setup(ratioPolicy?: RatioPolicySpec) {
  const clock = new ManualClock(1_700_000_000_000);
  const config: LimitsConfig = {
    version: 1,
    intervalMs: 1000,
    ttlMs: 4000,
    buckets: [
      { key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' },
      { key: 'zonal', limitRps: 100, mode: 'enforce', scope: 'zone' },
    ],
    ...(ratioPolicy ? { ratioPolicy } : {}),
  };
  const controller = createController({ id: 'ctl', config, scheduler: clock });
  let sequence = 0;
  const report = (id: string, offered: number, bucket = 'pay', zone = 'z1') =>
    call(
      controller.handleReport,
      hostReport({ id, sequence: ++sequence, endMs: clock.nowMs(), zone, buckets: [{ bucket, offered }] }),
    ).directives.find((d) => d.bucket === bucket);
  return { clock, controller, report };
}

describe('controller: recompute on report', () => {
  it('answers a report with a ratio from the sums that include it, replacing only that child', () => {
    const { controller, report } = setup();
    assert.equal(report('a', 100), undefined, 'a new bucket waits for the tick');
    report('b', 100);
    controller.tick();
    const tickDirective = report('a', 100)!;
    assert.equal(tickDirective.offeredRps, 200);
    assert.equal(tickDirective.dropRatio, 0.5);
    // a triples: 300 + b's 100 = 400 offered, ratio 0.75, in the reply to that very report.
    const fresh = report('a', 300)!;
    assert.equal(fresh.offeredRps, 400);
    assert.equal(fresh.dropRatio, 0.75);
    assert.ok(fresh.version > tickDirective.version, 'a recomputation is a newer directive');
    // b's reply sees a's new rate too; a child that drops the bucket takes its part out.
    assert.equal(report('b', 100)!.offeredRps, 400);
    report('a', 0, 'zonal');
    assert.equal(controller.snapshot().buckets.find((b) => b.key === 'pay')!.dropRatio, 0);
    controller.tick();
    assert.equal(
      controller.snapshot().buckets.find((b) => b.key === 'pay')!.offeredRps,
      100,
      'the tick agrees',
    );
  });

  it('updates the reporting zone only for a zone-scoped bucket', () => {
    const { controller, report } = setup();
    report('a', 200, 'zonal', 'z1');
    report('b', 50, 'zonal', 'z2');
    controller.tick();
    assert.equal(report('a', 400, 'zonal', 'z1')!.dropRatio, 0.75);
    const zones = controller.snapshot().buckets.find((b) => b.key === 'zonal')!.zones!;
    assert.deepEqual(
      zones.map((z) => [z.zone, z.offeredRps, z.dropRatio]),
      [
        ['z1', 400, 0.75],
        ['z2', 50, 0],
      ],
    );
  });

  it('a stateful policy computes only at ticks (its memory advances once per interval)', () => {
    const { controller, report } = setup({ kind: 'ewma', alpha: 0.5 });
    report('a', 200);
    controller.tick();
    const before = report('a', 200)!;
    const after = report('a', 1000)!;
    assert.equal(after.dropRatio, before.dropRatio, 'the tick ratio until the next tick');
    assert.equal(after.version, before.version);
    controller.tick();
    assert.ok(report('a', 1000)!.dropRatio > before.dropRatio);
  });
});
