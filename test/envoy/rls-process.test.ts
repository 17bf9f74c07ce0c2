import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  type RateLimitRequest,
  RateLimitRequestSchema,
  RateLimitResponse_Code,
} from '../../src/gen/envoy/service/ratelimit/v3/rls_pb.js';
import { requireRedis, startRedis } from '../helpers/redis-server.js';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { createRlsClient, type RlsClient } from './rls-client.js';

// One `spillway rls` process at a time, as an operator runs it: hostile calls answered with a clear
// status while other callers are served, reloads that keep the previous config on error, and the
// Redis backend's exact counts shared by two instances.

const config = (requestsPerUnit: number) => `
domain: edge
descriptors:
  - key: generic_key
    value: login
    rate_limit: { unit: minute, requests_per_unit: ${requestsPerUnit} }
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 1000 }
`;
const LOGIN = { domain: 'edge', descriptors: [{ entries: [{ key: 'generic_key', value: 'login' }] }] };

async function grpcCode(promise: Promise<unknown>): Promise<number | 'answered'> {
  try {
    await promise;
    return 'answered';
  } catch (error) {
    return (error as { code: number }).code;
  }
}

describe('spillway rls --backend local, one process', { timeout: 120_000 }, () => {
  let dir = '';
  let path = '';
  let rls: SpillwayProcess;
  let client: RlsClient;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-rls-one-'));
    path = join(dir, 'ratelimit.yaml');
    writeFileSync(path, config(1000));
    rls = await startSpillway('rls', [
      'rls',
      ...['--config', path, '--backend', 'local', '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'],
      ...['--log-level', 'warn'],
    ]);
    client = createRlsClient(rls.grpc!);
  });

  after(async () => {
    client?.close();
    if (rls) await stopSpillway(rls);
    rmSync(dir, { recursive: true, force: true });
  });

  it('hostile calls get a clear status, memory stays bounded, other callers are served throughout', async () => {
    let served = 0;
    let failed = 0;
    let stop = false;
    const good = (async () => {
      const other = createRlsClient(rls.grpc!);
      while (!stop) {
        const code = await grpcCode(other.shouldRateLimit(LOGIN));
        if (code === 'answered') served++;
        else failed++;
      }
      other.close();
    })();

    const manyDescriptors: RateLimitRequest = create(RateLimitRequestSchema, {
      domain: 'edge',
      descriptors: Array.from({ length: 10_000 }, (_, i) => ({
        entries: [{ key: 'remote_address', value: `ip${i}` }],
      })),
    });
    const bigValue = {
      domain: 'edge',
      descriptors: [{ entries: [{ key: 'remote_address', value: 'x'.repeat(1_000_000) }] }],
    };
    const bigKey = {
      domain: 'edge',
      descriptors: [{ entries: [{ key: 'k'.repeat(1_000_000), value: 'v' }] }],
    };
    const tooBig = {
      domain: 'edge',
      descriptors: [{ entries: [{ key: 'remote_address', value: 'x'.repeat(2_000_000) }] }],
    };
    for (let round = 0; round < 10; round++) {
      const codes = await Promise.all([
        grpcCode(client.shouldRateLimit(manyDescriptors)),
        grpcCode(client.shouldRateLimit(bigValue)),
        grpcCode(client.shouldRateLimit(bigKey)),
        grpcCode(client.shouldRateLimit(tooBig)),
        grpcCode(client.callRaw(Buffer.from([0x12, 0xff, 0xff, 0x01]))),
        grpcCode(
          client.shouldRateLimit({
            domain: 'nowhere',
            descriptors: [{ entries: [{ key: 'a', value: 'b' }] }],
          }),
        ),
      ]);
      assert.deepEqual(codes, [
        status.INVALID_ARGUMENT,
        status.INVALID_ARGUMENT,
        status.INVALID_ARGUMENT,
        status.RESOURCE_EXHAUSTED,
        status.INVALID_ARGUMENT,
        'answered',
      ]);
    }
    const unknown = await client.shouldRateLimit({
      domain: 'nowhere',
      descriptors: [{ entries: [{ key: 'a', value: 'b' }] }],
    });
    assert.deepEqual(
      [unknown.overallCode, unknown.statuses[0]?.code, unknown.statuses[0]?.currentLimit],
      [RateLimitResponse_Code.OK, RateLimitResponse_Code.OK, undefined],
    );
    // A flood of distinct client addresses: each is a counter, bounded by the backend's table.
    for (let i = 0; i < 2_000; i += 200) {
      await Promise.all(
        Array.from({ length: 200 }, (_, j) =>
          client.shouldRateLimit({
            domain: 'edge',
            descriptors: [{ entries: [{ key: 'remote_address', value: `flood-${i + j}` }] }],
          }),
        ),
      );
    }
    stop = true;
    await good;
    assert.ok(rls.running, 'the process is still running');
    assert.equal(failed, 0, 'no call of the other client failed');
    assert.ok(served > 10, `the other client was served (${served} calls)`);
    const series = await scrape(rls.ops);
    const heapMb = (series.get('spillway_nodejs_heap_size_used_bytes') ?? 0) / 1e6;
    assert.ok(heapMb < 200, `heap ${heapMb.toFixed(0)} MB after the hostile calls`);
    assert.equal(series.get(seriesKey('spillway_rls_refused_total', { reason: 'too_many_descriptors' })), 10);
    assert.equal(series.get(seriesKey('spillway_rls_refused_total', { reason: 'invalid_descriptor' })), 20);
    assert.equal(series.get(seriesKey('spillway_rls_refused_total', { reason: 'malformed' })), 10);
    assert.equal(series.get(seriesKey('spillway_rls_requests_total', { domain: '(unknown)' })), 11);
  });

  it('reloads on change and on SIGHUP; a broken file keeps the previous config in force', async () => {
    const limitOf = async () =>
      (await client.shouldRateLimit(LOGIN)).statuses[0]?.currentLimit?.requestsPerUnit;
    const reloads = async (result: string) =>
      (await scrape(rls.ops)).get(seriesKey('spillway_config_reloads_total', { result })) ?? 0;
    assert.equal(await limitOf(), 1000);
    writeFileSync(path, config(500));
    await waitFor('the changed file to be in force', async () =>
      (await limitOf()) === 500 ? true : undefined,
    );
    assert.equal(await reloads('ok'), 1);

    writeFileSync(path, `${config(7)}    shadow_mode: maybe\n`);
    await waitFor('the broken file to be refused', async () =>
      (await reloads('error')) === 1 ? true : undefined,
    );
    assert.equal(await limitOf(), 500, 'the previous config stays in force');
    const health = (await (await fetch(`http://${rls.ops}/healthz`)).json()) as { lastReloadError: string };
    assert.match(
      health.lastReloadError,
      /ratelimit\.yaml:\d+:\d+: descriptors\[1\]\.shadow_mode: expected boolean/,
    );

    rls.child.kill('SIGHUP');
    await waitFor('SIGHUP to retry the broken file', async () =>
      (await reloads('error')) === 2 ? true : undefined,
    );
    assert.ok(rls.running, 'SIGHUP does not end the process');
    writeFileSync(path, config(7));
    await waitFor('the fixed file to be in force', async () => ((await limitOf()) === 7 ? true : undefined));
  });
});

