import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  type SpillwayProcess,
  scrape,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { startUpstream } from './proxy-harness.js';

// The proxy as a data-plane host of the global limiter: a real controller and zone aggregator
// (processes, gRPC) and the proxy process in front of an upstream. Offered load is several times
// the limit; the assertion is on what the upstream received once the loop has closed.

const LIMIT_RPS = 20;
const INTERVAL_MS = 250;

describe('spillway proxy with the global limiter backend', { timeout: 90_000 }, () => {
  const started: SpillwayProcess[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'spillway-proxy-global-'));
  after(async () => {
    for (const p of started.reverse()) await stopSpillway(p, 3_000);
    rmSync(dir, { recursive: true, force: true });
  });

  it('enforces the controller limit end to end and answers 429 with RateLimit fields', async (t) => {
    let upstreamCount = 0;
    const upstream = await startUpstream((_req, res) => {
      upstreamCount++;
      res.end('ok');
    });
    t.after(upstream.close);
    const limitsPath = join(dir, 'limits.yaml');
    writeFileSync(
      limitsPath,
      `version: 1\nintervalMs: ${INTERVAL_MS}\nbuckets:\n  - template: "api:tenant=*"\n    limitRps: ${LIMIT_RPS}\n`,
    );
    const anyPort = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'];
    const controller = await startSpillway('controller', ['controller', '--config', limitsPath, ...anyPort]);
    started.push(controller);
    const aggregator = await startSpillway('aggregator', [
      'aggregator',
      '--zone',
      'z1',
      '--parent',
      controller.grpc!,
      '--interval-ms',
      String(INTERVAL_MS),
      ...anyPort,
    ]);
    started.push(aggregator);
    const rulesPath = join(dir, 'rules.yaml');
    writeFileSync(
      rulesPath,
      `version: 1
upstream:
  url: ${upstream.url}
backend:
  kind: global
  aggregators: [${aggregator.grpc}]
  zone: z1
  intervalMs: ${INTERVAL_MS}
buckets:
  - name: api
    key: "api:tenant={header:x-tenant}"
    limit: ${LIMIT_RPS}
    windowSec: 1
`,
    );
    const proxy = await startSpillway('proxy', ['proxy', '--config', rulesPath, ...anyPort]);
    started.push(proxy);
    const line = proxy.output.find((l) => l.includes('"listening"'))!;
    const base = `http://${(JSON.parse(line) as { proxy: string }).proxy}`;

    // Offer ~5x the limit from 8 keep-alive loops until told to stop.
    const agent = new Agent({ keepAlive: true, maxSockets: 8 });
    t.after(() => agent.destroy());
    const statuses: { atMs: number; status: number; retryAfter?: string; policy?: string }[] = [];
    let running = true;
    const one = () =>
      new Promise<void>((resolve) => {
        const req = request(`${base}/v1/items`, { agent, headers: { 'x-tenant': 'acme' } }, (res) => {
          res.resume();
          res.on('end', () => {
            statuses.push({
              atMs: performance.now(),
              status: res.statusCode ?? 0,
              retryAfter: res.headers['retry-after'] as string | undefined,
              policy: res.headers['ratelimit-policy'] as string | undefined,
            });
            resolve();
          });
        });
        req.on('error', () => resolve());
        req.end();
      });
    const loops = Array.from({ length: 8 }, async () => {
      while (running) {
        await one();
        await new Promise((resolve) => setTimeout(resolve, 60));
      }
    });
    try {
      // The controller sees offered load above the limit and sends a drop ratio down.
      await waitFor(
        'a 429 from the proxy',
        async () => (statuses.some((s) => s.status === 429) ? true : undefined),
        { timeoutMs: 30_000 },
      );
      const limited = statuses.find((s) => s.status === 429)!;
      assert.equal(limited.policy, `"api";q=${LIMIT_RPS};w=1`);
      assert.ok(Number(limited.retryAfter) >= 1, `Retry-After ${limited.retryAfter}`);
      // Let the loop settle, then measure what reached the upstream over 4 s.
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      const fromCount = upstreamCount;
      const fromMs = performance.now();
      const fromIndex = statuses.length;
      await new Promise((resolve) => setTimeout(resolve, 4_000));
      const admittedRps = (upstreamCount - fromCount) / ((performance.now() - fromMs) / 1000);
      const window = statuses.slice(fromIndex);
      const offeredRps = window.length / 4;
      assert.ok(
        offeredRps > 2 * LIMIT_RPS,
        `offered ${offeredRps.toFixed(1)} rps: not enough load to test the limit`,
      );
      assert.ok(
        admittedRps > LIMIT_RPS * 0.4 && admittedRps < LIMIT_RPS * 1.6,
        `admitted ${admittedRps.toFixed(1)} rps of offered ${offeredRps.toFixed(1)}, limit ${LIMIT_RPS}`,
      );
      process.stdout.write(
        `# global backend: offered ${offeredRps.toFixed(1)} rps, upstream received ${admittedRps.toFixed(1)} rps, limit ${LIMIT_RPS}\n`,
      );
    } finally {
      running = false;
      await Promise.all(loops);
    }
    const series = await scrape(proxy.ops);
    assert.ok((series.get('spillway_proxy_decisions_total{bucket="api",result="rejected"}') ?? 0) > 0);
    assert.ok(
      (series.get('spillway_offered_total{bucket="api:tenant=acme"}') ?? 0) > 0,
      'global limiter metrics exported',
    );
  });
});
