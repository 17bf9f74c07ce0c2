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
    ['sl', 'sl:seq'],
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
