import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient, ReportHandler } from '../../src/transport/control-transport.js';
import type {
  GrpcControlClientOptions,
  GrpcReconnectEvent,
} from '../../src/transport/grpc-control-client.js';
import { type GrpcControlServer, startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import { CONTROL_CLIENT_VARIANTS, type ControlClientVariant } from '../helpers/control-client-variants.js';
import { type FaultProxy, startFaultProxy } from '../helpers/fault-proxy.js';
import { until } from '../helpers/until.js';

// The gRPC client replaces a connection on which reports keep running out their deadline, so that a
// healed network path is used at the next report instead of after TCP's retransmission backoff on
// the stuck connection (see createGrpcControlClient). Real server, real sockets, the fault proxy in
// between; counts (connections accepted, reports) rather than timings.

/** Deadline of reports that are to time out: short, to keep the file fast. */
const DEADLINE_MS = 150;
/**
 * Deadline of reports that are to go through, maybe on a new connection (connect, HTTP/2 settings,
 * the call): generous for a loaded machine. How promptly is counted in reports, not timed.
 */
const OK_DEADLINE_MS = 1_000;

function reportOf(reporterId = 'host-a'): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId,
    zone: 'z1',
    sequence: 1n,
    windowStartMs: 1_000n,
    windowEndMs: 2_000n,
    hostCount: 1,
    buckets: [{ bucket: 'api', offered: 100, admitted: 100, wouldDrop: 0 }],
  });
}

const echoHandler: ReportHandler = () =>
  create(ReportResponseSchema, { responderId: 'agg', epoch: 1n, reportIntervalMs: 1000, directives: [] });

/** 'ok', or the error code of the rejection. */
async function outcome(promise: Promise<ReportResponse>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (error) {
    assert.ok(error instanceof SpillwayError, `expected a SpillwayError, got ${String(error)}`);
    return error.code;
  }
}

const cleanups: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});
async function serve(handler: ReportHandler = echoHandler): Promise<GrpcControlServer> {
  const server = await startGrpcControlServer({ handler });
  cleanups.push(() => server.close());
  return server;
}
async function proxyTo(target: string): Promise<FaultProxy> {
  const proxy = await startFaultProxy(target);
  cleanups.push(() => proxy.close());
  return proxy;
}
/**
 * The reconnect events recorded so far, once there are at least `expected`, or after 2 s. On a
 * worker thread an event crosses between threads as a message of its own and can land just after
 * the report that caused it has settled: on a loaded machine the calling thread's guard (deadline
 * plus 20 ms) may settle the report first (CI, 2026-12-01). The count is then asserted exactly.
 */
async function eventCount(events: readonly GrpcReconnectEvent[], expected: number): Promise<number> {
  await until(`${expected} reconnect events`, () => events.length >= expected, 2_000).catch(() => {});
  return events.length;
}
/** A client of `variant` whose reconnect events are recorded, closed after the file. */
async function connectWith(
  variant: ControlClientVariant,
  target: string,
  options: GrpcControlClientOptions = {},
) {
  const events: GrpcReconnectEvent[] = [];
  const client: ControlClient = await variant.connect(target, {
    ...options,
    onReconnect: (event) => events.push(event),
  });
  cleanups.push(() => client.close());
  return { client, events };
}

