import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { spec as aggregatorSpec } from '../../src/cli/aggregator.js';
import { spec as controllerSpec } from '../../src/cli/controller.js';
import { spec as hostSpec } from '../../src/cli/host.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock } from '../../src/core/clock.js';
import {
  DirectiveSchema,
  Mode,
  ReportRequestSchema,
  ReportResponseSchema,
  Tier,
} from '../../src/gen/spillway/v1/control_pb.js';
import { createMetrics } from '../../src/ops/metrics.js';
import { startOpsServer } from '../../src/ops/ops-server.js';
import { startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import { decodeReportRequest } from '../../src/transport/report-codec.js';

// A host reports usage; it has no way to set a limit, a mode or a ratio. The Report RPC carries
// no such field, and bytes that look like one (a Directive smuggled in as unknown fields, in any
// field number a future version might use) change nothing.

describe('hosts cannot change limits', () => {
  it('a report carrying directive-shaped bytes changes no limit, mode or ratio', () => {
    const clock = new ManualClock(1_700_000_000_000);
    const controller = createController({
      id: 'ctl',
      scheduler: clock,
      config: {
        version: 1,
        intervalMs: 1000,
        ttlMs: 4000,
        ratioPolicy: { kind: 'plain' },
        buckets: [{ key: 'pay', limitRps: 100, mode: 'enforce', scope: 'global' }],
      },
    });
    const honest = toBinary(
      ReportRequestSchema,
      create(ReportRequestSchema, {
        reporterId: 'h1',
        tier: Tier.CONTROLLER, // claiming a higher tier grants nothing either
        zone: 'z1',
        sequence: 1n,
        windowStartMs: BigInt(clock.nowMs() - 1000),
        windowEndMs: BigInt(clock.nowMs()),
        buckets: [{ bucket: 'pay', offered: 50, admitted: 50 }],
      }),
    );
    // A Directive asking for limit 1e9, shadow mode and ratio 0, and a whole ReportResponse with it,
    // appended under field numbers the request does not define (protobuf keeps them as unknown).
    const directive = toBinary(
      DirectiveSchema,
      create(DirectiveSchema, {
        bucket: 'pay',
        limitRps: 1e9,
        mode: Mode.SHADOW,
        dropRatio: 0,
        ttlMs: 1e9,
        epoch: 1n << 60n,
      }),
    );
    const response = toBinary(
      ReportResponseSchema,
      create(ReportResponseSchema, { directives: [{ bucket: 'pay', limitRps: 1e9 }] }),
    );
    const smuggled = (field: number, bytes: Uint8Array) => [
      ...varint((field << 3) | 2),
      ...varint(bytes.length),
      ...bytes,
    ];
    const hostile = new Uint8Array([
      ...honest,
      ...smuggled(13, directive),
      ...smuggled(15, response),
      ...smuggled(1000, directive),
    ]);

    for (const decode of [decodeReportRequest, (b: Uint8Array) => fromBinary(ReportRequestSchema, b)]) {
      const request = decode(hostile);
      const reply = controller.handleReport(request, { peer: 'test' });
      assert.ok(!(reply instanceof Promise));
    }
    controller.tick();
    const bucket = controller.snapshot().buckets[0]!;
    assert.equal(bucket.limitRps, 100);
    assert.equal(bucket.mode, 'enforce');
    // Honest usage counted: 50 rps offered under a 100 rps limit.
    assert.equal(bucket.offeredRps, 50);
    const reply = controller.handleReport(decodeReportRequest(hostile), { peer: 'test' });
    assert.ok(!(reply instanceof Promise));
    for (const d of reply.directives) {
      assert.equal(d.limitRps, 100);
      assert.equal(d.mode, Mode.ENFORCE);
      assert.ok(d.epoch < 1n << 60n);
    }
  });
});

describe('defaults bind to loopback', () => {
  it('every command defaults its listen addresses to 127.0.0.1', () => {
    for (const spec of [controllerSpec, aggregatorSpec, hostSpec]) {
      for (const [name, flag] of Object.entries(spec.flags)) {
        if (!['listen', 'ops', 'dashboard'].includes(name)) continue;
        const text = flag.defaultText ?? '';
        assert.ok(
          text === 'off' || text.startsWith('127.0.0.1:'),
          `${spec.name} --${name} defaults to ${text}`,
        );
      }
    }
  });

  it('the gRPC and ops servers bind 127.0.0.1 when no host is given', async () => {
    const grpc = await startGrpcControlServer({
      handler: () => create(ReportResponseSchema, {}),
    });
    const ops = await startOpsServer({
      registry: createMetrics({ component: 'controller', id: 't', processMetrics: false }).registry,
      health: () => ({ ok: true }),
    });
    try {
      assert.match(grpc.address, /^127\.0\.0\.1:\d+$/);
      assert.match(ops.address, /^127\.0\.0\.1:\d+$/);
    } finally {
      await grpc.close();
      await ops.close();
    }
  });
});

function varint(value: number): number[] {
  const out: number[] = [];
  let v = value;
  while (v > 0x7f) {
    out.push((v & 0x7f) | 0x80);
    v >>>= 7;
  }
  out.push(v);
  return out;
}
