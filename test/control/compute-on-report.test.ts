import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LimitsConfig, RatioPolicySpec } from '../../src/config/limits-config.js';
import { createController } from '../../src/control/controller.js';
import type { ReporterCap } from '../../src/control/reporter-cap.js';
import { ManualClock } from '../../src/core/clock.js';
import { call, hostReport } from './report-fixtures.js';

/**
 * With a stateless ratio policy (the default, plain) the controller recomputes a bucket's ratio
 * from the freshest sums when a report arrives, so the reply to an aggregator's forward already
 * reflects that forward (one interval less of loop lag, docs/accuracy.md). A bucket reported for
 * the first time (every bucket, after a controller restart) gets its first ratio the same way.
 */
function setup(ratioPolicy?: RatioPolicySpec, options: { reporterCap?: ReporterCap } = {}) {
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
  const controller = createController({ id: 'ctl', config, scheduler: clock, ...options });
  let sequence = 0;
  const report = (id: string, offered: number, bucket = 'pay', zone = 'z1') =>
    call(
      controller.handleReport,
      hostReport({ id, sequence: ++sequence, endMs: clock.nowMs(), zone, buckets: [{ bucket, offered }] }),
    ).directives.find((d) => d.bucket === bucket);
  /** An aggregator's forward of 'pay': what its hosts offered and admitted, and the epoch they apply. */
  const forward = (id: string, offered: number, admitted: number, heldEpoch = 0n) =>
    call(
      controller.handleReport,
      hostReport({
        id,
        sequence: ++sequence,
        endMs: clock.nowMs(),
        buckets: [{ bucket: 'pay', offered, admitted, heldEpoch }],
      }),
    ).directives.find((d) => d.bucket === 'pay');
  return { clock, controller, config, report, forward };
}

