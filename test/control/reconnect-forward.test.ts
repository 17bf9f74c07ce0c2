import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { createAggregator } from '../../src/control/aggregator.js';
import { ManualClock } from '../../src/core/clock.js';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import {
  DirectiveSchema,
  Mode,
  type ReportRequest,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { advance, call, hostReport } from './report-fixtures.js';

const START_MS = 1_700_000_000_000;
const INTERVAL_MS = 1000;

/**
 * A parent whose connection the test takes down and brings back, with a `whenConnected` the test
 * fires (as the gRPC client does when its channel becomes READY again).
 */
function parent(target: string, { up = true, directives = true } = {}) {
  const state = {
    up,
    /** Answer with a directive for every reported bucket. */
    directives,
    received: [] as ReportRequest[],
    watchers: [] as { listener: () => void; cancelled: boolean }[],
  };
  const client: ControlClient = {
    target,
    report(request) {
      state.received.push(request);
      if (!state.up) return Promise.reject(new SpillwayError(ErrorCode.StoreUnavailable, `${target} down`));
      return Promise.resolve(
        create(ReportResponseSchema, {
          directives: state.directives
            ? request.buckets.map((b) =>
                create(DirectiveSchema, {
                  bucket: b.bucket,
                  dropRatio: 0.5,
                  mode: Mode.ENFORCE,
                  limitRps: 100,
                  epoch: 2n,
                  version: BigInt(state.received.length),
                  ttlMs: 4 * INTERVAL_MS,
                }),
              )
            : [],
          epoch: 2n,
          responderId: target,
        }),
      );
    },
    whenConnected(listener) {
      const watcher = { listener, cancelled: false };
      state.watchers.push(watcher);
      return {
        cancel() {
          watcher.cancelled = true;
        },
      };
    },
    close() {},
  };
  /** The connection is established again: every waiting listener is told (once). */
  const connect = () => {
    state.up = true;
    for (const w of state.watchers.splice(0)) if (!w.cancelled) w.listener();
  };
  return { client, state, connect };
}

function aggregatorWith(parents: ReturnType<typeof parent>[]) {
  const clock = new ManualClock(START_MS);
  const aggregator = createAggregator({
    id: 'agg',
    zone: 'z1',
    parents: parents.map((p) => p.client),
    intervalMs: INTERVAL_MS,
    jitterRatio: 0,
    scheduler: clock,
  });
  let sequence = 0;
  const hostReports = () =>
    call(
      aggregator.handleReport,
      hostReport({
        id: 'h1',
        sequence: ++sequence,
        endMs: clock.nowMs(),
        buckets: [{ bucket: 'pay', offered: 50 }],
      }),
    );
  return { clock, aggregator, hostReports };
}

describe('aggregator: forwards at once when its parent comes back', () => {
  it('forwards as soon as a failed parent reconnects, and the interval restarts from that forward', async () => {
    const controller = parent('ctl', { up: false });
    const { clock, aggregator, hostReports } = aggregatorWith([controller]);
    hostReports();
    aggregator.start();
    await advance(clock, 3 * INTERVAL_MS);
    assert.equal(controller.state.received.length, 3, 'one failed forward per interval');
    assert.equal(controller.state.watchers.length, 1, 'one watch, however many forwards failed');

    await advance(clock, 300);
    hostReports();
    controller.connect();
    await advance(clock, 10);
    assert.equal(controller.state.received.length, 4, 'a forward when the connection came back');
    assert.equal(aggregator.snapshot().counters.reconnectForwards, 1);
    assert.equal(hostReports().directives[0]?.dropRatio, 0.5, 'hosts get the directive at once');
    // The next forward is an interval after the reconnect forward, not at the old timer's 4000 ms.
    await advance(clock, INTERVAL_MS - 20);
    assert.equal(controller.state.received.length, 4);
    await advance(clock, 20);
    assert.equal(controller.state.received.length, 5);
    await aggregator.stop();
  });

  it('no extra forward while another parent answers, nor after stop()', async () => {
    const primary = parent('ctl-1', { up: false });
    const backup = parent('ctl-2');
    const { clock, aggregator, hostReports } = aggregatorWith([primary, backup]);
    hostReports();
    aggregator.start();
    await advance(clock, INTERVAL_MS);
    assert.equal(backup.state.received.length, 1, 'failed over to the backup');
    primary.connect();
    await advance(clock, 10);
    assert.equal(aggregator.snapshot().counters.reconnectForwards, 0);
    assert.equal(primary.state.received.length + backup.state.received.length, 2);

    primary.state.up = false;
    backup.state.up = false;
    await advance(clock, INTERVAL_MS);
    await aggregator.stop();
    primary.connect();
    await advance(clock, 10);
    assert.equal(aggregator.snapshot().counters.reconnectForwards, 0, 'stopped: the watch was cancelled');
  });
});

describe('aggregator: a cold aggregator forwards at the first host report', () => {
  it('forwards once when a host reports and no directive is fresh, so the next host report finds one', async () => {
    const controller = parent('ctl', { directives: false });
    const { clock, aggregator, hostReports } = aggregatorWith([controller]);
    aggregator.start();
    await advance(clock, 200);
    assert.equal(hostReports().directives.length, 0, 'nothing cached yet');
    await advance(clock, 10);
    assert.equal(controller.state.received.length, 1, 'forwarded without waiting for the interval');
    assert.equal(aggregator.snapshot().counters.coldForwards, 1);
    // The parent had nothing: no more cold forwards until a directive has arrived.
    hostReports();
    await advance(clock, 10);
    assert.equal(controller.state.received.length, 1);

    controller.state.directives = true;
    await advance(clock, INTERVAL_MS);
    assert.equal(controller.state.received.length, 2, 'the timer forward');
    assert.equal(hostReports().directives.length, 1);
    // Warm: host reports cause no forwards.
    hostReports();
    await advance(clock, 10);
    assert.equal(controller.state.received.length, 2);
    assert.equal(aggregator.snapshot().counters.coldForwards, 1);
    await aggregator.stop();
  });

  it('not while its parent is down (the reconnect watch covers that)', async () => {
    const controller = parent('ctl', { up: false });
    const { clock, aggregator, hostReports } = aggregatorWith([controller]);
    aggregator.start();
    await advance(clock, INTERVAL_MS);
    assert.equal(controller.state.received.length, 1);
    hostReports();
    await advance(clock, 10);
    assert.equal(controller.state.received.length, 1);
    assert.equal(aggregator.snapshot().counters.coldForwards, 0);
    await aggregator.stop();
  });
});
