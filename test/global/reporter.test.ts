import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { ErrorCode } from '../../src/core/errors.js';
import {
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
  Tier,
} from '../../src/gen/spillway/v1/control_pb.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { advance, drive, FakeAggregator, harness, settle } from './fixtures.js';

function usage(request: ReportRequest): Record<string, [number, number, number]> {
  return Object.fromEntries(request.buckets.map((b) => [b.bucket, [b.offered, b.admitted, b.wouldDrop]]));
}

/** Two aggregators of one zone, in failover order. */
function twoAggregators() {
  const clock = new ManualClock(0);
  const network = new InMemoryNetwork({ scheduler: clock, delayMs: 2 });
  const agg1 = new FakeAggregator('agg-1');
  const agg2 = new FakeAggregator('agg-2');
  network.listen('agg-1', agg1.handler);
  network.listen('agg-2', agg2.handler);
  const warnings: object[] = [];
  const limiter = createGlobalLimiter({
    reporterId: 'host-1',
    clients: [network.connect('agg-1', { from: 'host-1' }), network.connect('agg-2', { from: 'host-1' })],
    scheduler: clock,
    random: seededRandom(5),
    jitterRatio: 0,
    logger: { warn: (obj) => warnings.push(obj) },
  });
  return { clock, network, agg1, agg2, limiter, warnings, flush: () => drive(clock, limiter.flush()) };
}