describe('controller: recompute on report', () => {
  it('answers a report with a ratio from the sums that include it, replacing only that child', () => {
    const { controller, report } = setup();
    report('a', 100);
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
    assert.equal(report('a', 200), undefined, 'a new bucket waits for the tick');
    controller.tick();
    const before = report('a', 200)!;
    const after = report('a', 1000)!;
    assert.equal(after.dropRatio, before.dropRatio, 'the tick ratio until the next tick');
    assert.equal(after.version, before.version);
    controller.tick();
    assert.ok(report('a', 1000)!.dropRatio > before.dropRatio);
  });

  it('answers the first report of a bucket with a ratio from it: a restarted controller answers the first forward', () => {
    const { controller, report } = setup();
    // An aggregator's first forward to a new controller (the zone's 300 rps against a limit of 100).
    const first = report('agg-1', 300);
    assert.ok(first, 'a directive in the reply to the very first report, no tick yet');
    assert.equal(first.offeredRps, 300);
    assert.ok(Math.abs(first.dropRatio - 2 / 3) < 1e-12);
    assert.equal(controller.snapshot().counters.ticks, 0);
    // Another child's first report of the bucket adds its part and recomputes.
    const second = report('agg-2', 100)!;
    assert.equal(second.offeredRps, 400);
    assert.equal(second.dropRatio, 0.75);
    assert.ok(second.version > first.version);
    controller.tick();
    assert.equal(report('agg-1', 300)!.offeredRps, 400, 'the tick agrees');
  });

  it('a zone-scoped bucket: a zone first reported gets its ratio from its own report', () => {
    const { controller, report } = setup();
    assert.equal(report('a', 200, 'zonal', 'z1')!.dropRatio, 0.5);
    assert.equal(report('b', 50, 'zonal', 'z2')!.dropRatio, 0, 'z2 alone');
    assert.equal(report('c', 200, 'zonal', 'z1')!.dropRatio, 0.75, 'z1 with both its children');
    controller.tick();
    const zones = controller.snapshot().buckets.find((b) => b.key === 'zonal')!.zones!;
    assert.deepEqual(
      zones.map((z) => [z.zone, z.offeredRps, z.children]),
      [
        ['z1', 400, 2],
        ['z2', 50, 1],
      ],
    );
  });

  it('groups a reload reset wait for the tick, which counts every child', () => {
    const { controller, config, report } = setup();
    report('a', 200);
    report('b', 200);
    controller.tick();
    // A scope change resets the bucket's groups (sums and memory): a report alone would be a partial sum.
    controller.updateConfig({
      ...config,
      buckets: [{ ...config.buckets[0]!, scope: 'zone' }, config.buckets[1]!],
    });
    assert.equal(report('a', 200), undefined, 'no ratio from a reset bucket before the tick');
    controller.tick();
    assert.equal(report('a', 200)!.offeredRps, 400, "the tick counted b's usage too");
  });

  it('with a reporter cap, a new bucket waits for the tick that computes its cap', () => {
    const { controller, report } = setup(undefined, { reporterCap: { medianMultiple: 2 } });
    assert.equal(report('a', 100), undefined);
    // A liar's first report cannot set a ratio before the cap bounds it.
    assert.equal(report('liar', 1e9), undefined);
    controller.tick();
    const d = report('a', 100)!;
    assert.ok(d.offeredRps <= 300, `capped: ${d.offeredRps}`);
  });

  it('leaves out a partial ratio that would let a child admit more than it does now, until the tick', () => {
    const { controller, forward } = setup();
    // A restarted controller. agg-1's hosts still apply 0.5 (their held ratio); its forward alone
    // (100 rps against a limit of 100) would say 0: withheld.
    assert.equal(forward('agg-1', 100, 50), undefined);
    // agg-2's hosts apply 0.5 too; with both, 300 rps: 2/3, tighter than 0.5, so sent.
    assert.ok(Math.abs(forward('agg-2', 200, 100)!.dropRatio - 2 / 3) < 1e-12);
    // Hosts that decayed during the outage (admit 90%) get the partial ratio at once.
    assert.ok(Math.abs(forward('agg-3', 100, 90)!.dropRatio - 3 / 4) < 1e-12);
    // 400 rps: 0.75 lets agg-1's hosts admit 25%; they admit 24% now: within 5% is noise, sent.
    assert.equal(forward('agg-1', 100, 24)!.dropRatio, 0.75);
    controller.tick();
    forward('agg-2', 200, 200);
    assert.equal(forward('agg-1', 100, 0)!.offeredRps, 400, 'after a tick every child gets the full sum');
  });

  it('keeps that guard past the tick while hosts apply an earlier controller’s ratio, for a child expiry', () => {
    const { clock, controller, forward } = setup();
    const epoch = BigInt(controller.epoch);
    // agg-1's hosts apply 0.5 from the controller before this one; agg-2 cannot reach this one yet.
    assert.equal(forward('agg-1', 100, 50, epoch - 60_000n), undefined);
    clock.advance(1000);
    controller.tick(); // sums agg-1 alone: 100 rps against 100, a ratio of 0
    assert.equal(forward('agg-1', 100, 50, epoch - 60_000n), undefined, 'still withheld after the tick');
    clock.advance(1000);
    controller.tick();
    assert.equal(forward('agg-1', 100, 50, epoch - 60_000n), undefined, 'and after the second');
    // A child expiry after the first report, agg-2 would have expired under the old controller:
    // the sums are whatever came back, and their ratio goes out.
    clock.advance(1001);
    assert.equal(forward('agg-1', 100, 50, epoch - 60_000n)?.dropRatio, 0);
  });

  it('does not hold back hosts on this controller’s own ratio, or on none (a cold start)', () => {
    for (const held of ['own', 'none'] as const) {
      const { clock, controller, forward } = setup();
      const heldEpoch = held === 'own' ? BigInt(controller.epoch) : 0n;
      // A first spike, 400 rps against 100: 0.75, which the hosts then apply.
      assert.equal(forward('agg-1', 400, 400, heldEpoch)!.dropRatio, 0.75, held);
      clock.advance(1000);
      controller.tick();
      // The spike is over (160 rps, 25% admitted under 0.75): 0.375 is looser, and goes out at once.
      assert.equal(forward('agg-1', 160, 40, heldEpoch)!.dropRatio, 0.375, held);
    }
  });

  it('stops guarding a child once its hosts apply this controller’s ratio, within the child expiry', () => {
    const { clock, controller, forward } = setup();
    const epoch = BigInt(controller.epoch);
    // Hosts on the earlier controller's 0.5 meet a spike: 400 rps, 0.75, tighter: sent.
    assert.equal(forward('agg-1', 400, 200, epoch - 60_000n)!.dropRatio, 0.75);
    clock.advance(1000);
    controller.tick();
    // They now apply this controller's 0.75 and the spike is over (160 rps): 0.375 goes out at once.
    assert.equal(forward('agg-1', 160, 40, epoch)!.dropRatio, 0.375);
  });
});