for (const variant of CONTROL_CLIENT_VARIANTS)
  describe(`gRPC control client ${variant.name}: replacing stuck connections`, () => {
    const connect = (target: string, options?: GrpcControlClientOptions) =>
      connectWith(variant, target, options);
    it('opens a new connection after 2 reports in a row time out, not after 1; a success resets the count', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      const { client, events } = await connect(proxy.address);
      const report = (timeoutMs = DEADLINE_MS) => outcome(client.report(reportOf(), { timeoutMs }));

      assert.equal(await report(OK_DEADLINE_MS), 'ok');
      assert.equal(proxy.accepted, 1);

      proxy.setMode('blackhole');
      assert.equal(await report(), ErrorCode.StoreTimeout);
      proxy.setMode('pass'); // the held request and its reply cross now, too late for the deadline
      assert.equal(await report(OK_DEADLINE_MS), 'ok');
      proxy.setMode('blackhole');
      assert.equal(await report(), ErrorCode.StoreTimeout);
      assert.equal(events.length, 0, 'timeout, success, timeout: never 2 in a row');
      assert.equal(proxy.accepted, 1);

      assert.equal(await report(), ErrorCode.StoreTimeout);
      assert.equal(await eventCount(events, 1), 1, 'replaced after the second timeout in a row');
      assert.deepEqual(events[0], {
        target: proxy.address,
        timeouts: 2,
        wasReady: true,
        nextThreshold: 2,
        replacementsSinceSuccess: 1,
      });
      // Lazily: the new connection is opened by the next report (held by the blackhole too).
      assert.equal(await report(), ErrorCode.StoreTimeout);
      assert.equal(proxy.accepted, 2, 'the next report opened a new connection');
      assert.equal(await report(), ErrorCode.StoreTimeout);
      assert.equal(await eventCount(events, 2), 2);
      assert.equal(events[1]!.wasReady, false, 'the second connection never got the server settings');
      assert.equal(events[1]!.nextThreshold, 2, 'an unestablished connection does not raise the threshold');

      proxy.setMode('pass');
      assert.equal(await report(OK_DEADLINE_MS), 'ok', 'the report after the heal goes through');
      assert.equal(proxy.accepted, 3);
      assert.equal(events.length, 2);
    });

    it('after a partition heals, reports get through within 2 reports although the old connection stays stuck', async () => {
      // client -> front (pass) -> back -> server. The partition blackholes `back`, holding every
      // connection through it, as TCP holds a connection whose segments are lost. At the heal, `front`
      // sends new connections straight to the server while those through `back` stay stuck: the old
      // connection waiting for TCP's next retransmission, which may be seconds away.
      const server = await serve();
      const stuckAfterHeal = async (options: GrpcControlClientOptions, reportsAfterHeal: number) => {
        const back = await proxyTo(server.address);
        const front = await proxyTo(back.address);
        const { client, events } = await connect(front.address, options);
        const report = (timeoutMs: number) => outcome(client.report(reportOf(), { timeoutMs }));
        assert.equal(await report(OK_DEADLINE_MS), 'ok');
        back.setMode('blackhole');
        for (let i = 0; i < 5; i++) assert.equal(await report(DEADLINE_MS), ErrorCode.StoreTimeout);
        // 5 timeouts: 2 replacements, none when replacing is off (no event to wait for).
        const replacedInPartition =
          options.reconnectAfterTimeouts === 0 ? events.length : await eventCount(events, 2);
        front.setTarget(server.address);
        const results: string[] = [];
        for (let i = 0; i < reportsAfterHeal; i++) results.push(await report(OK_DEADLINE_MS));
        return { results, replacedInPartition, events, accepted: front.accepted };
      };

      const fixed = await stuckAfterHeal({}, 3);
      // 5 timeouts in the partition: replaced after the 2nd and the 4th; the 5th opened a connection
      // (stuck behind `back`), so the first report after the heal may time out on it.
      assert.equal(fixed.replacedInPartition, 2);
      assert.ok(
        fixed.results.slice(0, 2).includes('ok'),
        `one of the first 2 reports after the heal goes through: ${fixed.results.join(', ')}`,
      );
      assert.equal(fixed.results.at(-1), 'ok', 'and the ones after it');

      // The model is right: without replacing, the stuck connection is used until keepalive.
      const unfixed = await stuckAfterHeal({ reconnectAfterTimeouts: 0 }, 2);
      assert.deepEqual(unfixed.results, Array(2).fill(ErrorCode.StoreTimeout));
      assert.equal(unfixed.events.length, 0);
      assert.equal(unfixed.accepted, 1);
    });

    it('lets a call in flight on the replaced connection finish instead of cutting it short', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      const { client, events } = await connect(proxy.address);
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      proxy.setMode('blackhole');
      // Replace once, so the current connection is one still being set up (its calls wait in
      // grpc-js's queue: closing its client would fail them at once with UNAVAILABLE).
      for (let i = 0; i < 2; i++) await client.report(reportOf(), { timeoutMs: DEADLINE_MS }).catch(() => {});
      assert.equal(await eventCount(events, 1), 1);
      const long = outcome(client.report(reportOf('long'), { timeoutMs: 10_000 }));
      for (let i = 0; i < 2; i++) {
        assert.equal(
          await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
          ErrorCode.StoreTimeout,
        );
      }
      assert.equal(await eventCount(events, 2), 2, 'replaced while the long call is in flight');
      // The replaced client stays open for its call; the new one must not share its connection
      // (grpc-js's global subchannel pool would hand it over: the client uses a pool of its own).
      assert.equal(proxy.accepted, 2);
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
        ErrorCode.StoreTimeout,
      );
      assert.equal(proxy.accepted, 3, 'the next report opened a connection of its own');
      proxy.setMode('pass');
      assert.equal(await long, 'ok', 'the call on the replaced connection completed');
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
    });

    it('backs off against a parent that is up but slower than the deadline: no reconnect storm', async () => {
      let slow = true;
      const server = await serve(async (request, context) => {
        if (slow) await new Promise((resolve) => setTimeout(resolve, 400));
        return echoHandler(request, context);
      });
      const proxy = await proxyTo(server.address);
      const { client, events } = await connect(proxy.address);
      // Thresholds 2, 2, 4, 8: connections replaced after 2, 4, 8 and 16 timeouts.
      for (let i = 0; i < 16; i++) {
        assert.equal(
          await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
          ErrorCode.StoreTimeout,
        );
      }
      await eventCount(events, 4);
      assert.deepEqual(
        events.map((e) => [e.timeouts, e.wasReady, e.nextThreshold]),
        [
          [2, true, 2],
          [2, true, 4],
          [4, true, 8],
          [8, true, 16],
        ],
      );
      assert.equal(proxy.accepted, 4, 'one connection per 2, 2, 4, 8 timeouts (the 5th not opened yet)');
      slow = false;
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      slow = true;
      for (let i = 0; i < 2; i++) await client.report(reportOf(), { timeoutMs: DEADLINE_MS }).catch(() => {});
      assert.equal(await eventCount(events, 5), 5, 'a success returns the threshold to 2');
      assert.equal(events[4]!.nextThreshold, 2);
    });

    it('settles reports when onReconnect throws, and never replaces with reconnectAfterTimeouts 0', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      let calls = 0;
      const client = await variant.connect(proxy.address, {
        onReconnect: () => {
          calls++;
          throw new Error('observer broke');
        },
      });
      cleanups.push(() => client.close());
      const never = await connect(proxy.address, { reconnectAfterTimeouts: 0 });
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      assert.equal(await outcome(never.client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      proxy.setMode('blackhole');
      for (let i = 0; i < 3; i++) {
        assert.equal(
          await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
          ErrorCode.StoreTimeout,
        );
        assert.equal(
          await outcome(never.client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
          ErrorCode.StoreTimeout,
        );
      }
      assert.equal(calls, 1);
      assert.equal(never.events.length, 0);
      assert.equal(proxy.accepted, 3, 'one connection each, and the replacement of the first client');
      proxy.setMode('pass');
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      assert.equal(await outcome(never.client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
    });

    it('refuses a reconnectAfterTimeouts that is not a non-negative integer', () => {
      for (const value of [-1, 1.5, Number.NaN]) {
        assert.throws(
          () => variant.create('127.0.0.1:1', { reconnectAfterTimeouts: value }),
          (error: unknown) => error instanceof SpillwayError && error.code === ErrorCode.InvalidOption,
        );
      }
    });
  });

for (const variant of CONTROL_CLIENT_VARIANTS)
  describe(`gRPC control client ${variant.name}: whenConnected`, () => {
    const connect = (target: string, options?: GrpcControlClientOptions) =>
      connectWith(variant, target, options);
    /** Short reconnect backoff so the file stays fast; the CLI caps it at one interval. */
    const fastBackoff = {
      channelOptions: {
        'grpc.initial_reconnect_backoff_ms': 100,
        'grpc.min_reconnect_backoff_ms': 100,
        'grpc.max_reconnect_backoff_ms': 200,
      },
    };
    const waitUntil = async (what: string, check: () => boolean, timeoutMs = 5_000) => {
      const startedMs = performance.now();
      while (!check()) {
        if (performance.now() - startedMs > timeoutMs) assert.fail(`${what} within ${timeoutMs} ms`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };

    it('tells once when the connection is established again after a failed report, without another report', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      proxy.setMode('reset'); // the parent is down: every connection is reset
      const { client } = await connect(proxy.address, fastBackoff);
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })),
        ErrorCode.StoreUnavailable,
      );
      let fired = 0;
      let cancelledFired = 0;
      client.whenConnected!(() => fired++);
      client.whenConnected!(() => cancelledFired++).cancel();
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.equal(fired, 0, 'still down: reconnect attempts are reset');
      const acceptedWhileDown = proxy.accepted;
      assert.ok(
        acceptedWhileDown >= 2,
        `the channel kept trying on its own: ${acceptedWhileDown} connections`,
      );

      proxy.setMode('pass'); // the parent is back
      await waitUntil('whenConnected to fire', () => fired === 1);
      assert.equal(cancelledFired, 0, 'a cancelled watch never fires');
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal(fired, 1, 'once');
    });

    it('does not fire for the connection already established, only for the next one', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      const { client } = await connect(proxy.address, fastBackoff);
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      let fired = 0;
      client.whenConnected!(() => fired++);
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.equal(fired, 0, 'established before the call: not told');
      proxy.setMode('reset'); // the connection drops (the channel goes idle: nothing reconnects yet)
      await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS }));
      // The next report finds the parent down; from then on the channel retries on its own.
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })),
        ErrorCode.StoreUnavailable,
      );
      assert.equal(fired, 0);
      proxy.setMode('pass');
      await waitUntil('whenConnected to fire', () => fired === 1);
    });

    it('follows a stuck connection to its replacement, and fires when that one is established', async () => {
      const server = await serve();
      const proxy = await proxyTo(server.address);
      const { client, events } = await connect(proxy.address, fastBackoff);
      assert.equal(await outcome(client.report(reportOf(), { timeoutMs: OK_DEADLINE_MS })), 'ok');
      let fired = 0;
      client.whenConnected!(() => fired++);
      proxy.setMode('blackhole'); // packets vanish: the connection stays READY, reports time out
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
        ErrorCode.StoreTimeout,
      );
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
        ErrorCode.StoreTimeout,
      );
      assert.equal(await eventCount(events, 1), 1, 'replaced');
      // The replacement connects at the next report; the partition holds its handshake.
      assert.equal(
        await outcome(client.report(reportOf(), { timeoutMs: DEADLINE_MS })),
        ErrorCode.StoreTimeout,
      );
      assert.equal(fired, 0);
      proxy.setMode('pass');
      await waitUntil('whenConnected to fire', () => fired === 1);
    });
  });
