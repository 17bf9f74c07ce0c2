import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ReportHandler } from '../../src/transport/control-transport.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { type GrpcControlServer, startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import {
  createWorkerControlClient,
  type WorkerControlClient,
  workerThread,
} from '../../src/transport/worker-control-client.js';
import { startFaultProxy } from '../helpers/fault-proxy.js';
import { rejection } from '../helpers/rejection.js';

// What only the worker-thread client has: a thread to start, lose and end. Its reporting contract
// is tested with the in-thread client's tests (grpc-control-transport, grpc-reconnect), run on both.

function reportOf(reporterId = 'host-a'): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId,
    zone: 'z1',
    sequence: 1n,
    buckets: [{ bucket: 'api', offered: 100, admitted: 100, wouldDrop: 0 }],
  });
}
const answer = (request: ReportRequest): ReportResponse =>
  create(ReportResponseSchema, {
    responderId: 'agg',
    epoch: 1n,
    directives: request.buckets.map((b) => ({ bucket: b.bucket, dropRatio: 0.25, epoch: 1n, version: 1n })),
  });

const servers: GrpcControlServer[] = [];
const clients: WorkerControlClient[] = [];
after(async () => {
  for (const client of clients) client.close();
  await Promise.all(servers.map((s) => s.close()));
});
async function serve(handler: ReportHandler): Promise<GrpcControlServer> {
  const server = await startGrpcControlServer({ handler });
  servers.push(server);
  return server;
}
async function connect(target: string, options: Parameters<typeof createWorkerControlClient>[1] = {}) {
  const client = createWorkerControlClient(target, options);
  clients.push(client);
  await client.whenReady();
  return client;
}
/** Threads of this process (worker threads are OS threads). */
const threadCount = () => readdirSync('/proc/self/task').length;
async function waitUntil(what: string, check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const started = performance.now();
  while (!check()) {
    if (performance.now() - started > timeoutMs) assert.fail(`${what} within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe('gRPC control client on a worker thread', () => {
  it('answers a report in flight at close, then ends its thread', async () => {
    const held: (() => void)[] = [];
    const server = await serve(
      (request) => new Promise<ReportResponse>((resolve) => held.push(() => resolve(answer(request)))),
    );
    // A first client started and closed, so lazily started thread pools are in the baseline.
    const warm = await connect(server.address);
    warm.close();
    await waitUntil('the warm-up thread to end', () => warm[workerThread]() === undefined);
    const baseline = threadCount();

    const client = await connect(server.address);
    assert.ok(threadCount() > baseline, 'the worker runs on threads of its own');
    const inFlight = client.report(reportOf(), { timeoutMs: 5_000 });
    await waitUntil('the report to reach the server', () => held.length === 1);
    client.close();
    held[0]!();
    const response = await inFlight;
    assert.equal(response.directives[0]!.dropRatio, 0.25);
    await waitUntil('the worker thread to end', () => client[workerThread]() === undefined);
    await waitUntil('its threads to end', () => threadCount() <= baseline);
    const closed = await rejection(client.report(reportOf(), { timeoutMs: 1_000 }));
    assert.equal(closed.code, ErrorCode.StoreUnavailable);
    await assert.rejects(client.whenReady(), SpillwayError);
  });

  it('fails what a dead worker had in flight, says so, and starts a new one for the next report', async () => {
    const held: (() => void)[] = [];
    const server = await serve((request) =>
      request.reporterId === 'held'
        ? new Promise<ReportResponse>((resolve) => held.push(() => resolve(answer(request))))
        : answer(request),
    );
    const deaths: Error[] = [];
    const client = await connect(server.address, { onWorkerError: (error) => deaths.push(error) });
    const first = client[workerThread]();
    assert.ok(first);
    const inFlight = client.report(reportOf('held'), { timeoutMs: 10_000 });
    await waitUntil('the report to reach the server', () => held.length === 1);
    const startedMs = performance.now();
    await first.terminate();
    const lost = await rejection(inFlight);
    assert.equal(lost.code, ErrorCode.StoreUnavailable);
    assert.match(lost.message, /worker thread died/);
    assert.ok(performance.now() - startedMs < 5_000, 'failed when the thread died, not at the deadline');
    assert.equal(deaths.length, 1);

    const response = await client.report(reportOf(), { timeoutMs: 10_000 });
    assert.equal(response.directives.length, 1);
    const second = client[workerThread]();
    assert.ok(second && second !== first, 'a new thread');
    for (const release of held) release();
  });

  it('refuses a report it cannot send to the thread, without throwing', async () => {
    const server = await serve(answer);
    const client = await connect(server.address);
    const unclonable = { ...reportOf(), extra: () => 1 } as unknown as ReportRequest;
    const error = await rejection(client.report(unclonable, { timeoutMs: 1_000 }));
    assert.equal(error.code, ErrorCode.StoreUnavailable);
    assert.equal((await client.report(reportOf(), { timeoutMs: 5_000 })).directives.length, 1);
  });
  it('does not keep the process alive once idle, like the in-thread client', async () => {
    const server = await serve(answer);
    const started = performance.now();
    const outcome = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = execFile(
        process.execPath,
        ['--import', 'tsx', 'test/helpers/idle-worker-client.ts', server.address],
        { timeout: 30_000 },
        (_error, stdout, stderr) => resolve({ code: child.exitCode, stdout, stderr }),
      );
    });
    assert.equal(outcome.stdout, 'reported agg\n', outcome.stderr);
    assert.equal(
      outcome.code,
      0,
      `exited ${outcome.code} after ${Math.round(performance.now() - started)} ms`,
    );
  });

  it('keeps a connection watch across a dead worker: it fires when the new one connects', async () => {
    const server = await serve(answer);
    const proxy = await startFaultProxy(server.address);
    try {
      proxy.setMode('reset');
      const client = await connect(proxy.address);
      const failed = await rejection(client.report(reportOf(), { timeoutMs: 2_000 }));
      assert.equal(failed.code, ErrorCode.StoreUnavailable);
      let fired = 0;
      client.whenConnected!(() => fired++);
      const first = client[workerThread]()!;
      await first.terminate();
      await waitUntil('a new worker thread', () => {
        const now = client[workerThread]();
        return now !== undefined && now !== first;
      });
      assert.equal(fired, 0);
      proxy.setMode('pass');
      // The new thread's channel is idle until a report: the watch fires for the connection it opens.
      assert.equal((await client.report(reportOf(), { timeoutMs: 5_000 })).directives.length, 1);
      await waitUntil('the watch to fire', () => fired === 1);
    } finally {
      await proxy.close();
    }
  });

  it('settles a report its thread does not answer by the deadline plus 20 ms', async () => {
    const server = await serve(answer);
    const client = createWorkerControlClient(server.address);
    clients.push(client);
    // Sent before the thread has started: nothing can answer it in time.
    const started = performance.now();
    const error = await rejection(client.report(reportOf(), { timeoutMs: 0 }));
    const elapsedMs = performance.now() - started;
    assert.equal(error.code, ErrorCode.StoreTimeout);
    assert.match(error.message, /no answer from its worker thread/);
    assert.ok(elapsedMs < 1_000, `settled after ${elapsedMs} ms`);
    await client.whenReady();
    assert.equal((await client.report(reportOf(), { timeoutMs: 5_000 })).directives.length, 1);
  });

  it('refuses bad options at once, on the calling thread, as the in-thread client does', () => {
    for (const options of [{ reconnectAfterTimeouts: -1 }, { tls: { keyPem: 'not a key' } }]) {
      let inThread: unknown;
      try {
        createGrpcControlClient('127.0.0.1:1', options).close();
      } catch (error) {
        inThread = error;
      }
      assert.ok(inThread instanceof Error, `the in-thread client refuses ${JSON.stringify(options)}`);
      assert.throws(() => createWorkerControlClient('127.0.0.1:1', options), { message: inThread.message });
    }
  });
  const built = new URL('../../dist/src/transport/worker-control-client.js', import.meta.url);
  it('starts from the built package, also under `node --input-type=module -e` (a flag a worker refuses)', {
    skip: !existsSync(built) && 'dist/ not built (npm test builds it first)',
  }, async () => {
    const server = await serve(answer);
    const code = `
        const { createWorkerControlClient } = await import(${JSON.stringify(built.href)});
        const client = createWorkerControlClient(${JSON.stringify(server.address)});
        const response = await client.report({ $typeName: 'spillway.v1.ReportRequest', reporterId: 'eval', zone: 'z1',
          buckets: [{ $typeName: 'spillway.v1.BucketUsage', bucket: 'api', offered: 1, admitted: 1, wouldDrop: 0 }] },
          { timeoutMs: 10_000 });
        console.log(response.directives.length);`;
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ['--input-type=module', '-e', code],
        { timeout: 30_000 },
        (error, out, stderr) => (error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(out)),
      );
    });
    assert.equal(stdout, '1\n');
  });
});
