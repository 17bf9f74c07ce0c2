// What the limiters leave in Redis: every key has a TTL bounded by its algorithm's horizon, and
// all keys of one call share a {hash tag} (so the scripts run on Redis Cluster).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  ioredisAdapter,
  type RedisLimiter,
  type RedisScriptClient,
} from '../../src/redis/index.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';
import { connectRedis } from './connect-redis.js';

/** Redis Cluster's rule: the tag is between the first `{` and the first `}` after it, if non-empty. */
function hashTag(key: string): string {
  const open = key.indexOf('{');
  const close = open < 0 ? -1 : key.indexOf('}', open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : key;
}

async function scanAll(client: Redis, pattern: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await client.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return keys.sort();
}

const WINDOW_MS = 5000;
const algorithms: [string, string[], number, (redis: RedisScriptClient, prefix: string) => RedisLimiter][] = [
  [
    'fixed window',
    ['fw'],
    WINDOW_MS,
    (redis, prefix) => createRedisFixedWindow({ redis, prefix, limit: 3, windowMs: WINDOW_MS }),
  ],
  [
    'sliding log',
    ['sl'],
    WINDOW_MS,
    (redis, prefix) => createRedisSlidingLog({ redis, prefix, limit: 3, windowMs: WINDOW_MS }),
  ],
  [
    'sliding counter',
    ['sc'],
    2 * WINDOW_MS,
    (redis, prefix) => createRedisSlidingCounter({ redis, prefix, limit: 3, windowMs: WINDOW_MS }),
  ],
  // Empty to full at 1 token/s: the key is needed for at most capacity / refillPerSec = 3 s.
  [
    'token bucket',
    ['tb'],
    3000,
    (redis, prefix) => createRedisTokenBucket({ redis, prefix, capacity: 3, refillPerSec: 1 }),
  ],
];

describe('Redis limiter keys', { skip: !redisServerAvailable() && process.env.CI !== 'true' }, () => {
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

  it('invalid cost or key sends no command to Redis (INFO commandstats)', async () => {
    const scriptCalls = async () => {
      const info = await client.info('commandstats');
      return [...info.matchAll(/^cmdstat_(evalsha|eval):calls=(\d+)/gm)].reduce(
        (sum, m) => sum + Number(m[2]),
        0,
      );
    };
    const limiters = algorithms.map(([, , , create]) => create(ioredisAdapter(client), 'invalid'));
    const before = await scriptCalls();
    for (const limiter of limiters) {
      for (const cost of [-1, Number.NaN, Number.POSITIVE_INFINITY, 4])
        await assert.rejects(limiter.limit('k', cost));
      for (const key of ['', 'k'.repeat(513)]) await assert.rejects(limiter.limit(key));
    }
    assert.equal(await scriptCalls(), before);
    await limiters[0]!.limit('k');
    assert.ok((await scriptCalls()) > before, 'a valid call is counted, so the check can fail');
  });

  async function redisNowMs(): Promise<number> {
    const [sec, usec] = await client.time();
    return Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
  }

  it('fixed window and sliding counter expire exactly at an epoch-aligned window end (PEXPIRETIME)', async () => {
    const windowMs = 60_000;
    const fixed = createRedisFixedWindow({ redis: ioredisAdapter(client), prefix: 'at', limit: 5, windowMs });
    const sliding = createRedisSlidingCounter({
      redis: ioredisAdapter(client),
      prefix: 'at',
      limit: 5,
      windowMs,
    });
    for (let attempt = 0; attempt < 5; attempt++) {
      await client.del('at:{k}:fw', 'at:{k}:sc');
      const beforeMs = await redisNowMs();
      const windowStartMs = beforeMs - (beforeMs % windowMs);
      const decisions = [await fixed.limit('k'), await fixed.limit('k'), await sliding.limit('k')];
      const afterMs = await redisNowMs();
      if (afterMs - (afterMs % windowMs) !== windowStartMs) continue; // straddled a boundary: retry
      assert.equal(Number(await client.call('PEXPIRETIME', 'at:{k}:fw')), windowStartMs + windowMs);
      assert.equal(Number(await client.call('PEXPIRETIME', 'at:{k}:sc')), windowStartMs + 2 * windowMs);
      assert.deepEqual(
        decisions.map((d) => [d.remaining, d.resetAtMs]),
        [
          [4, windowStartMs + windowMs],
          [3, windowStartMs + windowMs],
          [4, windowStartMs + 2 * windowMs],
        ],
      );
      return;
    }
    assert.fail('every attempt straddled a window boundary');
  });

  it("fixed window: a count still visible from the previous window is restarted, this window's is kept", async () => {
    // Redis checks expiry at the script's start time and keeps a key alive through its expiry
    // millisecond, so the previous window's count can be read in the first moment of the next. The
    // count's sign tells the two apart. Such a key expires at this window's start and cannot be
    // planted visible, so the leftover here expires at this window's end: a wrong-sign key that
    // expires after it is a later window's (a clock stepped back, test/redis/clock-step.test.ts).
    const windowMs = 60_000;
    const limiter = createRedisFixedWindow({
      redis: ioredisAdapter(client),
      prefix: 'sign',
      limit: 10,
      windowMs,
    });
    for (let attempt = 0; attempt < 5; attempt++) {
      const beforeMs = await redisNowMs();
      const windowIndex = Math.floor(beforeMs / windowMs);
      const thisSign = windowIndex % 2 === 0 ? -1 : 1;
      await client.set('sign:{old}:fw', -thisSign * 7, 'PXAT', (windowIndex + 1) * windowMs);
      await client.set('sign:{cur}:fw', thisSign * 7, 'PX', 5 * windowMs);
      const old = await limiter.limit('old');
      const cur = await limiter.limit('cur');
      const afterMs = await redisNowMs();
      if (Math.floor(afterMs / windowMs) !== windowIndex) continue;
      assert.equal(old.remaining, 9, 'the leftover from the previous window is not counted');
      assert.equal(Number(await client.get('sign:{old}:fw')), thisSign);
      assert.equal(Number(await client.call('PEXPIRETIME', 'sign:{old}:fw')), (windowIndex + 1) * windowMs);
      assert.equal(cur.remaining, 2, "this window's count is kept");
      assert.equal(Number(await client.get('sign:{cur}:fw')), thisSign * 8);
      return;
    }
    assert.fail('every attempt straddled a window boundary');
  });

  it('rolling upgrade: keys in the previous layout (hashes) are carried over, not errors', async () => {
    const windowMs = 60_000;
    const fixed = createRedisFixedWindow({
      redis: ioredisAdapter(client),
      prefix: 'up',
      limit: 10,
      windowMs,
    });
    const bucket = createRedisTokenBucket({
      redis: ioredisAdapter(client),
      prefix: 'up',
      capacity: 10,
      refillPerSec: 0.001,
    });
    for (let attempt = 0; attempt < 5; attempt++) {
      const beforeMs = await redisNowMs();
      const windowStartMs = beforeMs - (beforeMs % windowMs);
      // What the previous scripts wrote: fw {w, c}; tb {tokens, ts (epoch microseconds)}.
      await client.hset('up:{k}:fw', 'w', windowStartMs, 'c', 6);
      await client.pexpire('up:{k}:fw', windowMs);
      await client.hset('up:{old}:fw', 'w', windowStartMs - windowMs, 'c', 6);
      await client.pexpire('up:{old}:fw', windowMs);
      await client.hset('up:{k}:tb', 'tokens', '2.5', 'ts', String(beforeMs * 1000));
      await client.pexpire('up:{k}:tb', 7_500_000);
      const counted = await fixed.limit('k');
      const previous = await fixed.limit('old');
      const peek = await bucket.limit('k', 0);
      const afterMs = await redisNowMs();
      if (afterMs - (afterMs % windowMs) !== windowStartMs) continue;
      assert.deepEqual(
        [counted.reason, counted.remaining],
        [undefined, 3],
        "this window's count carried over",
      );
      assert.deepEqual(
        [previous.reason, previous.remaining],
        [undefined, 9],
        "an older window's count is not",
      );
      assert.equal(peek.reason, undefined);
      assert.ok(peek.remaining >= 2.5 && peek.remaining < 2.51, `tokens carried over: ${peek.remaining}`);
      assert.equal(await client.type('up:{k}:fw'), 'string');
      assert.equal(await client.type('up:{k}:tb'), 'string', 'a peek rewrites the bucket in the new layout');
      const ttl = await client.pttl('up:{k}:tb');
      assert.ok(ttl > 7_000_000 && ttl <= 7_500_000, `bucket TTL kept: ${ttl}`);
      assert.equal(fixed.stats.errors + bucket.stats.errors, 0);
      return;
    }
    assert.fail('every attempt straddled a window boundary');
  });

  for (const [name, suffixes, maxTtlMs, create] of algorithms) {
    it(`${name}: every key written has a TTL no longer than ${maxTtlMs} ms`, async () => {
      const prefix = `ttl-${suffixes[0]}`;
      const limiter = create(ioredisAdapter(client), prefix);
      assert.equal((await limiter.limit('peek', 0)).allowed, true);
      assert.deepEqual(await scanAll(client, `${prefix}:*`), [], 'a peek on a fresh key writes nothing');
      const keysToCall = ['a', 'b', 'user:{7}', '}odd{'];
      for (const key of keysToCall) {
        for (let i = 0; i < 4; i++) await limiter.limit(key); // the 4th is rejected
      }
      const keys = await scanAll(client, `${prefix}:*`);
      assert.equal(keys.length, keysToCall.length * suffixes.length, keys.join(' '));
      for (const key of keys) {
        const ttl = await client.pttl(key);
        assert.ok(ttl > 0 && ttl <= maxTtlMs, `${key}: PTTL ${ttl}`);
      }
    });

    it(`${name}: all keys of one call share one hash tag, distinct per caller key`, async () => {
      const prefix = `tag-${suffixes[0]}`;
      const limiter = create(ioredisAdapter(client), prefix);
      const keysToCall = ['a', 'user:{7}', '}odd{', '{}', '%7D'];
      for (const key of keysToCall) await limiter.limit(key);
      const keys = await scanAll(client, `${prefix}:*`);
      const byTag = new Map<string, string[]>();
      for (const key of keys) {
        const tag = hashTag(key);
        assert.notEqual(tag, key, `${key} has a hash tag`);
        byTag.set(tag, [...(byTag.get(tag) ?? []), key]);
      }
      assert.equal(byTag.size, keysToCall.length, [...byTag.keys()].join(' '));
      for (const [tag, group] of byTag) {
        assert.deepEqual(
          group.map((k) => k.slice(`${prefix}:{${tag}}:`.length)).sort(),
          [...suffixes].sort(),
          `keys for tag ${tag}`,
        );
      }
      assert.ok(byTag.has('a') && byTag.has('user:%7B7%7D'), [...byTag.keys()].join(' '));
    });
  }
});
