import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { type ChildTier, createAggregator } from '../../src/control/aggregator.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../../src/core/errors.js';
import {
  DirectiveSchema,
  Mode,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
  Tier,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { advance, call, hostReport } from './report-fixtures.js';

const START_MS = 1_700_000_000_000;

/** A parent that records what it receives and answers with what the test tells it to. */
function fakeParent(target: string) {
  const received: ReportRequest[] = [];
  const state = {
    received,
    fail: false,
    /** Never settles while set (the aggregator must not wait for it). */
    hang: false,
    directives: [] as ReportResponse['directives'],
    reportIntervalMs: 0,
  };
  let release: (() => void) | undefined;
  const client: ControlClient = {
    target,
    report(request) {
      received.push(request);
      if (state.fail) return Promise.reject(new SpillwayError(ErrorCode.StoreUnavailable, `${target} down`));
      const response = create(ReportResponseSchema, {
        directives: state.directives,
        reportIntervalMs: state.reportIntervalMs,
        epoch: 1n,
        responderId: target,
      });
      if (state.hang) return new Promise((resolve) => (release = () => resolve(response)));
      return Promise.resolve(response);
    },
    close() {},
  };
  return { client, state, release: () => release?.() };
}

function directive(
  bucket: string,
  options: { version: number; epoch?: number; dropRatio?: number; ttlMs?: number },
) {
  return create(DirectiveSchema, {
    bucket,
    dropRatio: options.dropRatio ?? 0.25,
    mode: Mode.ENFORCE,
    limitRps: 100,
    offeredRps: 133,
    epoch: BigInt(options.epoch ?? 1),
    version: BigInt(options.version),
    ttlMs: options.ttlMs ?? 4000,
  });
}

function setup(
  parents = [fakeParent('ctl-1')],
  extra: { hostGraceMs?: number; hostExpiryMs?: number; childTiers?: ChildTier[] } = {},
) {
  const clock = new ManualClock(START_MS);
  const aggregator = createAggregator({
    id: 'agg-a',
    zone: 'a',
    region: 'eu',
    parents: parents.map((p) => p.client),
    scheduler: clock,
    random: seededRandom(7),
    ...extra,
  });
  return { clock, aggregator, parents };
}

describe('aggregator', () => {
  it('forwards one report per flush: summed rates times its own window, tier, zone, host count', async () => {
    const { clock, aggregator, parents } = setup(undefined, { childTiers: ['host', 'aggregator'] });
    aggregator.start();
    const now = clock.nowMs();
    // 100 over 1 s and 400 over 2 s (both 100 rps, 200 rps total); admitted 50 + 100 rps.
    call(
      aggregator.handleReport,
      hostReport({
        id: 'h1',
        sequence: 1,
        endMs: now,
        buckets: [{ bucket: 'pay', offered: 100, admitted: 50 }],
      }),
    );
    call(
      aggregator.handleReport,
      hostReport({
        id: 'h2',
        sequence: 1,
        endMs: now,
        windowMs: 2000,
        buckets: [
          { bucket: 'pay', offered: 400, admitted: 200 },
          { bucket: 'x', offered: 2 },
        ],
      }),
    );
    call(
      aggregator.handleReport,
      hostReport({
        id: 'sub-agg',
        tier: Tier.AGGREGATOR,
        hostCount: 5,
        sequence: 1,
        endMs: now,
        buckets: [],
      }),
    );
    clock.advance(500);
    await aggregator.flush();
    const sent = parents[0]!.state.received.at(-1)!;
    assert.equal(sent.reporterId, 'agg-a');
    assert.equal(sent.tier, Tier.AGGREGATOR);
    assert.equal(sent.zone, 'a');
    assert.equal(sent.region, 'eu');
    assert.equal(sent.hostCount, 7);
    assert.equal(Number(sent.windowEndMs - sent.windowStartMs), 500);
    const pay = sent.buckets.find((b) => b.bucket === 'pay')!;
    assert.equal(pay.offered, 150); // 300 rps for 0.5 s
    assert.equal(pay.admitted, 75);
    assert.equal(sent.buckets.find((b) => b.bucket === 'x')!.offered, 0.5);
    // The health check's counts, read without a snapshot, agree with the snapshot's.
    const snapshot = aggregator.snapshot();
    assert.deepEqual(aggregator.health(), {
      hosts: snapshot.hosts.length,
      parentsHealthy: snapshot.parents.filter((p) => p.healthy).length,
      lastForwardAtMs: snapshot.lastForward?.atMs,
    });
    assert.equal(aggregator.health().hosts, 3);
    await aggregator.stop();
  });

  it('a host that missed reports keeps its last rate for the grace period, then stops counting, then expires', async () => {
    const { clock, aggregator, parents } = setup([fakeParent('ctl-1')], {
      hostGraceMs: 2500,
      hostExpiryMs: 10_000,
    });
    aggregator.start();
    const report = (id: string, seq: number) =>
      call(
        aggregator.handleReport,
        hostReport({ id, sequence: seq, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
      );
    report('h1', 1);
    report('h2', 1);
    const offeredRps = () => {
      const sent = parents[0]!.state.received.at(-1)!;
      const windowSec = Number(sent.windowEndMs - sent.windowStartMs) / 1000;
      return (sent.buckets.find((b) => b.bucket === 'pay')?.offered ?? 0) / windowSec;
    };
    for (let seq = 2; seq <= 3; seq++) {
      clock.advance(1000);
      report('h1', seq); // h2 is silent
      await aggregator.flush();
      assert.ok(Math.abs(offeredRps() - 200) < 1e-9, `within grace, no dip: ${offeredRps()}`);
      assert.equal(parents[0]!.state.received.at(-1)!.hostCount, 2);
    }
    clock.advance(1000);
    report('h1', 4);
    await aggregator.flush(); // h2 silent 3 s > 2.5 s grace
    assert.ok(Math.abs(offeredRps() - 100) < 1e-9, `after grace: ${offeredRps()}`);
    assert.equal(parents[0]!.state.received.at(-1)!.hostCount, 1);
    assert.deepEqual(
      aggregator.snapshot().hosts.map((h) => [h.id, h.counted]),
      [
        ['h1', true],
        ['h2', false],
      ],
    );
    clock.advance(8000);
    report('h1', 5);
    await aggregator.flush();
    assert.deepEqual(
      aggregator.snapshot().hosts.map((h) => h.id),
      ['h1'],
    );
    assert.equal(aggregator.snapshot().counters.expiredHosts, 1);
    await aggregator.stop();
  });

  it('a reporter from another aggregator that still counts it joins the sums when that one stops', async () => {
    const { clock, aggregator, parents } = setup([fakeParent('ctl-1')], { hostGraceMs: 2500 });
    const report = (id: string, sequence: number, acknowledgedBy: string, sinceAckMs: number) =>
      call(
        aggregator.handleReport,
        hostReport({
          id,
          sequence,
          endMs: clock.nowMs(),
          windowMs: sinceAckMs,
          acknowledgedBy,
          acknowledgedEndMs: clock.nowMs() - sinceAckMs,
          buckets: [{ bucket: 'pay', offered: sinceAckMs / 10 }], // 100 rps
        }),
      );
    const forwarded = () => {
      const sent = parents[0]!.state.received.at(-1)!;
      const windowSec = Number(sent.windowEndMs - sent.windowStartMs) / 1000;
      return {
        offeredRps: (sent.buckets.find((b) => b.bucket === 'pay')?.offered ?? 0) / windowSec,
        hostCount: sent.hostCount,
      };
    };
    const joinedAtMs = clock.nowMs();
    // agg-b acknowledged h1 2 s ago (by h1's clock) and counts it for 0.5 s more.
    report('h1', 5, 'agg-b', 2000);
    let host = aggregator.snapshot().hosts[0]!;
    assert.equal(host.counted, false);
    assert.equal(host.heldOutUntilMs, joinedAtMs + 500);
    await aggregator.flush();
    assert.deepEqual(forwarded(), { offeredRps: 0, hostCount: 0 });
    // A report while held does not move the end of the hold.
    clock.advance(250);
    report('h1', 6, 'agg-a', 250);
    assert.equal(aggregator.snapshot().hosts[0]!.heldOutUntilMs, joinedAtMs + 500);
    clock.advance(250);
    await aggregator.flush();
    host = aggregator.snapshot().hosts[0]!;
    assert.equal(host.counted, true);
    assert.equal(host.heldOutUntilMs, undefined);
    assert.deepEqual(forwarded(), { offeredRps: 100, hostCount: 1 });
    // Acknowledged by this aggregator (it restarted, or h2 came back), or by another one longer
    // ago than the grace, or by nobody: counted at once.
    report('h2', 3, 'agg-a', 1000);
    report('h3', 9, 'agg-b', 2500);
    report('h4', 1, '', 1000);
    await aggregator.flush();
    assert.deepEqual(forwarded(), { offeredRps: 400, hostCount: 4 });
    assert.equal(aggregator.snapshot().counters.heldOutReporters, 1);
  });

  it('relays the parent directives to hosts for their buckets, with the TTL they have left', async () => {
    const parent = fakeParent('ctl-1');
    const { clock, aggregator } = setup([parent]);
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    call(
      aggregator.handleReport,
      hostReport({
        id: 'h2',
        sequence: 1,
        endMs: clock.nowMs(),
        buckets: [{ bucket: 'other', offered: 100 }],
      }),
    );
    parent.state.directives = [
      directive('pay', { version: 3 }),
      directive('other', { version: 3, dropRatio: 0 }),
      directive('unknown', { version: 3 }),
    ];
    await aggregator.flush();
    clock.advance(1500);
    const reply = call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 2, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    assert.equal(reply.directives.length, 1);
    const d = reply.directives[0]!;
    assert.equal(d.bucket, 'pay');
    assert.equal(d.dropRatio, 0.25);
    assert.equal(d.version, 3n);
    assert.equal(d.ttlMs, 2500);
    assert.equal(reply.epoch, 1n);
    assert.equal(reply.responderId, 'agg-a');
    clock.advance(2600);
    const stale = call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 3, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    assert.equal(
      stale.directives.length,
      0,
      'an expired directive is not relayed: the host stale policy takes over',
    );
  });

  it('ignores directives older (epoch, version) than the cached one while it is fresh', async () => {
    const parent = fakeParent('ctl-1');
    const { clock, aggregator } = setup([parent]);
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    parent.state.directives = [directive('pay', { epoch: 5, version: 10, dropRatio: 0.5 })];
    await aggregator.flush();
    parent.state.directives = [directive('pay', { epoch: 5, version: 9, dropRatio: 0.1 })];
    await aggregator.flush();
    parent.state.directives = [directive('pay', { epoch: 4, version: 99, dropRatio: 0.1 })];
    await aggregator.flush();
    const ratio = () =>
      call(
        aggregator.handleReport,
        hostReport({
          id: 'h1',
          sequence: Number(clock.nowMs()),
          endMs: clock.nowMs(),
          buckets: [{ bucket: 'pay', offered: 100 }],
        }),
      ).directives[0]?.dropRatio;
    assert.equal(ratio(), 0.5);
    assert.equal(aggregator.snapshot().counters.staleDirectives, 2);
    parent.state.directives = [directive('pay', { epoch: 6, version: 1, dropRatio: 0.3 })];
    await aggregator.flush();
    assert.equal(ratio(), 0.3, 'a newer epoch (restarted controller) wins');
    clock.advance(4000);
    parent.state.directives = [directive('pay', { epoch: 2, version: 1, dropRatio: 0.2 })];
    await aggregator.flush();
    assert.equal(ratio(), 0.2, 'once the cached directive is stale, any directive replaces it');
  });

  it('a host back in the sums does not get a cached directive that loosens it until a forward has counted it', async () => {
    const parent = fakeParent('ctl-1');
    const { clock, aggregator } = setup([parent]);
    const sequences = new Map<string, number>();
    /** `id` reports 100 calls of `pay`, `admitted` of them let through; the ratio it gets back, if any. */
    const report = (id: string, admitted: number) => {
      const sequence = (sequences.get(id) ?? 0) + 1;
      sequences.set(id, sequence);
      return call(
        aggregator.handleReport,
        hostReport({
          id,
          sequence,
          endMs: clock.nowMs(),
          buckets: [{ bucket: 'pay', offered: 100, admitted }],
        }),
      ).directives.find((d) => d.bucket === 'pay')?.dropRatio;
    };
    report('h1', 50);
    report('h2', 50);
    parent.state.directives = [directive('pay', { version: 1, dropRatio: 0.5 })];
    await aggregator.flush();
    assert.equal(report('h1', 50), 0.5);

    // h1 is cut off past the host grace; the forwards without it bring back a ratio near 0.
    clock.advance(3000);
    assert.equal(report('h2', 50), 0.5);
    parent.state.directives = [directive('pay', { version: 2, dropRatio: 0.01 })];
    await aggregator.flush();
    assert.equal(report('h2', 50), 0.01, 'a host counted all along gets what its forward brought');

    assert.equal(report('h1', 50), undefined, 'h1 back: computed without it, 0.01 would loosen its 0.5');
    assert.equal(aggregator.snapshot().counters.withheldDirectives, 1);
    assert.equal(report('h1', 50), undefined, 'and on until a forward has counted it');
    assert.equal(report('h-new', 100), 0.01, 'a new host that drops nothing gets it at once (cold start)');

    parent.state.directives = [];
    await aggregator.flush();
    assert.equal(
      report('h1', 50),
      undefined,
      'a reply without the bucket leaves the cached directive as it was',
    );
    parent.state.directives = [directive('pay', { version: 2, dropRatio: 0.01 })];
    await aggregator.flush();
    assert.equal(
      report('h1', 50),
      undefined,
      'the same version again (a stateful policy between ticks, a parent relaying its cache) is the same computation',
    );
    parent.state.directives = [directive('pay', { version: 3, dropRatio: 0.2 })];
    await aggregator.flush();
    assert.equal(
      report('h1', 50),
      0.2,
      'a directive from a forward that counted h1 is relayed, loosening or not',
    );

    // Cut off again; directives that do not loosen what it applies reach it at once.
    clock.advance(3000);
    parent.state.directives = [directive('pay', { version: 4, dropRatio: 0.78 })];
    await aggregator.flush();
    assert.equal(report('h1', 80), 0.78, 'tighter');
    clock.advance(3000);
    parent.state.directives = [directive('pay', { version: 5, dropRatio: 0.76 })];
    await aggregator.flush();
    assert.equal(report('h1', 22), 0.76, 'looser within the slack: 0.24 admitted vs 0.22 (5%, 3 sigma)');
    assert.equal(aggregator.snapshot().counters.withheldDirectives, 4);

    // Back while a forward built without it is in flight: that forward's directive is not for it.
    clock.advance(3000);
    parent.state.hang = true;
    parent.state.directives = [directive('pay', { version: 6, dropRatio: 0.01 })];
    const inFlight = aggregator.flush();
    assert.equal(report('h1', 50), 0.76, 'the cached ratio tightens its 0.5: relayed');
    parent.release();
    await inFlight;
    assert.equal(report('h1', 50), undefined, 'the forward in flight when it came back did not count it');
    parent.state.hang = false;
    parent.state.directives = [directive('pay', { version: 7, dropRatio: 0.01 })];
    await aggregator.flush();
    assert.equal(report('h1', 50), 0.01);
  });

  it('fails over across parents in order, prefers the first again after its backoff', async () => {
    const a = fakeParent('ctl-a');
    const b = fakeParent('ctl-b');
    const { clock, aggregator } = setup([a, b]);
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    a.state.fail = true;
    await aggregator.flush();
    assert.equal(a.state.received.length, 1);
    assert.equal(b.state.received.length, 1);
    assert.equal(
      b.state.received[0]!.sequence,
      a.state.received[0]!.sequence,
      'the same report goes to the next parent',
    );
    assert.equal(b.state.received[0]!.acknowledgedBy, '', 'nothing acknowledged yet');
    clock.advance(1000);
    await aggregator.flush();
    assert.equal(a.state.received.length, 1, 'a backs off');
    assert.equal(b.state.received.length, 2);
    // Each forward names the parent that acknowledged the previous one, and that one's window end.
    assert.equal(b.state.received[1]!.acknowledgedBy, 'ctl-b');
    assert.equal(b.state.received[1]!.acknowledgedWindowEndMs, b.state.received[0]!.windowEndMs);
    a.state.fail = false;
    clock.advance(5000);
    await aggregator.flush();
    assert.equal(a.state.received.length, 2, 'back to the first parent after backoff');
    assert.equal(aggregator.snapshot().lastForward?.target, 'ctl-a');
    assert.equal(aggregator.snapshot().counters.parentFailures, 1);
    assert.equal(aggregator.snapshot().counters.forwardFailures, 0);
  });

  it('a dead parent never fails or delays a host report; the cached directives keep flowing until their TTL', async () => {
    const parent = fakeParent('ctl-1');
    const { clock, aggregator } = setup([parent]);
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    parent.state.directives = [directive('pay', { version: 1, ttlMs: 4000 })];
    await aggregator.flush();
    parent.state.fail = true;
    aggregator.start();
    await advance(clock, 3000, 100);
    const reply = call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 2, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    assert.equal(reply.directives.length, 1);
    assert.ok(reply.directives[0]!.ttlMs <= 1000);
    const snap = aggregator.snapshot();
    assert.ok(snap.counters.forwardFailures >= 2, `failures: ${snap.counters.forwardFailures}`);
    assert.deepEqual(snap.parents, [{ target: 'ctl-1', healthy: false }]);
    await aggregator.stop();
  });

  it('keeps at most one forward in flight: timer firings meanwhile are skipped and counted', async () => {
    const parent = fakeParent('ctl-1');
    parent.state.hang = true;
    const clock = new ManualClock(START_MS);
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'a',
      parents: [parent.client],
      scheduler: clock,
      random: seededRandom(1),
      reportTimeoutMs: 60_000,
    });
    aggregator.start();
    await advance(clock, 5000, 100);
    assert.equal(parent.state.received.length, 1);
    assert.ok(aggregator.snapshot().counters.skippedForwards >= 3);
    // Host reports are answered meanwhile.
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 1 }] }),
    );
    parent.state.hang = false;
    parent.release();
    await advance(clock, 1200, 100);
    assert.ok(parent.state.received.length >= 2, 'forwarding resumes once the hung forward settles');
    await aggregator.stop();
  });

  it('forwards on a jittered interval and adopts the interval the parent asks for', async () => {
    const parent = fakeParent('ctl-1');
    parent.state.reportIntervalMs = 2000;
    const { clock, aggregator } = setup([parent]);
    aggregator.start();
    await advance(clock, 1100, 10);
    assert.equal(parent.state.received.length, 1, 'first forward within 1 s ± 10%');
    assert.equal(aggregator.snapshot().intervalMs, 2000);
    const reply = call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [] }),
    );
    assert.equal(reply.reportIntervalMs, 2000, 'hosts are told the same interval');
    await advance(clock, 1000 * 0.9 + 2000 * 1.1 - 1100 + 50, 10);
    assert.equal(parent.state.received.length, 2);
    await aggregator.stop();
  });

  it('counts duplicate host reports once; refuses invalid reports and hosts past maxHosts', () => {
    const clock = new ManualClock(START_MS);
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'a',
      parents: [fakeParent('p').client],
      scheduler: clock,
      maxHosts: 1,
    });
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 4, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    call(
      aggregator.handleReport,
      hostReport({ id: 'h1', sequence: 4, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 900 }] }),
    );
    assert.equal(aggregator.snapshot().buckets[0]!.offeredRps, 100);
    assert.equal(aggregator.snapshot().counters.duplicateReports, 1);
    assert.throws(
      () =>
        call(
          aggregator.handleReport,
          hostReport({ id: 'h2', sequence: 1, endMs: clock.nowMs(), buckets: [] }),
        ),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_CAPACITY_EXCEEDED'),
    );
    assert.throws(
      () =>
        call(
          aggregator.handleReport,
          hostReport({
            id: 'h1',
            sequence: 5,
            endMs: clock.nowMs(),
            buckets: [{ bucket: 'pay', offered: -1 }],
          }),
        ),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'),
    );
    assert.deepEqual(aggregator.snapshot().counters.rejectedReports, {
      ERR_SPILLWAY_CAPACITY_EXCEEDED: 1,
      ERR_SPILLWAY_INVALID_REPORT: 1,
    });
  });

  it('two aggregators sharing a zone: their forwards sum to the zone (a host that fails over moves its rate)', async () => {
    const parent = fakeParent('ctl');
    const clock = new ManualClock(START_MS);
    const make = (id: string) =>
      createAggregator({ id, zone: 'a', parents: [parent.client], scheduler: clock, hostGraceMs: 2500 });
    const one = make('agg-1');
    const two = make('agg-2');
    call(
      one.handleReport,
      hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 100 }] }),
    );
    call(
      two.handleReport,
      hostReport({ id: 'h2', sequence: 1, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 300 }] }),
    );
    clock.advance(1000);
    await one.flush();
    await two.flush();
    const rate = (r: ReportRequest) =>
      r.buckets[0]!.offered / (Number(r.windowEndMs - r.windowStartMs) / 1000);
    assert.equal(
      parent.state.received.map(rate).reduce((a, b) => a + b, 0),
      400,
    );
    assert.equal(one.snapshot().buckets[0]!.offeredRps + two.snapshot().buckets[0]!.offeredRps, 400);
  });

  it('rejects construction without parents', () => {
    assert.throws(
      () => createAggregator({ id: 'agg', zone: 'a', parents: [] }),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
    );
  });
});
