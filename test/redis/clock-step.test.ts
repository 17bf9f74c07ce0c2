// The Redis clock stepping back (a failover to a replica whose clock is behind, an NTP step): TIME
// then reads earlier than the times earlier decisions stored. Each script must neither grant more
// than its limit from such state nor lock a key out for longer than the step.
//
// The sliding log, sliding counter and token bucket keep their times in the value, so each script
// is run with TIME pinned (the same source, `redis.call('TIME')` replaced by a literal): decisions
// at A, then at B = A - STEP_MS and later, exactly as a Redis whose clock stepped back would run
// them. Pinned times are a day ahead of the real clock so absolute expiries (PEXPIREAT) stay in
// the future. The fixed window keeps only a sign in its value and tells its window by the key's
// expiry, which Redis checks on its real clock; so its test writes, with plain commands, the key a
// Redis ahead of the real clock would have left, and calls the real limiter.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import {
  createRedisFixedWindow,
  ioredisAdapter,
  type LuaScript,
  slidingCounterScript,
  slidingLogScript,
  tokenBucketScript,
} from '../../src/redis/index.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';
import { connectRedis, redisTimeMs } from './connect-redis.js';

const STEP_MS = 60_000;
const DAY_MS = 86_400_000;

/** A script's reply at a pinned Redis time (epoch ms): {allowed, remaining, reset_at_ms, retry_after_ms}. */
async function runAt(
  client: Redis,
  script: LuaScript,
  atMs: number,
  key: string,
  args: (string | number)[],
): Promise<number[]> {
  const seconds = Math.floor(atMs / 1000);
  const micros = (atMs % 1000) * 1000;
  const source = script.source.replace("redis.call('TIME')", `{'${seconds}', '${micros}'}`);
  assert.notEqual(source, script.source);
  const reply = (await client.eval(source, 1, key, ...args, 0)) as number[];
  return reply.slice(0, 4).map(Number);
}