describe('reporter', () => {
  it('snapshots and resets per-window counts, exactly, into one batched report', async () => {
    const h = harness();
    const t0 = h.clock.nowMs();
    const a = h.limiter.bucket('a');
    const b = h.limiter.bucket('b');
    h.limiter.bucket('idle');
    for (let i = 0; i < 10; i++) a.allow();
    for (let i = 0; i < 5; i++) b.allow(2);
    h.limiter.allow('by-key', 4);
    h.clock.advance(700);
    await h.flush();
    const first = h.aggregator.last;
    assert.equal(first.reporterId, 'host-1');
    assert.equal(first.tier, Tier.HOST);
    assert.equal(first.zone, 'z1');
    assert.equal(first.region, 'r1');
    assert.equal(first.hostCount, 1);
    assert.equal(first.sequence, 1n);
    assert.equal(first.windowStartMs, BigInt(t0));
    assert.equal(first.windowEndMs, BigInt(t0 + 700));
    assert.deepEqual(usage(first), { a: [10, 10, 0], b: [10, 10, 0], 'by-key': [4, 4, 0] });

    for (let i = 0; i < 3; i++) a.allow();
    h.clock.advance(300);
    await h.flush();
    const second = h.aggregator.last;
    assert.equal(second.sequence, 2n);
    assert.equal(second.windowStartMs, BigInt(t0 + 700));
    assert.equal(second.windowEndMs, BigInt(t0 + 1000));
    assert.deepEqual(usage(second), { a: [3, 3, 0] }, 'only buckets with activity (or a live directive)');

    await h.flush();
    assert.deepEqual(usage(h.aggregator.last), {});
    const snap = h.limiter.snapshot();
    assert.equal(snap.buckets.find((x) => x.key === 'a')!.offered, 13, 'totals stay cumulative');
    assert.equal(snap.reporter.reportsSent, 3);
    assert.equal(snap.reporter.reportsSucceeded, 3);
  });

  it('reports dropped and would-drop counts: offered includes drops', async () => {
    const h = harness({}, 3);
    const enforce = h.limiter.bucket('e');
    const shadow = h.limiter.bucket('s');
    h.aggregator.set('e', { dropRatio: 0.5 });
    h.aggregator.set('s', { dropRatio: 0.5, mode: 'shadow' });
    await h.flush();
    let dropped = 0;
    for (let i = 0; i < 1000; i++) if (!enforce.allow()) dropped++;
    for (let i = 0; i < 1000; i++) shadow.allow();
    await h.flush();
    const u = usage(h.aggregator.last);
    assert.deepEqual(u.e, [1000, 1000 - dropped, 0]);
    assert.equal(u.s?.[0], 1000);
    assert.equal(u.s?.[1], 1000);
    assert.ok(u.s![2] > 400 && u.s![2] < 600);
  });

  it('keeps reporting a bucket with a live directive and no traffic, with zeros, until it expires', async () => {
    const h = harness();
    h.limiter.bucket('quiet');
    h.limiter.allow('quiet');
    h.aggregator.set('quiet', { dropRatio: 0.1, ttlMs: 2_000 });
    await h.flush();
    h.aggregator.directives.clear();
    h.clock.advance(1_000);
    await h.flush();
    assert.deepEqual(usage(h.aggregator.last), { quiet: [0, 0, 0] });
    h.clock.advance(1_000);
    await h.flush();
    assert.deepEqual(usage(h.aggregator.last), {});
  });

  it('reports every interval once started (jittered), and follows the reply’s interval', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock });
    const aggregator = new FakeAggregator();
    network.listen('agg-1', aggregator.handler);
    const limiter = createGlobalLimiter({
      reporterId: 'h',
      clients: [network.connect('agg-1')],
      scheduler: clock,
      random: seededRandom(9),
      intervalMs: 1_000,
      jitterRatio: 0.1,
    });
    limiter.start();
    await advance(clock, 10_000, 10);
    const ends = aggregator.requests.map((r) => Number(r.windowEndMs));
    assert.ok(ends.length >= 9 && ends.length <= 11, `${ends.length} reports`);
    const gaps = ends.slice(1).map((end, i) => end - ends[i]!);
    assert.ok(
      gaps.every((g) => g >= 900 && g <= 1_110),
      `gaps ${gaps}`,
    );
    assert.ok(new Set(gaps).size > 3, 'jittered');

    aggregator.reportIntervalMs = 250;
    await advance(clock, 1_200, 10);
    const before = aggregator.requests.length;
    await advance(clock, 2_500, 10);
    const sent = aggregator.requests.length - before;
    assert.ok(sent >= 9 && sent <= 11, `${sent} reports in 2.5 s at 250 ms`);
    assert.equal(limiter.snapshot().reporter.intervalMs, 250);
    await limiter.stop();
    const after = aggregator.requests.length;
    await advance(clock, 5_000, 100);
    assert.equal(aggregator.requests.length, after, 'stop() cancels the timer');
    assert.equal(clock.pendingTimers, 0);
  });

  it('fails over to the next client on failure, round robin, and counts it', async () => {
    const h = twoAggregators();
    h.limiter.allow('k');
    h.network.partition('agg-1', true);
    await h.flush();
    let stats = h.limiter.snapshot().reporter;
    assert.equal(stats.reportsFailed, 1);
    assert.equal(stats.failovers, 1);
    assert.equal(stats.clientIndex, 1);
    assert.equal(stats.clientTarget, 'agg-2');
    await h.flush();
    assert.equal(h.agg2.requests.length, 1);
    assert.equal(h.agg1.requests.length, 0);

    h.network.partition('agg-1', false);
    h.network.partition('agg-2', true);
    await h.flush();
    await h.flush();
    stats = h.limiter.snapshot().reporter;
    assert.equal(stats.failovers, 2);
    assert.equal(stats.clientIndex, 0, 'wraps around');
    assert.equal(h.agg1.requests.length, 1);
    assert.equal(stats.consecutiveFailures, 0);
    assert.equal(h.warnings.length, 2, 'one warning per failure streak start');
  });

  it('names the receiver that acknowledged its last acknowledged report, and that report’s window end', async () => {
    const h = twoAggregators();
    h.limiter.allow('k');
    await h.flush();
    assert.equal(h.agg1.last.acknowledgedBy, '', 'none yet');
    assert.equal(h.agg1.last.acknowledgedWindowEndMs, 0n);
    const first = h.agg1.last;
    h.clock.advance(1000);
    await h.flush();
    assert.equal(h.agg1.last.acknowledgedBy, 'agg-1');
    assert.equal(h.agg1.last.acknowledgedWindowEndMs, first.windowEndMs);
    const lastAcknowledged = h.agg1.last;
    // agg-1 unreachable: the report that fails over to agg-2 still names agg-1, which counts the
    // host for its grace from that last report.
    h.network.partition('agg-1', true);
    h.clock.advance(1000);
    await h.flush();
    h.clock.advance(1000);
    await h.flush();
    assert.equal(h.agg2.last.acknowledgedBy, 'agg-1');
    assert.equal(h.agg2.last.acknowledgedWindowEndMs, lastAcknowledged.windowEndMs);
    assert.equal(h.agg2.last.windowStartMs, lastAcknowledged.windowEndMs);
    h.clock.advance(1000);
    await h.flush();
    assert.equal(h.agg2.last.acknowledgedBy, 'agg-2');
  });

  it('does not pass on a responder id longer than receivers take (they would refuse every report)', async () => {
    const clock = new ManualClock(0);
    const requests: ReportRequest[] = [];
    let responderId = 'x'.repeat(257);
    const client: ControlClient = {
      target: 'long-id',
      report(request) {
        requests.push(request);
        return Promise.resolve(create(ReportResponseSchema, { responderId, epoch: 1n }));
      },
      close() {},
    };
    const limiter = createGlobalLimiter({ reporterId: 'h', clients: [client], scheduler: clock });
    limiter.allow('k');
    await drive(clock, limiter.flush());
    await drive(clock, limiter.flush());
    assert.equal(requests[1]!.acknowledgedBy, '');
    responderId = 'é'.repeat(128); // 256 bytes: taken
    await drive(clock, limiter.flush());
    await drive(clock, limiter.flush());
    assert.equal(requests[3]!.acknowledgedBy, responderId);
  });

  it('fails over on a timeout too (a hung aggregator)', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock });
    network.listen('hung', () => new Promise<ReportResponse>(() => {}));
    const agg = new FakeAggregator();
    network.listen('ok', agg.handler);
    const limiter = createGlobalLimiter({
      reporterId: 'h',
      clients: [network.connect('hung'), network.connect('ok')],
      scheduler: clock,
      reportTimeoutMs: 300,
    });
    limiter.allow('k');
    const start = clock.nowMs();
    await drive(clock, limiter.flush());
    assert.equal(clock.nowMs() - start, 300);
    const stats = limiter.snapshot().reporter;
    assert.equal(stats.reportsFailed, 1);
    assert.equal(stats.clientTarget, 'ok');
    await drive(clock, limiter.flush());
    assert.deepEqual(usage(agg.last), { k: [1, 1, 0] }, 'the timed-out counts are carried over');
  });

  it('carries a failed report’s counts into the next report, with the failed window’s start', async () => {
    const h = harness();
    const t0 = h.clock.nowMs();
    const a = h.limiter.bucket('a');
    for (let i = 0; i < 10; i++) a.allow();
    h.clock.advance(1_000);
    h.network.partition('agg-1', true);
    await h.flush();
    assert.equal(h.aggregator.requests.length, 0);
    for (let i = 0; i < 5; i++) a.allow();
    h.clock.advance(1_000);
    h.network.partition('agg-1', false);
    await h.flush();
    const report = h.aggregator.last;
    assert.deepEqual(usage(report), { a: [15, 15, 0] });
    assert.equal(
      report.windowStartMs,
      BigInt(t0),
      'the window spans both intervals, so the rate stays exact',
    );
    assert.equal(report.windowEndMs, BigInt(t0 + 2_000));
    assert.equal(report.sequence, 2n, 'every report gets a new sequence');
    await h.flush();
    assert.deepEqual(usage(h.aggregator.last), {}, 'acknowledged counts are not sent twice');
  });

  it('bounds the carry-over window, scaling old counts to keep the rate', async () => {
    const h = harness({ carryOverMaxMs: 2_000 });
    const a = h.limiter.bucket('a');
    h.network.partition('agg-1', true);
    for (let second = 0; second < 10; second++) {
      for (let i = 0; i < 100; i++) a.allow();
      h.clock.advance(1_000);
      await h.flush();
    }
    h.network.partition('agg-1', false);
    for (let i = 0; i < 100; i++) a.allow();
    h.clock.advance(1_000);
    await h.flush();
    const report = h.aggregator.last;
    const windowMs = Number(report.windowEndMs - report.windowStartMs);
    assert.equal(windowMs, 2_000);
    const offeredRps = (report.buckets[0]!.offered * 1000) / windowMs;
    assert.ok(Math.abs(offeredRps - 100) < 1e-6, `offered rate ${offeredRps}`);
    assert.equal(h.limiter.snapshot().buckets[0]!.offered, 1_100, 'local totals keep every call');
  });

  it('never sends a window longer than receivers take, however long the carry-over bound', async () => {
    // 5 intervals of 15 s could carry 75 s; receivers refuse windows over 60 s, and a host that
    // sent one would be refused for good.
    const h = harness({ intervalMs: 15_000 });
    const a = h.limiter.bucket('a');
    h.network.partition('agg-1', true);
    for (let report = 0; report < 5; report++) {
      for (let i = 0; i < 150; i++) a.allow();
      h.clock.advance(15_000);
      await h.flush();
    }
    h.network.partition('agg-1', false);
    for (let i = 0; i < 150; i++) a.allow();
    h.clock.advance(15_000);
    await h.flush();
    const report = h.aggregator.last;
    const windowMs = Number(report.windowEndMs - report.windowStartMs);
    assert.equal(windowMs, 60_000);
    const offeredRps = (report.buckets[0]!.offered * 1000) / windowMs;
    assert.ok(Math.abs(offeredRps - 10) < 1e-6, `offered rate ${offeredRps}`);
  });

  it('caps buckets per report; deferred buckets go first next time, rate-preserved', async () => {
    const h = harness({ maxBucketsPerReport: 3 });
    for (const key of ['k1', 'k2', 'k3', 'k4', 'k5']) h.limiter.allow(key, 10);
    h.clock.advance(1_000);
    await h.flush();
    assert.equal(h.aggregator.last.buckets.length, 3);
    const firstKeys = new Set(h.aggregator.last.buckets.map((b) => b.bucket));
    for (const key of ['k1', 'k2', 'k3', 'k4', 'k5']) h.limiter.allow(key, 10);
    h.clock.advance(1_000);
    await h.flush();
    const second = usage(h.aggregator.last);
    const deferred = ['k1', 'k2', 'k3', 'k4', 'k5'].filter((k) => !firstKeys.has(k));
    assert.equal(deferred.length, 2);
    for (const key of deferred) {
      // 20 units over 2 s of pending counts, scaled to this report's 1 s window.
      assert.deepEqual(second[key], [10, 10, 0], key);
    }
    assert.equal(Object.keys(second).length, 3);
    assert.equal(h.limiter.snapshot().reporter.bucketsDeferred, 4);
  });

  it('keeps at most one report in flight; a tick that finds one sends nothing', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 800 });
    const aggregator = new FakeAggregator();
    network.listen('agg-1', aggregator.handler);
    const limiter = createGlobalLimiter({
      reporterId: 'h',
      clients: [network.connect('agg-1')],
      scheduler: clock,
      jitterRatio: 0,
      reportTimeoutMs: 5_000,
    });
    limiter.start();
    let maxInFlight = 0;
    for (let t = 0; t < 6_000; t += 50) {
      await advance(clock, 50, 50);
      const inFlight = limiter.snapshot().reporter.reportsSent - limiter.snapshot().reporter.reportsSucceeded;
      maxInFlight = Math.max(maxInFlight, inFlight);
    }
    const stats = limiter.snapshot().reporter;
    // Round trip 1.6 s at a 1 s interval: ticks at 1, 3, 5 s send; ticks at 2, 4, 6 s find one in flight.
    assert.equal(maxInFlight, 1);
    assert.equal(stats.reportsSent, 3);
    assert.equal(stats.reportsSkippedInFlight, 3);
    assert.deepEqual(
      aggregator.requests.map((r) => r.sequence),
      [1n, 2n, 3n],
    );
    await limiter.stop();
  });

  it('allow() never throws or waits when the transport is dead or misbehaves', async () => {
    const clock = new ManualClock(0);
    const throwing: ControlClient = {
      target: 'throws',
      report: () => {
        throw new Error('sync throw breaking the contract');
      },
      close: () => {},
    };
    const hanging: ControlClient = {
      target: 'hangs',
      report: () => new Promise<ReportResponse>(() => {}),
      close: () => {},
    };
    const rejecting: ControlClient = {
      target: 'rejects',
      report: () => Promise.reject(new Error('boom')),
      close: () => {},
    };
    const limiter = createGlobalLimiter({
      reporterId: 'h',
      clients: [throwing, hanging, rejecting],
      scheduler: clock,
      jitterRatio: 0,
      logger: { warn: () => {} },
    });
    const handle = limiter.bucket('k');
    limiter.start();
    for (let step = 0; step < 20; step++) {
      for (let i = 0; i < 100; i++) {
        const result = handle.allow();
        assert.equal(typeof result, 'boolean');
        assert.equal(result, true);
        assert.equal(limiter.allow('other'), true);
      }
      clock.advance(500);
      await settle();
    }
    const stats = limiter.snapshot().reporter;
    assert.ok(stats.reportsFailed >= 6, `failed ${stats.reportsFailed}`);
    assert.equal(stats.reportsSucceeded, 0);
    assert.ok(stats.failovers >= 6);
    await limiter.stop();
  });

  it('with no clients decides locally and reports nothing', async () => {
    const clock = new ManualClock(0);
    const limiter = createGlobalLimiter({ reporterId: 'h', clients: [], scheduler: clock });
    limiter.start();
    limiter.allow('k');
    await advance(clock, 3_000, 500);
    assert.equal(limiter.snapshot().reporter.reportsSent, 0);
    assert.equal(limiter.snapshot().buckets[0]!.offered, 1);
    await limiter.stop();
  });

  it('stop({ finalReport: true }) sends the last window', async () => {
    const h = harness();
    h.limiter.start();
    h.limiter.allow('k', 3);
    await drive(h.clock, h.limiter.stop({ finalReport: true }));
    assert.deepEqual(usage(h.aggregator.last), { k: [3, 3, 0] });
    h.limiter.allow('k');
    await h.limiter.flush();
    assert.equal(h.aggregator.requests.length, 1, 'nothing is sent after stop');
  });

  it('validates its options with ERR_SPILLWAY_INVALID_OPTION', () => {
    const base = { reporterId: 'h', clients: [] };
    for (const bad of [
      { reporterId: '' },
      { reporterId: 'x'.repeat(257) },
      { clients: 'agg' },
      { intervalMs: 0 },
      { jitterRatio: 1 },
      { reportTimeoutMs: -5 },
      { maxBuckets: 1.5 },
      { defaultMode: 'loud' },
      { burstGuard: { slackRatio: -1 } },
    ]) {
      assert.throws(
        () =>
          createGlobalLimiter({ ...base, ...(bad as object) } as Parameters<typeof createGlobalLimiter>[0]),
        { code: ErrorCode.InvalidOption },
        JSON.stringify(bad),
      );
    }
  });
});

describe('reporter against a broken client', () => {
  it('survives a reply that is not a ReportResponse (no unhandled rejection, the loop goes on)', async () => {
    const clock = new ManualClock(0);
    const warnings: string[] = [];
    let calls = 0;
    const broken: ControlClient = {
      target: 'broken',
      report: async () => {
        calls++;
        return undefined as unknown as ReportResponse;
      },
      close: () => {},
    };
    const limiter = createGlobalLimiter({
      reporterId: 'h',
      clients: [broken],
      scheduler: clock,
      jitterRatio: 0,
      logger: { warn: (_obj, msg) => warnings.push(msg) },
    });
    limiter.start();
    await advance(clock, 3_000, 500);
    assert.equal(calls, 3);
    assert.ok(warnings.includes('global limiter could not apply a reply'));
    assert.equal(limiter.allow('k'), true);
    await drive(clock, limiter.flush());
    await limiter.stop();
  });
});
