import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock } from '../../src/core/clock.js';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import { ReportRequestSchema, ReportResponseSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { addAggregatorMetrics } from '../../src/ops/aggregator-metrics.js';
import { addControllerMetrics } from '../../src/ops/controller-metrics.js';
import { instrumentControlClient } from '../../src/ops/instrument-control-client.js';
import { instrumentReportHandler } from '../../src/ops/instrument-report-handler.js';
import { createLogger, parseLogLevel } from '../../src/ops/logger.js';
import { createMetrics, GC_PAUSE_BUCKETS_S } from '../../src/ops/metrics.js';
import { startOpsServer } from '../../src/ops/ops-server.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { call, hostReport } from '../control/report-fixtures.js';

interface FakeSnapshot {
  buckets: { key: string; offered: number; ratio: number }[];
}

describe('createMetrics', () => {
  it('reads one snapshot per scrape, on its own registry, and drops series of vanished buckets', async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    let snapshots = 0;
    let state: FakeSnapshot = {
      buckets: [
        { key: 'a', offered: 10, ratio: 0.5 },
        { key: 'b', offered: 3, ratio: 0 },
      ],
    };
    metrics.addSnapshotMetrics(() => {
      snapshots++;
      return state;
    }, [
      {
        name: 'spillway_offered_total',
        help: 'offered',
        type: 'counter',
        labelNames: ['bucket'],
        samples: (s: FakeSnapshot) => s.buckets.map((b) => [{ bucket: b.key }, b.offered] as const),
      },
      {
        name: 'spillway_drop_ratio',
        help: 'ratio',
        type: 'gauge',
        labelNames: ['bucket'],
        samples: (s: FakeSnapshot) => s.buckets.map((b) => [{ bucket: b.key }, b.ratio] as const),
      },
    ]);
    const first = await metrics.registry.metrics();
    assert.equal(snapshots, 1);
    assert.match(first, /^spillway_offered_total\{bucket="a"\} 10$/m);
    assert.match(first, /^spillway_drop_ratio\{bucket="a"\} 0\.5$/m);
    assert.match(first, /^spillway_info\{component="host",id="h1"\} 1$/m);
    assert.match(first, /# TYPE spillway_offered_total counter/);

    state = { buckets: [{ key: 'a', offered: 25, ratio: 0.25 }] };
    const second = await metrics.registry.metrics();
    assert.equal(snapshots, 2);
    assert.match(second, /^spillway_offered_total\{bucket="a"\} 25$/m);
    assert.doesNotMatch(second, /bucket="b"/);

    const other = createMetrics({ component: 'host', id: 'h2', processMetrics: false });
    assert.doesNotMatch(await other.registry.metrics(), /spillway_offered_total/, 'registries are separate');
  });

  it('exports process metrics with the spillway_ prefix by default', async () => {
    const metrics = createMetrics({ component: 'controller', id: 'c1' });
    assert.match(await metrics.registry.metrics(), /^spillway_process_cpu_user_seconds_total /m);
  });

  it('times garbage collection pauses in buckets fine enough to tell 2 ms from 9 ms', async () => {
    const metrics = createMetrics({ component: 'proxy', id: 'p1' });
    const bucketsSeen = async () => {
      const text = await metrics.registry.metrics();
      return [
        ...text.matchAll(/^spillway_nodejs_gc_duration_seconds_bucket\{le="([^"]+)",kind="minor"\}/gm),
      ].map((m) => Number(m[1]));
    };
    // Young-generation collections happen as this allocates; the histogram hears of them a little later.
    const deadline = Date.now() + 10_000;
    let seen: number[] = [];
    while (seen.length === 0 && Date.now() < deadline) {
      let garbage: object[] = [];
      for (let i = 0; i < 200_000; i++) garbage.push({ i });
      garbage = [];
      await new Promise((resolve) => setTimeout(resolve, 20));
      seen = await bucketsSeen();
    }
    assert.deepEqual(
      seen.filter((le) => Number.isFinite(le)),
      GC_PAUSE_BUCKETS_S,
    );
    assert.ok(GC_PAUSE_BUCKETS_S.includes(0.002) && GC_PAUSE_BUCKETS_S.includes(0.005));
  });
});

describe('instrumentation of reports', () => {
  const request = create(ReportRequestSchema, { reporterId: 'h1' });
  const response = create(ReportResponseSchema, { responderId: 'agg' });

  it('counts sent reports by parent and result, passing results and errors through', async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    const outcomes = [
      () => Promise.resolve(response),
      () => Promise.reject(new SpillwayError(ErrorCode.StoreTimeout, 't')),
      () => Promise.reject(new SpillwayError(ErrorCode.StoreUnavailable, 'u')),
      () =>
        Promise.reject(
          new SpillwayError(ErrorCode.StoreUnavailable, 'r', {
            refused: true,
            remoteCode: ErrorCode.InvalidReport,
          }),
        ),
      () => Promise.reject(new Error('x')),
    ];
    let i = 0;
    const inner: ControlClient = { target: 'p:1', report: () => outcomes[i++]!(), close: () => {} };
    const client = instrumentControlClient(inner, metrics);
    assert.equal(client.target, 'p:1');
    assert.equal(await client.report(request, { timeoutMs: 10 }), response);
    await assert.rejects(client.report(request, { timeoutMs: 10 }), { code: ErrorCode.StoreTimeout });
    await assert.rejects(client.report(request, { timeoutMs: 10 }), { code: ErrorCode.StoreUnavailable });
    await assert.rejects(client.report(request, { timeoutMs: 10 }), { code: ErrorCode.StoreUnavailable });
    await assert.rejects(client.report(request, { timeoutMs: 10 }), /x/);
    const text = await metrics.registry.metrics();
    for (const result of ['ok', 'timeout', 'unavailable', 'refused', 'error']) {
      assert.match(text, new RegExp(`^spillway_reports_total\\{parent="p:1",result="${result}"\\} 1$`, 'm'));
    }
    assert.match(text, /^spillway_report_duration_seconds_count\{parent="p:1"\} 5$/m);
  });

  it('counts received reports by result', async () => {
    const metrics = createMetrics({ component: 'aggregator', id: 'a1', processMetrics: false });
    const handler = instrumentReportHandler((req) => {
      if (req.reporterId === 'bad') throw new SpillwayError(ErrorCode.InvalidReport, 'bad');
      if (req.reporterId === 'boom') throw new Error('boom');
      return response;
    }, metrics);
    assert.equal(await handler(request, { peer: 'x' }), response);
    await assert.rejects(async () =>
      handler(create(ReportRequestSchema, { reporterId: 'bad' }), { peer: 'x' }),
    );
    await assert.rejects(async () =>
      handler(create(ReportRequestSchema, { reporterId: 'boom' }), { peer: 'x' }),
    );
    const text = await metrics.registry.metrics();
    assert.match(text, /^spillway_reports_received_total\{result="ok"\} 1$/m);
    assert.match(text, /^spillway_reports_received_total\{result="invalid"\} 1$/m);
    assert.match(text, /^spillway_reports_received_total\{result="error"\} 1$/m);
  });
});