describe('spillway rls --backend redis: two instances share exact counts', { timeout: 120_000 }, () => {
  it('a limit of 10 a minute admits exactly 10 across both', async (t) => {
    if (!requireRedis(t)) return;
    const redis = await startRedis();
    const dir = mkdtempSync(join(tmpdir(), 'spillway-rls-redis-'));
    const path = join(dir, 'ratelimit.yaml');
    writeFileSync(path, config(10));
    const instances: SpillwayProcess[] = [];
    const clients: RlsClient[] = [];
    try {
      for (const n of [1, 2]) {
        instances.push(
          await startSpillway(`rls-redis-${n}`, [
            'rls',
            ...[
              '--config',
              path,
              '--backend',
              'redis',
              '--redis-url',
              redis.url,
              '--redis-prefix',
              `t${process.pid}`,
            ],
            ...['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--log-level', 'warn'],
          ]),
        );
      }
      clients.push(...instances.map((p) => createRlsClient(p.grpc!)));
      // Not across a minute boundary: both windows would count.
      const secondsLeft = 60 - (Math.floor(Date.now() / 1000) % 60);
      if (secondsLeft < 5)
        await waitFor(
          'a fresh minute',
          async () => (Math.floor(Date.now() / 1000) % 60 < 50 ? true : undefined),
          { timeoutMs: 10_000 },
        );
      const answers = [];
      for (let i = 0; i < 15; i++) answers.push(await clients[i % 2]!.shouldRateLimit(LOGIN));
      const ok = answers.filter((a) => a.overallCode === RateLimitResponse_Code.OK);
      assert.equal(ok.length, 10);
      assert.deepEqual(
        ok.map((a) => a.statuses[0]?.limitRemaining),
        [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
      );
    } finally {
      for (const client of clients) client.close();
      await Promise.all(instances.map((p) => stopSpillway(p)));
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
