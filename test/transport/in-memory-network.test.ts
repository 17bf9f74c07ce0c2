import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../../src/core/errors.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
  Tier,
} from '../../src/gen/spillway/v1/control_pb.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { drive, settle } from '../global/fixtures.js';
import { rejection } from '../helpers/rejection.js';

function request(reporterId = 'host-1'): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId,
    tier: Tier.HOST,
    sequence: 1n,
    buckets: [{ bucket: 'payments:charge', offered: 10, admitted: 7, wouldDrop: 0 }],
    hostCount: 1,
  });
}

function reply(responderId = 'agg-1'): ReportResponse {
  return create(ReportResponseSchema, { responderId, epoch: 7n, reportIntervalMs: 1000 });
}

/** Record when `promise` settles in virtual time, and how. */
function track<T>(clock: ManualClock, promise: Promise<T>) {
  const state: { atMs?: number; value?: T; error?: unknown } = {};
  promise.then(
    (value) => {
      state.atMs = clock.nowMs();
      state.value = value;
    },
    (error: unknown) => {
      state.atMs = clock.nowMs();
      state.error = error;
    },
  );
  return state;
}

async function stepTo(clock: ManualClock, startMs: number, untilMs: number): Promise<void> {
  while (clock.nowMs() - startMs < untilMs) {
    clock.advance(1);
    await settle();
  }
}