describe('startOpsServer', () => {
  it('serves /healthz and /metrics, 404s the rest, and closes without leaking sockets', async () => {
    const baseline = sockets();
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    let healthy = true;
    const ops = await startOpsServer({
      registry: metrics.registry,
      health: () => ({ ok: healthy, buckets: 2 }),
    });
    assert.match(ops.address, /^127\.0\.0\.1:\d+$/);
    const base = `http://${ops.address}`;

    const ok = await fetch(`${base}/healthz`);
    assert.equal(ok.status, 200);
    assert.deepEqual(await ok.json(), { ok: true, buckets: 2 });
    healthy = false;
    const sick = await fetch(`${base}/healthz`);
    assert.equal(sick.status, 503);
    assert.equal(((await sick.json()) as { ok: boolean }).ok, false);

    const scrape = await fetch(`${base}/metrics`);
    assert.equal(scrape.status, 200);
    assert.match(scrape.headers.get('content-type') ?? '', /text\/plain/);
    assert.match(await scrape.text(), /spillway_info\{component="host",id="h1"\} 1/);

    assert.equal((await fetch(`${base}/nope`)).status, 404);
    assert.equal((await fetch(`${base}/metrics`, { method: 'POST', body: 'x' })).status, 405);

    await ops.close();
    const deadline = Date.now() + 5_000;
    while (sockets() > baseline && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.equal(sockets(), baseline);
  });

  it('reports a throwing health check as unhealthy', async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    const ops = await startOpsServer({
      registry: metrics.registry,
      health: () => {
        throw new Error('no config');
      },
    });
    try {
      const response = await fetch(`http://${ops.address}/healthz`);
      assert.equal(response.status, 503);
      assert.deepEqual(await response.json(), { ok: false, error: 'no config' });
    } finally {
      await ops.close();
    }
  });
});

