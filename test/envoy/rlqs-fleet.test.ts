import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { status } from '@grpc/grpc-js';
import { seededRandom } from '../../src/core/clock.js';
import {
  type SpillwayProcess,
  scrape,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { createRlqsClient, openRlqsStream, type RlqsStream } from './rlqs-client.js';
import { SimEnvoy } from './sim-envoy.js';

// RLQS across real processes: a controller and a zone aggregator reading the envoyproxy/ratelimit
// file, two `spillway rls` processes, and a dozen Envoys on gRPC streams (six on each), each
// enforcing its own assignment as Envoy's filter does (sim-envoy.ts), offered 3x the limit in all.

const LIMIT_RPS = 300;
const ENVOY_RPS = 75;
const CONFIG = `
domain: mesh
descriptors:
  - key: route
    value: checkout
    rate_limit: { unit: second, requests_per_unit: ${LIMIT_RPS} }
`;

describe('RLQS fleet: controller, aggregator, two spillway rls, twelve Envoy streams', {
  timeout: 180_000,
}, () => {
  const started: SpillwayProcess[] = [];
  let dir = '';
  const envoys: { envoy: SimEnvoy; stream: RlqsStream }[] = [];
  const clients: ReturnType<typeof createRlqsClient>[] = [];
  let ticker: NodeJS.Timeout | undefined;

  const allowedBy = (list: { envoy: SimEnvoy }[]) => list.reduce((sum, e) => sum + e.envoy.allowed, 0);
  /** Allowed per second by `list` over `ms` of real time. */
  const measure = async (list: { envoy: SimEnvoy }[], ms: number) => {
    const before = allowedBy(list);
    const startedMs = performance.now();
    await waitFor(
      `${ms} ms of traffic`,
      async () => (performance.now() - startedMs >= ms ? true : undefined),
      {
        timeoutMs: ms + 5_000,
      },
    );
    return (allowedBy(list) - before) / ((performance.now() - startedMs) / 1000);
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-rlqs-'));
    const config = join(dir, 'ratelimit.yaml');
    writeFileSync(config, CONFIG);
    const quiet = ['--log-level', 'warn'];
    const controller = await startSpillway('controller', [
      'controller',
      ...['--config', config, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', ...quiet],
    ]);
    started.push(controller);
    const aggregator = await startSpillway('aggregator', [
      'aggregator',
      ...[
        '--zone',
        'z1',
        '--parent',
        controller.grpc!,
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        ...quiet,
      ],
    ]);
    started.push(aggregator);
    for (const n of [1, 2]) {
      const rls = await startSpillway(`rls-${n}`, [
        'rls',
        ...['--config', config, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--id', `rls-${n}`],
        ...['--aggregator', aggregator.grpc!, '--zone', 'z1', ...quiet],
      ]);
      started.push(rls);
      clients.push(createRlqsClient(rls.grpc!));
    }
    const random = seededRandom(5);
    for (let i = 0; i < 12; i++) {
      let envoy: SimEnvoy | undefined;
      const stream = openRlqsStream(clients[i % 2]!, (response) => envoy?.onResponse(response));
      envoy = new SimEnvoy(
        {
          domain: 'mesh',
          bucket: { route: 'checkout' },
          rps: ENVOY_RPS,
          reportIntervalMs: 1000,
          random,
          send: (r) => stream.send(r),
        },
        performance.now(),
      );
      envoys.push({ envoy, stream });
    }
    ticker = setInterval(() => {
      const nowMs = performance.now();
      for (const { envoy } of envoys) envoy.advance(nowMs);
    }, 10);
  });

  after(async () => {
    clearInterval(ticker);
    for (const { stream } of envoys) stream.cancel();
    for (const client of clients) client.close();
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    rmSync(dir, { recursive: true, force: true });
  });

  it('the dozen Envoys admit within 5% of the limit in total', async (t) => {
    await waitFor(
      'every Envoy to run a token bucket assignment',
      async () => (envoys.every(({ envoy }) => envoy.assignmentsApplied >= 2) ? true : undefined),
      { timeoutMs: 30_000 },
    );
    // Converged: two 5 s readings in a row within 5%, then the measured one.
    let inBand = 0;
    await waitFor(
      'the fleet to settle on the limit',
      async () => {
        const rate = await measure(envoys, 5_000);
        inBand = Math.abs(rate - LIMIT_RPS) <= 0.05 * LIMIT_RPS ? inBand + 1 : 0;
        return inBand >= 2 ? true : undefined;
      },
      { timeoutMs: 60_000, everyMs: 0 },
    );
    const rate = await measure(envoys, 20_000);
    t.diagnostic(`12 Envoys admit ${rate.toFixed(1)}/s, limit ${LIMIT_RPS}/s`);
    assert.ok(Math.abs(rate - LIMIT_RPS) <= 0.05 * LIMIT_RPS, `12 Envoys admit ${rate.toFixed(1)}/s`);
    const series = await scrape(started[2]!.ops);
    assert.equal(series.get('spillway_rlqs_streams'), 6);
  });

  it('Envoys that vanish give their share back to the others', async (t) => {
    const gone = envoys.slice(0, 4);
    const stay = envoys.slice(4);
    for (const { envoy, stream } of gone) {
      envoy.rps = 0;
      stream.cancel();
    }
    await Promise.all(gone.map(({ stream }) => stream.ended));
    await waitFor(
      'the 8 left to take the whole limit',
      async () => {
        const rate = await measure(stay, 3_000);
        return Math.abs(rate - LIMIT_RPS) <= 0.05 * LIMIT_RPS ? true : undefined;
      },
      { timeoutMs: 60_000, everyMs: 0 },
    );
    const rate = await measure(stay, 15_000);
    t.diagnostic(`8 Envoys admit ${rate.toFixed(1)}/s, limit ${LIMIT_RPS}/s`);
    assert.ok(Math.abs(rate - LIMIT_RPS) <= 0.05 * LIMIT_RPS, `the 8 left admit ${rate.toFixed(1)}/s`);
    const series = await scrape(started[2]!.ops);
    assert.equal(series.get('spillway_rlqs_streams'), 4);
  });

  it('malformed bytes end a stream with INVALID_ARGUMENT; the others keep their assignments', async () => {
    const bad = openRlqsStream(clients[0]!, () => {});
    bad.sendRaw(Buffer.from([0x12, 0xff, 0xff]));
    const { code, details } = await bad.ended;
    assert.equal(code, status.INVALID_ARGUMENT);
    assert.match(details, /malformed RateLimitQuotaUsageReports/);
    const before = envoys.slice(4).map(({ envoy }) => envoy.allowed);
    await measure(envoys.slice(4), 2_000);
    envoys.slice(4).forEach(({ envoy }, i) => {
      assert.ok(envoy.allowed > before[i]!, 'still admitting');
    });
  });
});