describe('InMemoryNetwork', () => {
  it('delivers the request and the reply after the one-way delay each, in virtual time', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 10 });
    const seen: { atMs: number; peer: string; request: ReportRequest }[] = [];
    network.listen('agg-1', (req, context) => {
      seen.push({ atMs: clock.nowMs(), peer: context.peer, request: req });
      return reply();
    });
    const client = network.connect('agg-1', { from: 'host-1' });
    const sent = request();
    const result = track(clock, client.report(sent, { timeoutMs: 500 }));
    // Mutating after send must not reach the receiver: messages cross as bytes.
    sent.buckets[0]!.offered = 999;
    await stepTo(clock, 0, 19);
    assert.equal(result.atMs, undefined, 'no reply before two one-way delays');
    assert.equal(seen.length, 1);
    assert.equal(seen[0]!.atMs, 10);
    assert.equal(seen[0]!.peer, 'host-1');
    assert.equal(seen[0]!.request.buckets[0]!.offered, 10);
    await stepTo(clock, 0, 20);
    assert.equal(result.atMs, 20);
    assert.equal(result.value?.responderId, 'agg-1');
    assert.equal(result.value?.epoch, 7n);
    assert.equal(clock.pendingTimers, 0, 'the timeout timer is cancelled once answered');
  });

  it('answers with delay 0 inside a single advance, and never inline', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock });
    let handled = 0;
    network.listen('agg-1', () => {
      handled++;
      return reply();
    });
    const result = track(clock, network.connect('agg-1').report(request(), { timeoutMs: 100 }));
    assert.equal(handled, 0, 'delivery goes through the scheduler');
    clock.advance(0);
    await settle();
    assert.equal(handled, 1);
    assert.equal(result.value?.responderId, 'agg-1');
  });

  it('adds jitter in [delay, delay + jitter) per leg', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({
      scheduler: clock,
      delayMs: 5,
      jitterMs: 10,
      random: seededRandom(3),
    });
    const arrivals: number[] = [];
    network.listen('agg-1', () => {
      arrivals.push(clock.nowMs());
      return reply();
    });
    const client = network.connect('agg-1');
    const results = [];
    for (let i = 0; i < 50; i++) {
      const startMs = clock.nowMs();
      const result = await drive(
        clock,
        client.report(request(), { timeoutMs: 100 }).then(() => clock.nowMs() - startMs),
      );
      results.push(result);
      assert.ok(arrivals.at(-1)! - startMs >= 5 && arrivals.at(-1)! - startMs < 16);
    }
    assert.ok(Math.min(...results) >= 10 && Math.max(...results) <= 31);
    assert.ok(new Set(results).size > 5, 'round trips vary');
  });

  it('rejects a lost message with ERR_SPILLWAY_STORE_UNAVAILABLE, at the configured rate', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, lossRate: 1, delayMs: 3 });
    let handled = 0;
    network.listen('agg-1', () => {
      handled++;
      return reply();
    });
    const client = network.connect('agg-1');
    const lost = track(clock, client.report(request(), { timeoutMs: 100 }));
    await stepTo(clock, 0, 3);
    assert.ok(isSpillwayError(lost.error, ErrorCode.StoreUnavailable), String(lost.error));
    assert.equal(lost.atMs, 3, 'noticed one trip later');
    assert.equal(handled, 0);

    network.setLink({ lossRate: 0.3, delayMs: 0 });
    const seeded = new InMemoryNetwork({ scheduler: clock, lossRate: 0.3, random: seededRandom(11) });
    seeded.listen('agg-1', () => reply());
    const seededClient = seeded.connect('agg-1');
    let failed = 0;
    const n = 1000;
    for (let i = 0; i < n; i++) {
      const outcome = track(clock, seededClient.report(request(), { timeoutMs: 100 }));
      clock.advance(0);
      await settle();
      if (outcome.error) failed++;
    }
    // Two legs each lost with 0.3: 1 - 0.7^2 = 0.51 of round trips fail.
    assert.ok(Math.abs(failed / n - 0.51) < 0.06, `failure fraction ${failed / n}`);
  });

  it('partitions an address in both directions until healed', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 1 });
    let handled = 0;
    network.listen('agg-1', () => {
      handled++;
      return reply();
    });
    const client = network.connect('agg-1', { from: 'host-1' });

    network.partition('agg-1', true);
    await assert.rejects(drive(clock, client.report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreUnavailable,
    });
    network.partition('agg-1', false);
    network.partition('host-1', true);
    await assert.rejects(drive(clock, client.report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreUnavailable,
    });
    assert.equal(handled, 0);
    network.partition('host-1', false);
    const ok = await drive(clock, client.report(request(), { timeoutMs: 100 }));
    assert.equal(ok.responderId, 'agg-1');
    assert.equal(handled, 1);
  });

  it('whenConnected: once, a trip after a server listens or a partition heals; never after cancel or close', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 3 });
    const client = network.connect('ctl', { from: 'agg-1' });
    const fired: number[] = [];
    client.whenConnected!(() => fired.push(clock.nowMs()));
    const cancelled = client.whenConnected!(() => fired.push(-1));
    cancelled.cancel();
    await stepTo(clock, 0, 10);
    assert.equal(fired.length, 0, 'nothing listens: no connection');

    const server = network.listen('ctl', () => reply());
    assert.equal(fired.length, 0, 'never synchronously');
    await stepTo(clock, 0, 20);
    assert.deepEqual(fired, [13], 'one trip (3 ms) after the server listened, once');

    // A link that is up does not count as established again, until a partition of either end heals.
    client.whenConnected!(() => fired.push(clock.nowMs()));
    network.partition('ctl', false);
    await stepTo(clock, 0, 30);
    assert.equal(fired.length, 1, 'healing what was not partitioned changes nothing');
    network.partition('agg-1', true);
    network.partition('agg-1', false);
    await stepTo(clock, 0, 40);
    assert.deepEqual(fired, [13, 33]);

    // Closed clients and servers that close and come back.
    await server.close();
    const other = network.connect('ctl', { from: 'agg-2' });
    client.whenConnected!(() => fired.push(-2));
    other.whenConnected!(() => fired.push(clock.nowMs()));
    client.close();
    network.listen('ctl', () => reply());
    await stepTo(clock, 0, 50);
    assert.deepEqual(fired, [13, 33, 43]);
  });

  it('loses the reply when the partition starts while the handler runs', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 1 });
    let handled = 0;
    network.listen('agg-1', () => {
      handled++;
      network.partition('agg-1', true);
      return reply();
    });
    await assert.rejects(drive(clock, network.connect('agg-1').report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreUnavailable,
    });
    assert.equal(handled, 1, 'the receiver did the work; only the answer was lost');
  });

  it('times out at timeoutMs when the handler never answers', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 1 });
    network.listen('agg-1', () => new Promise<ReportResponse>(() => {}));
    const result = track(clock, network.connect('agg-1').report(request(), { timeoutMs: 250 }));
    await stepTo(clock, 0, 249);
    assert.equal(result.atMs, undefined);
    await stepTo(clock, 0, 250);
    assert.ok(isSpillwayError(result.error, ErrorCode.StoreTimeout), String(result.error));
    assert.equal(result.atMs, 250);
  });

  it('times out when the delay alone exceeds the timeout', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 80 });
    network.listen('agg-1', () => reply());
    await assert.rejects(drive(clock, network.connect('agg-1').report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreTimeout,
    });
  });

  it('rejects unknown addresses, closed servers and closed clients as unavailable', async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock });
    await assert.rejects(drive(clock, network.connect('nowhere').report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreUnavailable,
    });
    const server = network.listen('agg-1', () => reply());
    assert.equal(server.address, 'agg-1');
    assert.throws(() => network.listen('agg-1', () => reply()), { code: ErrorCode.InvalidOption });
    await server.close();
    await assert.rejects(drive(clock, network.connect('agg-1').report(request(), { timeoutMs: 100 })), {
      code: ErrorCode.StoreUnavailable,
    });
    network.listen('agg-1', () => reply());
    const client = network.connect('agg-1');
    client.close();
    await assert.rejects(client.report(request(), { timeoutMs: 100 }), { code: ErrorCode.StoreUnavailable });
  });

  it("delivers a handler's SpillwayError as a refusal naming its code, as gRPC does; other throws as unavailable", async () => {
    const clock = new ManualClock(0);
    const network = new InMemoryNetwork({ scheduler: clock });
    network.listen('strict', () => {
      throw new SpillwayError(ErrorCode.InvalidReport, 'too many buckets');
    });
    network.listen('async-strict', async () => {
      throw new SpillwayError(ErrorCode.InvalidReport, 'bad token');
    });
    network.listen('broken', () => {
      throw new TypeError('bug');
    });
    for (const target of ['strict', 'async-strict']) {
      const error = await rejection(
        drive(clock, network.connect(target).report(request(), { timeoutMs: 100 })),
      );
      assert.equal(error.code, ErrorCode.StoreUnavailable, target);
      assert.equal(error.details?.refused, true, target);
      assert.equal(error.details?.remoteCode, ErrorCode.InvalidReport, target);
    }
    const broken = await rejection(
      drive(clock, network.connect('broken').report(request(), { timeoutMs: 100 })),
    );
    assert.equal(broken.code, ErrorCode.StoreUnavailable);
    assert.equal(broken.details?.refused, undefined, 'a fault, not a refusal');
  });

  it('rejects, never throws, on a bad timeout; validates link options', async () => {
    const network = new InMemoryNetwork({ scheduler: new ManualClock(0) });
    network.listen('agg-1', () => reply());
    // As over gRPC, where a deadline of now has passed before the call starts.
    await assert.rejects(network.connect('agg-1').report(request(), { timeoutMs: 0 }), {
      code: ErrorCode.StoreTimeout,
    });
    assert.throws(() => network.setLink({ lossRate: 1.5 }), { code: ErrorCode.InvalidOption });
    assert.throws(() => new InMemoryNetwork({ delayMs: -1 }), { code: ErrorCode.InvalidOption });
  });
});
