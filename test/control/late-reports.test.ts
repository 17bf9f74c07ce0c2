import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ExpiredReporterArrivals, ReportArrivals } from '../../src/control/report-arrivals.js';
import { ManualClock } from '../../src/core/clock.js';
import { ReportResponseSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { call, hostReport } from './report-fixtures.js';

/**
 * A report held back by a partition (TCP retransmission) reaches its receiver seconds late, after
 * its host moved to another aggregator: it must not count the host a second time
 * (docs/reliability.md, "Reports that arrive late").
 */
const START_MS = 1_700_000_000_000;
const INTERVAL_MS = 1000;
/** The host's clock runs this far behind the receiver's: lateness must not depend on it. */
const SKEW_MS = -123_456;

function quietParent(): ControlClient {
  return {
    target: 'parent',
    report: () => Promise.resolve(create(ReportResponseSchema, { epoch: 1n, responderId: 'parent' })),
    close() {},
  };
}

describe('report arrivals (report-arrivals.ts)', () => {
  it('measures lateness against the smallest recent offset, whatever the clocks differ by', () => {
    const arrivals = new ReportArrivals();
    for (const offset of [5_000_004, 5_000_002, 5_000_009])
      assert.equal(arrivals.isLate(offset, 2500, 1000), false);
    assert.equal(arrivals.usualOffsetMs, 5_000_002);
    assert.equal(arrivals.isLate(5_002_000, 2500, 1000), false, '2 s late: within 2.5 s');
    assert.equal(arrivals.isLate(5_003_000, 2500, 1000), true, '3 s late');
    assert.equal(arrivals.usualOffsetMs, 5_000_002, 'a late offset does not become the usual');
  });

  it('refuses a bunch drained from a queue at once: offsets an interval apart', () => {
    const arrivals = new ReportArrivals();
    arrivals.isLate(10, 2500, 1000);
    // Reports sent at 1, 2, 3, 4 s, all delivered at 8 s.
    assert.deepEqual(
      [7010, 6010, 5010, 4010].map((offset) => arrivals.isLate(offset, 2500, 1000)),
      [true, true, true, true],
    );
    assert.equal(arrivals.isLate(12, 2500, 1000), false, 'the next report on time');
  });

  it("takes a sender's clock stepping back as a new normal after two reports that agree", () => {
    const arrivals = new ReportArrivals();
    for (let i = 0; i < 4; i++) arrivals.isLate(10 + i, 2500, 1000);
    // The sender's clock stepped back 60 s: every offset is 60 s larger from now on.
    assert.equal(arrivals.isLate(60_010, 2500, 1000), true, 'the first report after the step is refused');
    assert.equal(arrivals.isLate(60_015, 2500, 1000), false);
    assert.equal(arrivals.usualOffsetMs, 60_015);
    assert.equal(arrivals.isLate(60_011, 2500, 1000), false);
  });

  it('slides, so a slow drift of the clocks never builds up into lateness', () => {
    const arrivals = new ReportArrivals();
    // The sender's clock loses 1 ms per report: after 10,000 reports, 10 s.
    for (let i = 0; i < 10_000; i++) assert.equal(arrivals.isLate(i, 2500, 1000), false, `report ${i}`);
  });

  it('remembers departed reporters up to a bound, oldest first out', () => {
    const departed = new ExpiredReporterArrivals(2);
    const [a, b, c] = [new ReportArrivals(), new ReportArrivals(), new ReportArrivals()];
    departed.remember('a', a);
    departed.remember('b', b);
    departed.remember('c', c);
    assert.equal(departed.size, 2);
    assert.notEqual(departed.take('a'), a, 'a was dropped for c');
    assert.equal(departed.take('b'), b);
    assert.equal(departed.size, 1, 'taken entries are forgotten');
    assert.equal(departed.take('c'), c);
  });
});

describe('late reports at an aggregator', () => {
  function setup() {
    const clock = new ManualClock(START_MS);
    const aggregator = createAggregator({
      id: 'agg-a',
      zone: 'z1',
      parents: [quietParent()],
      scheduler: clock,
      intervalMs: INTERVAL_MS,
      jitterRatio: 0,
    });
    /**
     * A report from `id` arriving now, its window ending `lateMs` before now on the sender's clock
     * (skewed by SKEW_MS): sent that long ago, or from a clock that far behind the others.
     */
    const report = (id: string, sequence: number, offered: number, lateMs = 0) =>
      call(
        aggregator.handleReport,
        hostReport({
          id,
          sequence,
          endMs: clock.nowMs() + SKEW_MS - lateMs,
          buckets: [{ bucket: 'pay', offered }],
        }),
      );
    const offered = () => aggregator.snapshot().buckets.find((b) => b.key === 'pay')?.offeredRps ?? 0;
    return { clock, aggregator, report, offered };
  }

  it('does not count a host again for a report that arrives after it moved on', () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 5; s++) {
      report('h1', s, 100);
      report('h2', s, 100);
      clock.advance(INTERVAL_MS);
    }
    assert.equal(offered(), 200);
    // h1 moves to another aggregator; its report 6 was sent now and is stuck for 8 s.
    for (let s = 6; s <= 13; s++) {
      report('h2', s, 100);
      clock.advance(INTERVAL_MS);
    }
    assert.equal(offered(), 100, 'h1 aged out of the sums after its grace');
    report('h1', 6, 100, 8 * INTERVAL_MS);
    assert.equal(offered(), 100, 'the late report does not bring h1 back');
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
    const h1 = aggregator.snapshot().hosts.find((h) => h.id === 'h1')!;
    assert.equal(h1.counted, false);
  });

  it('still knows the host after it was forgotten (expired), within the departed bound', async () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 5; s++) {
      report('h1', s, 100);
      report('h2', s, 100);
      clock.advance(INTERVAL_MS);
    }
    for (let s = 6; s <= 20; s++) {
      report('h2', s, 100);
      clock.advance(INTERVAL_MS);
    }
    // Hosts expire when the aggregator forwards.
    await aggregator.flush();
    assert.equal(
      aggregator.snapshot().hosts.some((h) => h.id === 'h1'),
      false,
      'h1 expired (10 intervals)',
    );
    // TCP's retransmission backoff delivers h1's stuck report 15 s after it was sent.
    report('h1', 6, 100, 15 * INTERVAL_MS);
    assert.equal(offered(), 100);
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
    assert.equal(
      aggregator.snapshot().hosts.some((h) => h.id === 'h1'),
      false,
      'no state for it either',
    );
  });

  it("counts a report late by less than an interval (the sender's deadline), not one later than that", () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 3; s++) {
      report('h1', s, 100);
      clock.advance(INTERVAL_MS);
    }
    report('h1', 4, 150, 0.6 * INTERVAL_MS);
    assert.equal(offered(), 150, '0.6 s late: still news');
    clock.advance(INTERVAL_MS);
    // Its sender gave up on it long ago and carried its counts into the next report.
    report('h1', 5, 200, 1.5 * INTERVAL_MS);
    assert.equal(offered(), 150, '1.5 s late: refused');
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
  });

  it('costs a host whose clock stepped back one report', () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 3; s++) {
      report('h1', s, 100);
      clock.advance(INTERVAL_MS);
    }
    // h1's clock steps back 30 s: its reports look 30 s late, but they keep coming on time.
    report('h1', 4, 300, 30_000);
    assert.equal(offered(), 100, 'the first report after the step is taken for a late one');
    clock.advance(INTERVAL_MS);
    report('h1', 5, 300, 30_000);
    assert.equal(offered(), 300, 'the second agrees with it: a new normal');
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
  });

  it('costs a host restarted with the same id and a clock 20 s behind one report, not a lockout', () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 50; s++) {
      report('h1', s, 100);
      clock.advance(INTERVAL_MS);
    }
    // Restarted on another machine: sequence 1 again, and every window end 20 s behind.
    report('h1', 1, 200, 20_000);
    assert.equal(offered(), 100);
    clock.advance(INTERVAL_MS);
    report('h1', 2, 200, 20_000);
    assert.equal(offered(), 200);
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
  });

  it("judges a sender's first report against the other senders' usual: a stuck one is refused", () => {
    const { clock, aggregator, report, offered } = setup();
    for (let s = 1; s <= 3; s++) {
      report('h1', s, 100);
      report('h2', s, 100);
      clock.advance(INTERVAL_MS);
    }
    // h3 never reported here: its report to this backup aggregator was stuck for 5 s.
    report('h3', 9, 100, 5 * INTERVAL_MS);
    assert.equal(offered(), 200);
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
    // h4 is new and on time, its clock a little off (300 ms): counted at once.
    report('h4', 1, 100, 300);
    assert.equal(offered(), 300);
    // h5's clock is 10 s behind the others: its first report looks late, its second sets its usual.
    report('h5', 1, 100, 10_000);
    assert.equal(offered(), 300);
    clock.advance(INTERVAL_MS);
    report('h5', 2, 100, 10_000);
    assert.equal(offered(), 400);
  });

  it('does not let a report older than the last applied replace newer usage', () => {
    const { clock, aggregator, report, offered } = setup();
    report('h1', 10, 100);
    clock.advance(INTERVAL_MS);
    // Report 11 is stuck on the old connection; 12 goes out on a fresh one and arrives first.
    clock.advance(INTERVAL_MS);
    report('h1', 12, 300);
    report('h1', 11, 200, INTERVAL_MS);
    assert.equal(offered(), 300);
    assert.equal(aggregator.snapshot().counters.lateReports, 1);
    // A restarted sender starts over at sequence 1, with a newer window: counted.
    clock.advance(INTERVAL_MS);
    report('h1', 1, 50);
    assert.equal(offered(), 50);
  });

  it('counts a host restarted with the same id soon after its start: its sequences are not duplicates', () => {
    const { clock, aggregator, report, offered } = setup();
    // The old process sent 4 reports and crashed; the new one starts over at sequence 1, 3x busier.
    for (let s = 1; s <= 4; s++) {
      report('h1', s, 100);
      clock.advance(INTERVAL_MS);
    }
    const counted: number[] = [];
    for (let s = 1; s <= 5; s++) {
      report('h1', s, 300);
      counted.push(offered());
      clock.advance(INTERVAL_MS);
    }
    assert.deepEqual(counted, [300, 300, 300, 300, 300], `offered after each report: ${counted.join(', ')}`);
    assert.equal(aggregator.snapshot().counters.duplicateReports, 0);
    // A real retry (the same report: same sequence, same window) is still counted once.
    report('h1', 5, 300, INTERVAL_MS);
    assert.equal(aggregator.snapshot().counters.duplicateReports, 1);
  });

  it('treats a retried report (same sequence) as a duplicate, not as late', () => {
    const { clock, aggregator, report } = setup();
    report('h1', 1, 100);
    clock.advance(5 * INTERVAL_MS);
    report('h1', 1, 100, 5 * INTERVAL_MS);
    assert.equal(aggregator.snapshot().counters.duplicateReports, 1);
    assert.equal(aggregator.snapshot().counters.lateReports, 0);
  });
});