describe('createLogger', () => {
  it('writes one JSON object per line with component, id and level', () => {
    const lines: string[] = [];
    const destination = new Writable({
      write(chunk, _encoding, callback) {
        lines.push(...String(chunk).trim().split('\n'));
        callback();
      },
    });
    const logger = createLogger({ component: 'controller', id: 'c1', level: 'info', destination });
    logger.debug('hidden');
    logger.info({ grpc: '127.0.0.1:1' }, 'listening');
    assert.equal(lines.length, 1);
    const line = JSON.parse(lines[0]!) as Record<string, unknown>;
    assert.equal(line.msg, 'listening');
    assert.equal(line.level, 'info');
    assert.equal(line.component, 'controller');
    assert.equal(line.id, 'c1');
    assert.equal(line.grpc, '127.0.0.1:1');
  });

  it('refuses unknown levels with ERR_SPILLWAY_INVALID_USAGE', () => {
    assert.equal(parseLogLevel('debug'), 'debug');
    assert.throws(() => parseLogLevel('loud'), { code: ErrorCode.InvalidUsage });
  });
});

function sockets(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap' || r === 'TCPServerWrap')
    .length;
}

describe('per-bucket series of the control plane are bounded', () => {
  it('the controller and the aggregator export their busiest buckets only, and count the rest', async () => {
    const clock = new ManualClock(1_700_000_000_000);
    const controller = createController({
      id: 'ctl',
      scheduler: clock,
      config: {
        version: 1,
        intervalMs: 1000,
        ttlMs: 4000,
        buckets: [
          {
            template: 'api:caller=*',
            limitRps: 10,
            mode: 'enforce',
            scope: 'global',
            overrides: {},
            maxInstances: 1000,
          },
        ],
      },
    });
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [{ target: 'p', report: () => new Promise(() => {}), close() {} }],
      scheduler: clock,
    });
    // 30 callers, caller k offering k units: the busiest 10 are 20..29.
    const buckets = Array.from({ length: 30 }, (_, k) => ({ bucket: `api:caller=c${k}`, offered: k + 1 }));
    for (const handler of [controller.handleReport, aggregator.handleReport]) {
      call(handler, hostReport({ id: 'h1', sequence: 1, endMs: clock.nowMs(), zone: 'z1', buckets }));
    }
    controller.tick();
    const controllerMetrics = createMetrics({ component: 'controller', id: 'ctl', processMetrics: false });
    addControllerMetrics(controllerMetrics, controller, { maxBucketSeries: 10 });
    const aggregatorMetrics = createMetrics({ component: 'aggregator', id: 'agg', processMetrics: false });
    addAggregatorMetrics(aggregatorMetrics, aggregator, { maxBucketSeries: 10 });
    for (const [metrics, prefix] of [
      [controllerMetrics, 'spillway_controller'],
      [aggregatorMetrics, 'spillway_aggregator'],
    ] as const) {
      const text = await metrics.registry.metrics();
      const offered = text.split('\n').filter((l) => l.startsWith(`${prefix}_offered_rps{`));
      assert.equal(offered.length, 10, prefix);
      for (const line of offered) assert.ok(Number(/c(\d+)"/.exec(line)![1]) >= 20, line);
      assert.match(text, new RegExp(`^${prefix}_bucket_series_omitted 20$`, 'm'));
    }
    assert.match(await controllerMetrics.registry.metrics(), /^spillway_controller_buckets 30$/m);
  });
});
