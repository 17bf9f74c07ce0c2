import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { Client, credentials, Metadata, status } from '@grpc/grpc-js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../../src/core/errors.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient, ReportHandler } from '../../src/transport/control-transport.js';
import {
  createGrpcControlClient,
  type GrpcControlClientOptions,
} from '../../src/transport/grpc-control-client.js';
import { type GrpcControlServer, startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import { REPORT_METHOD_PATH } from '../../src/transport/grpc-control-service.js';
import { CONTROL_CLIENT_VARIANTS } from '../helpers/control-client-variants.js';
import { rejection } from '../helpers/rejection.js';

function reportOf(buckets: number, reporterId = 'host-a'): ReportRequest {
  return create(ReportRequestSchema, {
    reporterId,
    zone: 'z1',
    sequence: 7n,
    windowStartMs: 1_000n,
    windowEndMs: 2_000n,
    hostCount: 1,
    buckets: Array.from({ length: buckets }, (_, i) => ({
      bucket: `api:caller=${i}`,
      offered: 100 + i,
      admitted: 90 + i,
      wouldDrop: 0,
    })),
  });
}

/** Answers one directive per reported bucket, dropping the share above 50 rps. */
const echoHandler: ReportHandler = (request) =>
  create(ReportResponseSchema, {
    responderId: 'ctl',
    epoch: 42n,
    reportIntervalMs: 1000,
    directives: request.buckets.map((b) => ({
      bucket: b.bucket,
      dropRatio: Math.max(0, (b.offered - 50) / b.offered),
      limitRps: 50,
      offeredRps: b.offered,
      epoch: 42n,
      version: request.sequence,
      ttlMs: 3000,
    })),
  });

const openServers: GrpcControlServer[] = [];
const openClients: ControlClient[] = [];
async function serve(
  handler: ReportHandler,
  extra: Partial<Parameters<typeof startGrpcControlServer>[0]> = {},
) {
  const server = await startGrpcControlServer({ handler, ...extra });
  openServers.push(server);
  return server;
}
after(async () => {
  for (const c of openClients) c.close();
  await Promise.all(openServers.map((s) => s.close()));
});

for (const variant of CONTROL_CLIENT_VARIANTS)
  describe(`gRPC control transport, client ${variant.name}`, () => {
    async function connect(target: string, options?: GrpcControlClientOptions): Promise<ControlClient> {
      const client = await variant.connect(target, options);
      openClients.push(client);
      return client;
    }
    it('round-trips a report and its directives over a real socket', async () => {
      let seenPeer = '';
      const server = await serve((request, context) => {
        seenPeer = context.peer;
        return echoHandler(request, context);
      });
      assert.match(server.address, /^127\.0\.0\.1:\d+$/);
      assert.ok(server.port > 0);
      const client = await connect(server.address);
      assert.equal(client.target, server.address);
      const response = await client.report(reportOf(50), { timeoutMs: 5_000 });
      assert.equal(response.responderId, 'ctl');
      assert.equal(response.epoch, 42n);
      assert.equal(response.directives.length, 50);
      assert.equal(response.directives[3]!.bucket, 'api:caller=3');
      assert.equal(response.directives[3]!.offeredRps, 103);
      assert.equal(response.directives[3]!.version, 7n);
      assert.match(seenPeer, /127\.0\.0\.1/);
    });

    it('rejects with ERR_SPILLWAY_STORE_TIMEOUT when the deadline passes, and does not hang', async () => {
      let release = () => {};
      const server = await serve((request, context) =>
        request.reporterId === 'warm'
          ? echoHandler(request, context)
          : new Promise<ReportResponse>((resolve) => {
              release = () => resolve(echoHandler(request, context) as ReportResponse);
            }),
      );
      const client = await connect(server.address);
      await client.report(reportOf(1, 'warm'), { timeoutMs: 5_000 }); // connect first: time only the call
      const started = performance.now();
      const error = await rejection(client.report(reportOf(1), { timeoutMs: 150 }));
      const elapsedMs = performance.now() - started;
      release();
      assert.equal(error.code, ErrorCode.StoreTimeout);
      assert.equal(error.details?.grpcStatus, 'DEADLINE_EXCEEDED');
      assert.ok(elapsedMs >= 100 && elapsedMs < 3_000, `settled after ${elapsedMs} ms`);
    });

    it('rejects with ERR_SPILLWAY_STORE_UNAVAILABLE, well before the deadline, when nothing listens', async () => {
      const server = await serve(echoHandler);
      const address = server.address;
      await server.close();
      const client = await connect(address);
      const started = performance.now();
      const error = await rejection(client.report(reportOf(1), { timeoutMs: 10_000 }));
      assert.equal(error.code, ErrorCode.StoreUnavailable);
      assert.equal(error.details?.grpcStatus, 'UNAVAILABLE');
      assert.ok(performance.now() - started < 5_000);
    });

    it('answers garbage bytes with INVALID_ARGUMENT and keeps serving', async () => {
      let handled = 0;
      const server = await serve((request, context) => {
        handled++;
        return echoHandler(request, context);
      });
      const raw = new Client(server.address, credentials.createInsecure());
      try {
        for (const garbage of [[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], [0x0f], [0xff, 0xff, 0xff]]) {
          const outcome = await new Promise<{ code?: number; details?: string }>((resolve) => {
            raw.makeUnaryRequest(
              REPORT_METHOD_PATH,
              (b: Buffer) => b,
              (b: Buffer) => b,
              Buffer.from(garbage),
              new Metadata(),
              { deadline: Date.now() + 5_000 },
              (error) => resolve(error ?? {}),
            );
          });
          assert.equal(outcome.code, status.INVALID_ARGUMENT);
          assert.match(outcome.details ?? '', /ERR_SPILLWAY_INVALID_REPORT: malformed ReportRequest/);
        }
      } finally {
        raw.close();
      }
      assert.equal(handled, 0);
      const response = await (await connect(server.address)).report(reportOf(2), { timeoutMs: 5_000 });
      assert.equal(response.directives.length, 2);
    });

    it('maps handler errors: invalid report -> INVALID_ARGUMENT, capacity -> RESOURCE_EXHAUSTED, other -> INTERNAL', async () => {
      const logged: unknown[] = [];
      const server = await serve(
        (request) => {
          if (request.reporterId === 'bad')
            throw new SpillwayError(ErrorCode.InvalidReport, 'offered is NaN');
          if (request.reporterId === 'full')
            throw new SpillwayError(ErrorCode.CapacityExceeded, 'too many hosts');
          if (request.reporterId === 'async') return Promise.reject(new Error('disk on fire'));
          throw new Error('boom');
        },
        { onError: (error) => logged.push(error) },
      );
      const client = await connect(server.address);
      const invalid = await rejection(client.report(reportOf(1, 'bad'), { timeoutMs: 5_000 }));
      assert.equal(invalid.code, ErrorCode.StoreUnavailable);
      assert.equal(invalid.details?.grpcStatus, 'INVALID_ARGUMENT');
      assert.match(String(invalid.details?.remoteMessage), /^ERR_SPILLWAY_INVALID_REPORT: offered is NaN/);
      // A refusal, as the in-memory network delivers one: the parent answered and said no.
      assert.equal(invalid.details?.refused, true);
      assert.equal(invalid.details?.remoteCode, ErrorCode.InvalidReport);

      const full = await rejection(client.report(reportOf(1, 'full'), { timeoutMs: 5_000 }));
      assert.equal(full.details?.grpcStatus, 'RESOURCE_EXHAUSTED');
      assert.match(String(full.details?.remoteMessage), /ERR_SPILLWAY_CAPACITY_EXCEEDED/);
      assert.equal(full.details?.remoteCode, ErrorCode.CapacityExceeded);

      for (const id of ['boom', 'async']) {
        const internal = await rejection(client.report(reportOf(1, id), { timeoutMs: 5_000 }));
        assert.equal(internal.details?.grpcStatus, 'INTERNAL');
        assert.equal(internal.details?.refused, undefined, 'a fault, not a refusal');
      }
      assert.equal(logged.length, 2, 'only unexpected failures reach onError');
    });

    it('refuses oversize messages on both sides without crashing', async () => {
      const server = await serve(
        (request, context) => echoHandler(request.reporterId === 'fanout' ? reportOf(200) : request, context),
        { maxMessageBytes: 64 * 1024 },
      );
      const client = await connect(server.address);
      const big = reportOf(5_000); // ~150 KB
      const serverSide = await rejection(client.report(big, { timeoutMs: 5_000 }));
      assert.equal(serverSide.code, ErrorCode.StoreUnavailable);
      assert.equal(serverSide.details?.grpcStatus, 'RESOURCE_EXHAUSTED');

      const smallClient = await connect(server.address, { maxMessageBytes: 1024 });
      const clientSide = await rejection(smallClient.report(big, { timeoutMs: 5_000 }));
      assert.equal(clientSide.details?.grpcStatus, 'RESOURCE_EXHAUSTED');

      // A response over the client's bound is refused too: a one-bucket report answered with 200 directives.
      const responseSide = await rejection(smallClient.report(reportOf(1, 'fanout'), { timeoutMs: 5_000 }));
      assert.equal(responseSide.details?.grpcStatus, 'RESOURCE_EXHAUSTED');
      // grpc-js's own size refusals name no Spillway code: the parent may have applied the report,
      // so they are not counted as the parent saying no.
      assert.equal(responseSide.details?.refused, undefined);
      assert.equal(serverSide.details?.refused, undefined);

      const ok = await client.report(reportOf(10), { timeoutMs: 5_000 });
      assert.equal(ok.directives.length, 10);
    });

    it('checks the shared auth token before the handler runs', async () => {
      const seenTokens: string[] = [];
      const server = await serve(
        (request, context) => {
          seenTokens.push(request.authToken);
          return echoHandler(request, context);
        },
        { authToken: 's3cret' },
      );
      const anonymous = await rejection(
        (await connect(server.address)).report(reportOf(1), { timeoutMs: 5_000 }),
      );
      assert.equal(anonymous.details?.grpcStatus, 'UNAUTHENTICATED');
      const wrong = await rejection(
        (await connect(server.address, { authToken: 'guess' })).report(reportOf(1), { timeoutMs: 5_000 }),
      );
      assert.equal(wrong.details?.grpcStatus, 'UNAUTHENTICATED');
      const request = reportOf(1);
      const response = await (await connect(server.address, { authToken: 's3cret' })).report(request, {
        timeoutMs: 5_000,
      });
      assert.equal(response.directives.length, 1);
      assert.deepEqual(seenTokens, ['s3cret']);
      assert.equal(request.authToken, '', "the caller's request is not modified");
    });

    it("reads a report's token before decoding it, and decodes at most maxBucketsPerReport buckets", async () => {
      let handled = 0;
      const refused: string[] = [];
      const server = await serve(
        (request, context) => {
          handled++;
          return echoHandler(request, context);
        },
        {
          authToken: 's3cret',
          maxBucketsPerReport: 100,
          onRefused: ({ result, code }) => refused.push(`${result}:${code ?? ''}`),
        },
      );
      const token = (text: string) => [0x52, text.length, ...Buffer.from(text)];
      // Field 8 entries: an empty bucket (0x42 0x00), and one whose inside is not a BucketUsage.
      const empties = (n: number) => Array.from({ length: n }, () => [0x42, 0x00]).flat();
      const broken = [0x42, 0x02, 0xff, 0xff];
      const raw = new Client(server.address, credentials.createInsecure());
      const send = (bytes: number[]) =>
        new Promise<{ code?: number; details?: string }>((resolve) => {
          raw.makeUnaryRequest(
            REPORT_METHOD_PATH,
            (b: Buffer) => b,
            (b: Buffer) => b,
            Buffer.from(bytes),
            new Metadata(),
            { deadline: Date.now() + 5_000 },
            (error) => resolve(error ?? {}),
          );
        });
      try {
        // A stranger's report is refused for its token though its buckets could not be decoded:
        // nothing past the token was decoded.
        const stranger = await send([...broken, ...token('guess')]);
        assert.equal(stranger.code, status.UNAUTHENTICATED);
        const member = await send([...broken, ...token('s3cret')]);
        assert.equal(member.code, status.INVALID_ARGUMENT);
        // A member's report past the bound is refused at the 101st bucket.
        const over = await send([...token('s3cret'), ...empties(101)]);
        assert.equal(over.code, status.INVALID_ARGUMENT);
        assert.match(over.details ?? '', /more than 100 buckets/);
      } finally {
        raw.close();
      }
      assert.equal(handled, 0);
      // Each refusal reaches the receiver's counters, as one its handler makes would.
      assert.deepEqual(refused, [
        'unauthenticated:',
        'invalid:ERR_SPILLWAY_INVALID_REPORT',
        'invalid:ERR_SPILLWAY_INVALID_REPORT',
      ]);
    });

    it('refuses an empty shared token: it would let every tokenless report in', async () => {
      await assert.rejects(startGrpcControlServer({ handler: echoHandler, authToken: '' }), (error) =>
        isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
      );
    });

    it('rejects reports on a closed client without throwing synchronously', async () => {
      const server = await serve(echoHandler);
      const client = await variant.connect(server.address);
      await client.report(reportOf(1), { timeoutMs: 5_000 });
      client.close();
      client.close();
      const error = await rejection(client.report(reportOf(1), { timeoutMs: 5_000 }));
      assert.ok(isSpillwayError(error, ErrorCode.StoreUnavailable));
    });

    it('speaks TLS when given a certificate', {
      skip: !hasOpenssl() && 'openssl not installed',
    }, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'spillway-tls-'));
      try {
        execFileSync(
          'openssl',
          [
            'req',
            '-x509',
            '-newkey',
            'rsa:2048',
            '-nodes',
            '-days',
            '1',
            '-subj',
            '/CN=localhost',
            '-addext',
            'subjectAltName=DNS:localhost,IP:127.0.0.1',
            '-keyout',
            join(dir, 'key.pem'),
            '-out',
            join(dir, 'cert.pem'),
          ],
          { stdio: 'ignore' },
        );
        const certPem = readFileSync(join(dir, 'cert.pem'));
        const keyPem = readFileSync(join(dir, 'key.pem'));
        const server = await serve(echoHandler, { tls: { certPem, keyPem } });
        const tlsClient = await connect(server.address, {
          tls: { caPem: certPem, serverNameOverride: 'localhost' },
        });
        const response = await tlsClient.report(reportOf(3), {
          timeoutMs: 5_000,
        });
        assert.equal(response.directives.length, 3);
        const plaintext = await rejection(
          (await connect(server.address)).report(reportOf(1), { timeoutMs: 2_000 }),
        );
        assert.notEqual(plaintext.code, undefined);
        // Mutual TLS without the CAs of client certificates would take whatever roots the
        // environment names (or Node's public ones): refused.
        await assert.rejects(
          startGrpcControlServer({ handler: echoHandler, tls: { certPem, keyPem, requireClientCert: true } }),
          (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
        );
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });

describe('gRPC control client in this thread', () => {
  it('leaves no sockets behind after close', async () => {
    const baseline = countHandles();
    const server = await startGrpcControlServer({ handler: echoHandler });
    const clients = [createGrpcControlClient(server.address), createGrpcControlClient(server.address)];
    await Promise.all(clients.map((c) => c.report(reportOf(5), { timeoutMs: 5_000 })));
    assert.ok(countHandles() > baseline, 'the test can see open handles');
    for (const c of clients) c.close();
    await server.close();
    const deadline = Date.now() + 5_000;
    while (countHandles() > baseline && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.equal(countHandles(), baseline, `left: ${process.getActiveResourcesInfo().join(', ')}`);
  });
});

function countHandles(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap' || r === 'TCPServerWrap')
    .length;
}

function hasOpenssl(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