describe('late reports at the controller', () => {
  it('does not count an aggregator forward that arrives seconds after it was sent', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({
      id: 'ctl',
      scheduler: clock,
      config: {
        version: 1,
        intervalMs: INTERVAL_MS,
        ttlMs: 4 * INTERVAL_MS,
        buckets: [{ key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' }],
        ratioPolicy: { kind: 'plain' },
      },
    });
    const forward = (id: string, sequence: number, offered: number, lateMs = 0) =>
      call(
        controller.handleReport,
        hostReport({
          id,
          sequence,
          endMs: clock.nowMs() + SKEW_MS - lateMs,
          hostCount: 10,
          buckets: [{ bucket: 'pay', offered }],
        }),
      );
    for (let s = 1; s <= 3; s++) {
      forward('agg-a', s, 100);
      forward('agg-b', s, 100);
      clock.advance(INTERVAL_MS);
      controller.tick();
    }
    for (let s = 4; s <= 8; s++) {
      forward('agg-b', s, 200);
      clock.advance(INTERVAL_MS);
      controller.tick();
    }
    const offered = () => controller.snapshot().buckets.find((b) => b.key === 'pay')!.offeredRps;
    assert.equal(offered(), 200, "agg-a's hosts moved to agg-b");
    forward('agg-a', 4, 100, 5 * INTERVAL_MS);
    controller.tick();
    assert.equal(offered(), 200);
    assert.equal(controller.snapshot().counters.lateReports, 1);
  });

  it('counts an aggregator restarted with the same id soon after its start', () => {
    const clock = new ManualClock(START_MS);
    const controller = createController({
      id: 'ctl',
      scheduler: clock,
      config: {
        version: 1,
        intervalMs: INTERVAL_MS,
        ttlMs: 4 * INTERVAL_MS,
        buckets: [{ key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' }],
        ratioPolicy: { kind: 'plain' },
      },
    });
    const forward = (sequence: number, offered: number) =>
      call(
        controller.handleReport,
        hostReport({
          id: 'agg-a',
          sequence,
          endMs: clock.nowMs() + SKEW_MS,
          tier: Tier.AGGREGATOR,
          hostCount: 10,
          buckets: [{ bucket: 'pay', offered }],
        }),
      );
    for (let s = 1; s <= 3; s++) {
      forward(s, 100);
      clock.advance(INTERVAL_MS);
      controller.tick();
    }
    const counted: number[] = [];
    for (let s = 1; s <= 4; s++) {
      forward(s, 400);
      clock.advance(INTERVAL_MS);
      controller.tick();
      counted.push(controller.snapshot().buckets.find((b) => b.key === 'pay')!.offeredRps);
    }
    assert.deepEqual(counted, [400, 400, 400, 400], `offered after each forward: ${counted.join(', ')}`);
    assert.equal(controller.snapshot().counters.duplicateReports, 0);
  });
});