describe('Redis clock stepped back', { skip: !redisServerAvailable() && process.env.CI !== 'true' }, () => {
  let server: RedisServer;
  let client: Redis;
  /** B: the Redis time after the step, a minute-aligned instant a day ahead of the real clock. */
  let behindMs: number;
  before(async () => {
    server = await startRedis();
    client = await connectRedis(server);
    const realMs = await redisTimeMs(client);
    behindMs = realMs + DAY_MS - (realMs % 60_000);
  });
  after(async () => {
    client?.disconnect();
    await server?.stop();
  });

  it('token bucket: refill resumes from the first call after the step, never above the level', async () => {
    const key = 'step:{tb}:tb';
    const args = [10, 1]; // capacity 10, 1 token/s
    const aheadMs = behindMs + STEP_MS;
    assert.deepEqual(
      (await runAt(client, tokenBucketScript, aheadMs, key, [...args, 10])).slice(0, 2),
      [1, 0],
    );
    // Empty before the step, empty after it: nothing is refilled for the step.
    const atStep = await runAt(client, tokenBucketScript, behindMs, key, [...args, 1]);
    assert.deepEqual(atStep.slice(0, 2), [0, 0], 'no tokens appear from a step back');
    assert.equal(atStep[3], 1000, 'retry after one token refills');
    // 5 s after the step, 5 tokens have refilled: the key is not locked out until B reaches A.
    const later = await runAt(client, tokenBucketScript, behindMs + 5000, key, [...args, 1]);
    assert.deepEqual(later.slice(0, 2), [1, 4_000_000], `5 s after the step: ${later}`);
    // And never more than the real refill: 5 more tokens take 5 s, not a fresh bucket.
    const burst = await runAt(client, tokenBucketScript, behindMs + 5000, key, [...args, 5]);
    assert.deepEqual(burst.slice(0, 2), [0, 4_000_000]);
  });

  it('sliding log: entries scored ahead of the clock keep their ages, so they leave within a window', async () => {
    const key = 'step:{sl}:sl';
    const args = [3, 1000]; // limit 3 per 1000 ms
    const aheadMs = behindMs + STEP_MS;
    for (const atMs of [aheadMs - 900, aheadMs - 500, aheadMs]) {
      assert.equal((await runAt(client, slidingLogScript, atMs, key, [...args, 1]))[0], 1);
    }
    const atStep = await runAt(client, slidingLogScript, behindMs, key, [...args, 1]);
    assert.equal(atStep[0], 0, 'the three entries still count: nothing extra is granted');
    assert.equal(atStep[3], 100, `retry when the oldest (900 ms old) leaves, not after the step: ${atStep}`);
    assert.equal(atStep[2], behindMs + 1000, 'reset when the newest leaves');
    const oldestLeft = await runAt(client, slidingLogScript, behindMs + 100, key, [...args, 1]);
    assert.deepEqual(oldestLeft.slice(0, 2), [1, 0], 'room for exactly one once the oldest left');
    assert.equal((await runAt(client, slidingLogScript, behindMs + 100, key, [...args, 1]))[0], 0);
    assert.equal(await client.zcard(key), 3);
    assert.ok((await client.pttl(key)) <= 1000, 'the TTL is a window, not the step');
  });

  it('sliding counter: a window stored ahead of the clock counts as the current one, not a fresh start', async () => {
    const key = 'step:{sc}:sc';
    const args = [10, 60_000]; // limit 10 per 60 s
    // A is 1 s into its window; B, 30 s earlier, is 31 s into the window before it.
    const aheadMs = behindMs + 60_000 + 1000;
    const stepBackMs = behindMs + 31_000;
    assert.deepEqual(
      (await runAt(client, slidingCounterScript, aheadMs, key, [...args, 10])).slice(0, 2),
      [1, 0],
    );
    let admitted = 0;
    for (let i = 0; i < 10; i++)
      admitted += (await runAt(client, slidingCounterScript, stepBackMs, key, [...args, 1]))[0]!;
    assert.equal(admitted, 0, 'the 10 admitted just before the step still count');
    // The next window (B's clock reaching A's window): the 10 weigh as the previous window's.
    const nextWindowMs = behindMs + 60_000 + 6000;
    const next = await runAt(client, slidingCounterScript, nextWindowMs, key, [...args, 1]);
    assert.equal(next[0], 1, `10 x 54/60 = 9 weigh, room for 1: ${next}`);
    assert.equal((await runAt(client, slidingCounterScript, nextWindowMs, key, [...args, 1]))[0], 0);
    // The window after that: nothing from before the step weighs any more.
    const thirdMs = behindMs + 120_000 + 30_000;
    const third = await runAt(client, slidingCounterScript, thirdMs, key, [...args, 1]);
    // (600 - 1 x 30 - 1 x 60) / 60 = 8.5: room for 8 more.
    assert.deepEqual(third.slice(0, 2), [1, 8], `only the 1 of the last window weighs, by half: ${third}`);
  });

  it('sliding counter: both stored windows ahead of the clock count as the current one (the later one was weighed as the previous)', async () => {
    const key = 'step:{sc2}:sc';
    const args = [10, 60_000]; // limit 10 per 60 s
    // 5 admitted 1 s before a window boundary W and 5 just after it; then the clock steps back
    // 1 s, into the window before W, where all 10 are this window's or later.
    const boundaryMs = behindMs + 60_000;
    let admitted = 0;
    for (let i = 0; i < 5; i++)
      admitted += (await runAt(client, slidingCounterScript, boundaryMs - 1000, key, [...args, 1]))[0]!;
    for (let i = 0; i < 5; i++)
      admitted += (await runAt(client, slidingCounterScript, boundaryMs + 500, key, [...args, 1]))[0]!;
    assert.equal(admitted, 10);
    let afterStep = 0;
    for (let i = 0; i < 10; i++)
      afterStep += (await runAt(client, slidingCounterScript, boundaryMs - 500, key, [...args, 1]))[0]!;
    assert.equal(afterStep, 0, 'the 10 admitted in the last 1.5 s still count');
    // The clock past W again, 0.6 s in: the 10 weigh as the previous window's by 59.4/60.
    let backPast = 0;
    for (let i = 0; i < 10; i++)
      backPast += (await runAt(client, slidingCounterScript, boundaryMs + 600, key, [...args, 1]))[0]!;
    assert.equal(backPast, 0, 'and still count when the clock is past the boundary again');
  });

  it('fixed window: a count of a later window (its key expiring after this window) carries over, not a fresh window', async () => {
    const redis = ioredisAdapter(client);
    const windowMs = 1_000_000_000; // ~11.6 days: the test never straddles a real window boundary
    const limiter = createRedisFixedWindow({ redis, prefix: 'step', limit: 5, windowMs });
    const nowMs = await redisTimeMs(client);
    const windowStartMs = nowMs - (nowMs % windowMs);
    const resetAtMs = windowStartMs + windowMs;
    // What a Redis one window ahead leaves after admitting 5: the next window's sign and end.
    const nextIsEven = ((windowStartMs + windowMs) / windowMs) % 2 === 0;
    await client.set('step:{fw}:fw', nextIsEven ? -5 : 5);
    await client.pexpireat('step:{fw}:fw', resetAtMs + windowMs);
    const decisions = [];
    for (let i = 0; i < 5; i++) decisions.push(await limiter.limit('fw'));
    assert.deepEqual(
      decisions.map((d) => d.allowed),
      [false, false, false, false, false],
      'the 5 admitted before the step still count',
    );
    const first = decisions[0]!;
    assert.equal(first.remaining, 0);
    assert.equal(first.resetAtMs, resetAtMs, 'until the end of this window, which is before the step ends');
    assert.ok(first.retryAfterMs <= resetAtMs - nowMs, `retryAfterMs ${first.retryAfterMs}`);
    // Carried into this window with this window's expiry: the key is back to its usual form.
    assert.equal(Number(await client.get('step:{fw}:fw')), nextIsEven ? 5 : -5);
    assert.equal(await client.pexpiretime('step:{fw}:fw'), resetAtMs);
  });
});
