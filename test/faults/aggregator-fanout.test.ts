import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { createAggregator } from '../../src/control/aggregator.js';
import { ManualClock } from '../../src/core/clock.js';
import { SpillwayError } from '../../src/core/errors.js';
import {
  DirectiveSchema,
  Mode,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { call, hostReport } from '../control/report-fixtures.js';

/** A controller replica stand-in: answers with a fixed (epoch, ratio) and a rising version, or fails. */
function replica(target: string, epoch: bigint, dropRatio: number) {
  const received: ReportRequest[] = [];
  let version = 0n;
  let down = false;
  const client: ControlClient = {
    target,
    async report(request): Promise<ReportResponse> {
      if (down) throw new SpillwayError('ERR_SPILLWAY_STORE_UNAVAILABLE', `${target} is down`);
      received.push(request);
      version++;
      return create(ReportResponseSchema, {
        directives: [
          create(DirectiveSchema, {
            bucket: 'pay',
            dropRatio,
            mode: Mode.ENFORCE,
            limitRps: 100,
            epoch,
            version,
            ttlMs: 2000,
          }),
        ],
        reportIntervalMs: 500,
        epoch,
        responderId: target,
      });
    },
    close() {},
  };
  return {
    client,
    received,
    kill() {
      down = true;
    },
  };
}

describe('aggregator parent fan-out (controller replicas)', () => {
  it('reports to every parent; the newest epoch leads; the other takes over at the TTL', async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const older = replica('c-old', 10n, 0.2);
    const newer = replica('c-new', 20n, 0.25);
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [older.client, newer.client],
      parentMode: 'fanout',
      scheduler: clock,
      intervalMs: 500,
    });
    const hostRatio = (sequence: number) =>
      call(
        aggregator.handleReport,
        hostReport({ id: 'h1', sequence, endMs: clock.nowMs(), buckets: [{ bucket: 'pay', offered: 50 }] }),
      ).directives[0];

    hostRatio(1);
    await aggregator.flush();
    assert.equal(older.received.length, 1, 'the first parent got the report');
    assert.equal(newer.received.length, 1, 'and so did the second');
    assert.equal(hostRatio(2)?.epoch, 20n, 'the newest epoch wins');

    newer.kill();
    let sequence = 3;
    let takeoverMs: number | undefined;
    const killedAtMs = clock.nowMs();
    for (let step = 0; step < 20; step++) {
      clock.advance(250);
      await aggregator.flush();
      const directive = hostRatio(sequence++);
      assert.ok(directive, 'hosts are never left without a directive');
      if (directive.epoch === 10n) {
        takeoverMs = clock.nowMs() - killedAtMs;
        break;
      }
    }
    assert.ok(takeoverMs !== undefined && takeoverMs <= 2000 + 250, `took over after ${takeoverMs} ms`);
    assert.equal(
      aggregator.snapshot().counters.forwardFailures,
      0,
      'a fan-out with one live parent succeeds',
    );
    assert.ok(aggregator.snapshot().counters.parentFailures > 0);
  });

  it('a forward fails only when every parent failed', async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const a = replica('a', 1n, 0);
    const b = replica('b', 2n, 0);
    a.kill();
    b.kill();
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [a.client, b.client],
      parentMode: 'fanout',
      scheduler: clock,
    });
    await aggregator.flush();
    assert.equal(aggregator.snapshot().counters.forwardFailures, 1);
    assert.equal(aggregator.snapshot().counters.parentFailures, 2);
  });

  it('refuses an unknown parent mode', () => {
    assert.throws(
      () =>
        createAggregator({
          id: 'agg',
          zone: 'z1',
          parents: [replica('a', 1n, 0).client],
          parentMode: 'both' as 'fanout',
        }),
      /parentMode/,
    );
  });
});
