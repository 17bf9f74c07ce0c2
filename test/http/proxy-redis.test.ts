import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { type RedisServer, requireRedis, startRedis } from '../helpers/redis-server.js';
import { metricValue, send, startTestProxy, startUpstream } from './proxy-harness.js';

describe('spillway proxy with the Redis backend', { timeout: 30_000 }, () => {
  let redis: RedisServer | undefined;
  after(async () => {
    await redis?.stop();
  });

  for (const algorithm of ['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket']) {
    it(`limits with ${algorithm} and fails open when Redis is gone`, async (t) => {
      if (!requireRedis(t)) return;
      redis ??= await startRedis();
      const upstream = await startUpstream();
      const proxy = await startTestProxy(
        upstream.url,
        `backend:
  kind: redis
  url: ${redis.url}
  algorithm: ${algorithm}
  timeoutMs: 200
  prefix: t-${algorithm}
buckets:
  - name: api
    key: "api:{client}"
    limit: 2
    windowSec: 60
`,
      );
      t.after(async () => {
        await proxy.close();
        await upstream.close();
      });
      // The connection is opened in the background; the first call may race it and fail open.
      let first = await send(`${proxy.base}/`);
      for (let i = 0; i < 50 && first.headers.ratelimit === undefined; i++) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        first = await send(`${proxy.base}/`);
      }
      assert.equal(first.status, 200);
      assert.equal(first.headers['ratelimit-policy'], '"api";q=2;w=60');
      let limited = await send(`${proxy.base}/`);
      if (limited.status === 200) limited = await send(`${proxy.base}/`);
      assert.equal(limited.status, 429);
      assert.ok(Number(limited.headers['retry-after']) >= 1);
      assert.equal(
        await metricValue(proxy.registry, 'spillway_proxy_decisions_total', {
          bucket: 'api',
          result: 'rejected',
        }),
        1,
      );
    });
  }

  it('admits with fail-open decisions (no RateLimit fields) while Redis is down', async (t) => {
    if (!requireRedis(t)) return;
    redis ??= await startRedis();
    const upstream = await startUpstream();
    const proxy = await startTestProxy(
      upstream.url,
      `backend:\n  kind: redis\n  url: ${redis.url}\n  timeoutMs: 100\nbuckets:\n  - name: api\n    limit: 1\n    windowSec: 60\n`,
    );
    t.after(async () => {
      await proxy.close();
      await upstream.close();
    });
    await redis.kill();
    for (let i = 0; i < 3; i++) {
      const response = await send(`${proxy.base}/`);
      assert.equal(response.status, 200);
      assert.equal(response.headers.ratelimit, undefined);
    }
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_decisions_total', {
        bucket: 'api',
        result: 'fail_open',
      }),
      3,
    );
    await redis.restart();
  });
});
