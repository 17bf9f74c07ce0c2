import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { type ReportRequest, ReportResponseSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createGlobalLimiter, type GlobalLimiter } from '../../src/global/global-limiter.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { type GrpcControlServer, startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import { type FaultProxy, startFaultProxy } from '../helpers/fault-proxy.js';
import { waitFor } from '../integration/spillway-process.js';

// "Nothing acknowledged is lost": a host's counts stay pending until a reply acknowledges the report
// that carried them. Through resets, partitions and a restarted parent (outages shorter than the
// carry-over bound, 5 intervals), the offered units in acknowledged reports add up to exactly the
// calls the host made. (A report whose reply was lost is resent inside the next one, so the parent
// may count some units twice: at-least-once, never lost.)

const INTERVAL_MS = 100;

describe('acknowledged counts through faults', { timeout: 60_000 }, () => {
  let server: GrpcControlServer;
  let proxy: FaultProxy;
  let grpc: ControlClient;
  let limiter: GlobalLimiter;
  let acknowledged = 0;
  let receivedByParent = 0;

  const startParent = () =>
    startGrpcControlServer({
      port: 0,
      handler: (request: ReportRequest) => {
        for (const usage of request.buckets) receivedByParent += usage.offered;
        return create(ReportResponseSchema, { reportIntervalMs: INTERVAL_MS, responderId: 'parent' });
      },
    });

  before(async () => {
    server = await startParent();
    proxy = await startFaultProxy(server.address);
    grpc = createGrpcControlClient(proxy.address);
    const counting: ControlClient = {
      target: grpc.target,
      async report(request, options) {
        const response = await grpc.report(request, options);
        for (const usage of request.buckets) acknowledged += usage.offered;
        return response;
      },
      close: () => grpc.close(),
    };
    limiter = createGlobalLimiter({
      reporterId: 'h1',
      clients: [counting],
      intervalMs: INTERVAL_MS,
      // Faults here last at most 300 ms; keep every count however long reconnecting takes.
      carryOverMaxMs: 60_000,
    });
    limiter.start();
  });

  after(async () => {
    await limiter.stop();
    grpc.close();
    await proxy.close();
    await server.close();
  });

  it('every call is in an acknowledged report once the faults end', async (t) => {
    const handle = limiter.bucket('pay');
    let calls = 0;
    const load = setInterval(() => {
      for (let i = 0; i < 50; i++) {
        handle.allow();
        calls++;
      }
    }, 5);
    const phase = async (mode: 'pass' | 'blackhole' | 'drop' | 'reset', ms: number) => {
      proxy.setMode(mode);
      await new Promise((resolve) => setTimeout(resolve, ms));
    };
    try {
      await phase('pass', 500);
      await phase('reset', 300);
      await phase('pass', 500);
      await phase('blackhole', 300);
      await phase('pass', 500);
      // The parent restarts on a new port behind the same proxy.
      await server.close();
      await new Promise((resolve) => setTimeout(resolve, 200));
      server = await startParent();
      proxy.setTarget(server.address);
      await phase('pass', 500);
    } finally {
      clearInterval(load);
    }
    await waitFor('the last counts acknowledged', async () => {
      await limiter.flush();
      return Math.abs(acknowledged - calls) < 1e-6 ? true : undefined;
    });
    const reporter = limiter.snapshot().reporter;
    t.diagnostic(
      `${calls} calls; acknowledged ${acknowledged}; received by the parent ${receivedByParent}; reports failed ${reporter.reportsFailed} of ${reporter.reportsSent}`,
    );
    assert.equal(
      limiter.snapshot().buckets.find((b) => b.key === 'pay')!.offered,
      calls,
      'the host counted every call',
    );
    assert.ok(reporter.reportsFailed > 0, 'the faults were real');
    assert.ok(receivedByParent >= acknowledged - 1e-6, 'the parent saw at least what was acknowledged');
  });
});
