import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import { type ReportRequest, ReportResponseSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { advance } from './fixtures.js';

const INTERVAL_MS = 1000;

/** An aggregator the test takes down and brings back, firing `whenConnected` as gRPC does. */
function parent(target: string, up: boolean) {
  const state = { up, received: [] as ReportRequest[], watchers: [] as (() => void)[] };
  const client: ControlClient = {
    target,
    report(request) {
      state.received.push(request);
      if (!state.up) return Promise.reject(new SpillwayError(ErrorCode.StoreUnavailable, `${target} down`));
      return Promise.resolve(create(ReportResponseSchema, { responderId: target, epoch: 1n }));
    },
    whenConnected(listener) {
      let cancelled = false;
      state.watchers.push(() => {
        if (!cancelled) listener();
      });
      return {
        cancel() {
          cancelled = true;
        },
      };
    },
    close() {},
  };
  const connect = () => {
    state.up = true;
    for (const fire of state.watchers.splice(0)) fire();
  };
  return { client, state, connect };
}

function hostWith(clients: ControlClient[]) {
  const clock = new ManualClock(1_000_000);
  const limiter = createGlobalLimiter({
    reporterId: 'host-1',
    zone: 'z1',
    clients,
    intervalMs: INTERVAL_MS,
    jitterRatio: 0,
    scheduler: clock,
    random: seededRandom(1),
  });
  limiter.bucket('pay').allow();
  return { clock, limiter };
}

describe('reporter: reports at once when its aggregator comes back', () => {
  it('sends the next report as soon as a failed client reconnects; the interval restarts from it', async () => {
    const aggregator = parent('agg-1', false);
    const { clock, limiter } = hostWith([aggregator.client]);
    limiter.start();
    await advance(clock, 3 * INTERVAL_MS, 10);
    assert.equal(aggregator.state.received.length, 3, 'one failed report per interval');
    assert.equal(aggregator.state.watchers.length, 1, 'one watch, however many reports failed');

    await advance(clock, 400, 10);
    aggregator.connect();
    await advance(clock, 10, 10);
    assert.equal(aggregator.state.received.length, 4, 'a report when the connection came back');
    const stats = limiter.snapshot().reporter;
    assert.equal(stats.reportsOnReconnect, 1);
    assert.equal(stats.consecutiveFailures, 0);
    // It covers the counts of the failed reports (their window starts at the last acknowledged one).
    const report = aggregator.state.received[3]!;
    assert.equal(Number(report.windowEndMs - report.windowStartMs), 3400);
    await advance(clock, INTERVAL_MS - 20, 10);
    assert.equal(aggregator.state.received.length, 4, 'no timer report right behind it');
    await advance(clock, 20, 10);
    assert.equal(aggregator.state.received.length, 5);
    await limiter.stop();
  });

  it('moves to the client that came back; nothing extra when reports already succeed or after stop()', async () => {
    const first = parent('agg-1', false);
    const second = parent('agg-2', false);
    const { clock, limiter } = hostWith([first.client, second.client]);
    limiter.start();
    await advance(clock, 2 * INTERVAL_MS, 10);
    assert.equal(first.state.received.length + second.state.received.length, 2);
    first.connect();
    await advance(clock, 10, 10);
    assert.equal(first.state.received.length, 2, 'the report went to the client that came back');
    assert.equal(limiter.snapshot().reporter.clientIndex, 0);

    second.connect(); // reports already succeed: no extra report
    await advance(clock, 10, 10);
    assert.equal(limiter.snapshot().reporter.reportsOnReconnect, 1);

    first.state.up = false;
    await advance(clock, INTERVAL_MS, 10);
    await limiter.stop();
    first.connect();
    await advance(clock, 10, 10);
    assert.equal(limiter.snapshot().reporter.reportsOnReconnect, 1, 'stopped: the watch was cancelled');
  });
});
