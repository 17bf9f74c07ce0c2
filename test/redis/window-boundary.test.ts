// The boundary burst: a fixed window admits 2 x limit across a window boundary within a span much
// shorter than a window; the sliding log never admits more than the limit in any window-length
// span; the sliding counter stays within its documented bound limit * (1 + span / window).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import type { Decision } from '../../src/core/decision.js';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  ioredisAdapter,
  type RedisLimiter,
} from '../../src/redis/index.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';
import { connectRedis, redisTimeMs, sleep } from './connect-redis.js';

const WINDOW_MS = 1000;
const LIMIT = 50;

describe('window boundary', { skip: !redisServerAvailable() && process.env.CI !== 'true' }, () => {
  let server: RedisServer;
  let client: Redis;
  before(async () => {
    server = await startRedis();
    client = await connectRedis(server);
  });
  after(async () => {
    client?.disconnect();
    await server?.stop();
  });

  const burst = (limiter: RedisLimiter, key: string): Promise<Decision[]> =>
    Promise.all(Array.from({ length: LIMIT }, () => limiter.limit(key)));

  it('fixed window admits 2 x limit across a boundary; the sliding log admits the limit', async (t) => {
    const redis = ioredisAdapter(client);
    // A loaded machine may stretch a burst across the boundary; such an attempt proves nothing and is retried.
    for (let attempt = 1; attempt <= 5; attempt++) {
      const prefix = `boundary-${attempt}`;
      const fixed = createRedisFixedWindow({
        redis,
        prefix,
        limit: LIMIT,
        windowMs: WINDOW_MS,
        timeoutMs: 5000,
      });
      const log = createRedisSlidingLog({
        redis,
        prefix,
        limit: LIMIT,
        windowMs: WINDOW_MS,
        timeoutMs: 5000,
      });
      const counter = createRedisSlidingCounter({
        redis,
        prefix,
        limit: LIMIT,
        windowMs: WINDOW_MS,
        timeoutMs: 5000,
      });

      // Aim the first burst ~150 ms before a boundary of the Redis clock's aligned windows.
      let leftMs = WINDOW_MS - ((await redisTimeMs(client)) % WINDOW_MS);
      if (leftMs < 250) {
        await sleep(leftMs + 5);
        leftMs = WINDOW_MS - ((await redisTimeMs(client)) % WINDOW_MS);
      }
      await sleep(leftMs - 150);

      const startMs = await redisTimeMs(client);
      const [fixed1, log1, counter1] = await Promise.all([
        burst(fixed, 'k'),
        burst(log, 'k'),
        burst(counter, 'k'),
      ]);
      const boundaryMs = fixed1[0]!.resetAtMs;
      await sleep(Math.max(0, boundaryMs - (await redisTimeMs(client))) + 10);
      const [fixed2, log2, counter2] = await Promise.all([
        burst(fixed, 'k'),
        burst(log, 'k'),
        burst(counter, 'k'),
      ]);
      const endMs = await redisTimeMs(client);
      const spanMs = endMs - startMs;

      const inOneWindow = (ds: Decision[], resetAtMs: number) => ds.every((d) => d.resetAtMs === resetAtMs);
      if (
        !inOneWindow(fixed1, boundaryMs) ||
        !inOneWindow(fixed2, boundaryMs + WINDOW_MS) ||
        spanMs >= WINDOW_MS
      ) {
        t.diagnostic(`attempt ${attempt}: bursts straddled a boundary or span ${spanMs} ms; retrying`);
        continue;
      }
      const admitted = (ds: Decision[]) => ds.filter((d) => d.allowed).length;
      t.diagnostic(
        `span ${spanMs} ms: fixed ${admitted(fixed1)}+${admitted(fixed2)}, log ${admitted(log1)}+${admitted(log2)}, ` +
          `counter ${admitted(counter1)}+${admitted(counter2)} (limit ${LIMIT})`,
      );
      assert.equal(
        admitted(fixed1) + admitted(fixed2),
        2 * LIMIT,
        'fixed window: 2 x limit within one window span',
      );
      assert.equal(admitted(log1), LIMIT);
      assert.equal(admitted(log2), 0, 'sliding log: nothing more within a window of the first burst');
      assert.equal(admitted(counter1), LIMIT);
      // Bound from docs/redis-limiters.md for a span of d <= window across one boundary: limit * (1 + d / window),
      // where d counts only the part after the boundary; the whole span bounds it from above.
      assert.ok(
        admitted(counter2) <= Math.floor((LIMIT * spanMs) / WINDOW_MS),
        `sliding counter admitted ${admitted(counter2)} after the boundary in a ${spanMs} ms span`,
      );
      assert.ok(admitted(counter2) < LIMIT / 2, 'the counter cuts the boundary burst');
      return;
    }
    assert.fail('could not place both bursts around one boundary in 5 attempts');
  });
});
