// What each algorithm promises beyond the shared conformance suite: reset and retry times on the
// Redis clock, the sliding counter's weighting, and the token bucket's fractional refill.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  ioredisAdapter,
  type RedisScriptClient,
} from '../../src/redis/index.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';
import { connectRedis, redisTimeMs, sleep } from './connect-redis.js';

const TIMEOUT_MS = 5000;

describe('Redis limiter algorithms', { skip: !redisServerAvailable() && process.env.CI !== 'true' }, () => {
  let server: RedisServer;
  let client: Redis;
  let redis: RedisScriptClient;
  before(async () => {
    server = await startRedis();
    client = await connectRedis(server);
    redis = ioredisAdapter(client);
  });
  after(async () => {
    client?.disconnect();
    await server?.stop();
  });

  /** Waits until at least `neededMs` of the current aligned window is left on the Redis clock. */
  async function earlyInWindow(windowMs: number, neededMs: number): Promise<void> {
    const leftMs = windowMs - ((await redisTimeMs(client)) % windowMs);
    if (leftMs < neededMs) await sleep(leftMs + 5);
  }

  it('fixed window: resets at the aligned window end on the Redis clock; retryAfterMs reaches it', async () => {
    const windowMs = 1000;
    await earlyInWindow(windowMs, 700);
    const limiter = createRedisFixedWindow({
      redis,
      prefix: 'fw',
      limit: 2,
      windowMs,
      timeoutMs: TIMEOUT_MS,
    });
    const beforeMs = await redisTimeMs(client);
    const first = await limiter.limit('k');
    await limiter.limit('k');
    const rejected = await limiter.limit('k');
    const afterMs = await redisTimeMs(client);
    const windowEndMs = beforeMs - (beforeMs % windowMs) + windowMs;
    assert.equal(first.resetAtMs, windowEndMs);
    assert.equal(rejected.allowed, false);
    assert.equal(rejected.resetAtMs, windowEndMs);
    assert.ok(
      rejected.retryAfterMs >= windowEndMs - afterMs && rejected.retryAfterMs <= windowEndMs - beforeMs,
      `retryAfterMs ${rejected.retryAfterMs}`,
    );
    await sleep(rejected.retryAfterMs + 5);
    const again = await limiter.limit('k');
    assert.equal(again.allowed, true);
    assert.equal(again.remaining, 1);
    assert.equal(again.resetAtMs, windowEndMs + windowMs);
  });

  it('sliding log: retryAfterMs is when the oldest entry leaves; resetAtMs when the newest does', async () => {
    const windowMs = 600;
    const limiter = createRedisSlidingLog({ redis, prefix: 'sl', limit: 3, windowMs, timeoutMs: TIMEOUT_MS });
    const t0 = await redisTimeMs(client);
    await limiter.limit('k');
    await sleep(100);
    await limiter.limit('k');
    const third = await limiter.limit('k');
    const t1 = await redisTimeMs(client);
    const rejected = await limiter.limit('k');
    const t2 = await redisTimeMs(client);
    assert.equal(rejected.allowed, false);
    // The first entry was added in [t0, t1 - 100] and leaves one window later; the rejected call ran
    // in [t1, t2], so its retryAfterMs (rounded up) points into [t0 + 600, t1 + 500].
    assert.ok(
      t2 + rejected.retryAfterMs >= t0 + windowMs && t1 + rejected.retryAfterMs <= t1 - 100 + windowMs + 1,
      `retryAfterMs ${rejected.retryAfterMs} (t0 ${t0}, t1 ${t1}, t2 ${t2})`,
    );
    assert.ok(third.resetAtMs >= t0 + 100 + windowMs && third.resetAtMs <= t1 + windowMs + 1);
    await sleep(rejected.retryAfterMs / 2);
    assert.equal((await limiter.limit('k')).allowed, false, 'not at half the retry time');
    await sleep(rejected.retryAfterMs / 2 + 5);
    const admitted = await limiter.limit('k');
    assert.equal(admitted.allowed, true, 'admitted once the oldest entry left');
    assert.equal(admitted.remaining, 0);
  });

  it('sliding counter: the previous window weighs by its overlap', async () => {
    const windowMs = 60_000;
    const limit = 100;
    const limiter = createRedisSlidingCounter({
      redis,
      prefix: 'sc',
      limit,
      windowMs,
      timeoutMs: TIMEOUT_MS,
    });
    for (let attempt = 0; attempt < 3; attempt++) {
      await earlyInWindow(windowMs, 1000);
      const beforeMs = await redisTimeMs(client);
      const windowStartMs = beforeMs - (beforeMs % windowMs);
      // 80 admitted in the previous window, 10 so far in this one (estimate <= 90 wherever we are).
      await client.hset('sc:{k}:sc', 'w', windowStartMs, 'c', 10, 'p', 80);
      await client.pexpire('sc:{k}:sc', 2 * windowMs);
      const peek = await limiter.limit('k', 0);
      const afterMs = await redisTimeMs(client);
      if (afterMs - (afterMs % windowMs) !== windowStartMs) continue;
      const remainingAt = (nowMs: number) =>
        Math.floor(limit - (80 * (windowMs - (nowMs - windowStartMs))) / windowMs - 10);
      assert.ok(
        peek.remaining >= remainingAt(beforeMs) && peek.remaining <= remainingAt(afterMs),
        `remaining ${peek.remaining}, expected ${remainingAt(beforeMs)}..${remainingAt(afterMs)}`,
      );
      assert.equal(peek.resetAtMs, windowStartMs + 2 * windowMs, 'this window still weighs through the next');
      const take = await limiter.limit('k', peek.remaining);
      assert.equal(take.allowed, true);
      assert.equal(take.remaining, 0);
      const rejectBeforeMs = await redisTimeMs(client);
      const rejected = await limiter.limit('k', 1);
      const rejectAfterMs = await redisTimeMs(client);
      assert.equal(rejected.allowed, false);
      // Room for 1 when 80 * (60000 - e) / 60000 <= 100 - 10 - peek.remaining - 1.
      const room = limit - 10 - peek.remaining - 1;
      const dueMs = windowStartMs + windowMs - Math.floor((room * windowMs) / 80);
      assert.ok(
        rejectAfterMs + rejected.retryAfterMs >= dueMs && rejectBeforeMs + rejected.retryAfterMs <= dueMs,
        `retryAfterMs ${rejected.retryAfterMs} must point at ${dueMs} (asked in [${rejectBeforeMs}, ${rejectAfterMs}])`,
      );
      return;
    }
    assert.fail('could not stay inside one window');
  });

  it('sliding counter: admits again after retryAfterMs, and in full by resetAtMs', async () => {
    const windowMs = 1000;
    await earlyInWindow(windowMs, 800);
    const limiter = createRedisSlidingCounter({
      redis,
      prefix: 'sc2',
      limit: 3,
      windowMs,
      timeoutMs: TIMEOUT_MS,
    });
    for (let i = 0; i < 3; i++) assert.equal((await limiter.limit('k')).allowed, true);
    const rejected = await limiter.limit('k');
    assert.equal(rejected.allowed, false);
    assert.ok(rejected.retryAfterMs > 0);
    await sleep(rejected.retryAfterMs / 2);
    assert.equal((await limiter.limit('k')).allowed, false, 'not at half the retry time');
    await sleep(rejected.retryAfterMs / 2 + 5);
    const admitted = await limiter.limit('k');
    assert.equal(admitted.allowed, true, 'admitted after retryAfterMs');
    await sleep(admitted.resetAtMs - (await redisTimeMs(client)) + 5);
    for (let i = 0; i < 3; i++)
      assert.equal((await limiter.limit('k')).allowed, true, `call ${i + 1} after resetAtMs`);
  });

  it('token bucket: fractional refill and cost on the Redis clock', async () => {
    const limiter = createRedisTokenBucket({
      redis,
      prefix: 'tb',
      capacity: 4,
      refillPerSec: 10,
      timeoutMs: TIMEOUT_MS,
    });
    const t0 = await redisTimeMs(client);
    const first = await limiter.limit('k', 4);
    assert.equal(first.allowed, true);
    assert.ok(first.remaining >= 0 && first.remaining < 0.05, `remaining ${first.remaining}`);
    const rejected = await limiter.limit('k');
    const t1 = await redisTimeMs(client);
    assert.equal(rejected.allowed, false);
    assert.ok(
      rejected.retryAfterMs > 0 && rejected.retryAfterMs <= 100,
      `retryAfterMs ${rejected.retryAfterMs}`,
    );
    assert.ok(rejected.remaining > 0 || t1 === t0, 'fractional tokens are reported, not truncated');
    await sleep(250);
    const halfBeforeMs = await redisTimeMs(client);
    const half = await limiter.limit('k', 0.5);
    const t2 = await redisTimeMs(client);
    // Refilled 10/s since the first call (before t1; the half call came at least 250 ms after t1),
    // minus the 0.5 just taken.
    const low = (250 - 2) * 0.01 - 0.5;
    const high = Math.min(4, (t2 + 1 - t0) * 0.01) - 0.5;
    assert.equal(half.allowed, true);
    assert.ok(
      half.remaining >= low && half.remaining <= high,
      `remaining ${half.remaining} not in [${low}, ${high}]`,
    );
    assert.notEqual(half.remaining, Math.floor(half.remaining), 'a half token is kept');
    const fullInMs = ((4 - half.remaining) / 10) * 1000;
    assert.ok(
      half.resetAtMs >= halfBeforeMs + fullInMs - 1 && half.resetAtMs <= t2 + fullInMs + 1,
      `resetAtMs ${half.resetAtMs} is when the bucket is full again`,
    );
  });

  it('token bucket: a cost below a billionth is counted, not waved through by the rounding allowance', async () => {
    const tiny = createRedisTokenBucket({
      redis,
      prefix: 'tb-tiny',
      capacity: 2e-9,
      refillPerSec: 1e-12,
      timeoutMs: TIMEOUT_MS,
    });
    const allowed: boolean[] = [];
    for (let i = 0; i < 5; i++) allowed.push((await tiny.limit('k', 1e-9)).allowed);
    assert.deepEqual(allowed, [true, true, false, false, false]);
    // Refill slow enough that even seconds between the two calls (a loaded machine) refill less
    // than the cost: 1e-6 a second refilled 5e-10 in half a millisecond, and the test then failed.
    const drained = createRedisTokenBucket({
      redis,
      prefix: 'tb-drained',
      capacity: 1,
      refillPerSec: 1e-12,
      timeoutMs: TIMEOUT_MS,
    });
    assert.equal((await drained.limit('k', 1)).allowed, true);
    assert.equal(
      (await drained.limit('k', 5e-10)).allowed,
      false,
      'an empty bucket admits no cost, however small',
    );
  });

  it('refuses options whose derived times Redis cannot hold: a sliding log over 100,000, a refill past 2^53 ms', () => {
    assert.throws(
      () =>
        createRedisSlidingLog({ redis, prefix: 'sl', limit: 100_001, windowMs: 1000, timeoutMs: TIMEOUT_MS }),
      { code: 'ERR_SPILLWAY_INVALID_LIMIT' },
    );
    assert.throws(
      () =>
        createRedisTokenBucket({
          redis,
          prefix: 'tb',
          capacity: 1e12,
          refillPerSec: 1e-4,
          timeoutMs: TIMEOUT_MS,
        }),
      { code: 'ERR_SPILLWAY_INVALID_LIMIT', message: /the time to refill the bucket/ },
    );
  });
});
