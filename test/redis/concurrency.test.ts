// Atomicity under concurrency: hundreds of simultaneous calls over several connections admit
// exactly the limit, and same-millisecond bursts cannot slip through the sliding log.
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

// Aligned windows of ~11.6 days: the run never straddles a boundary, so "exactly the limit" is exact.
const LONG_WINDOW_MS = 1_000_000_000;

/**
 * The sliding log as it is often written: the member is the millisecond timestamp itself, so
 * requests in the same millisecond overwrite one another's member and are counted once.
 */
const NAIVE_SLIDING_LOG = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, now)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`;

describe('Redis limiters under concurrency', {
  skip: !redisServerAvailable() && process.env.CI !== 'true',
}, () => {
  let server: RedisServer;
  let clients: Redis[] = [];
  let adapters: RedisScriptClient[] = [];
  before(async () => {
    server = await startRedis();
    clients = await Promise.all(Array.from({ length: 5 }, () => connectRedis(server)));
    adapters = clients.map((c) => ioredisAdapter(c));
  });
  after(async () => {
    for (const c of clients) c.disconnect();
    await server?.stop();
  });

  const cases: [string, (redis: RedisScriptClient) => RedisLimiter][] = [
    [
      'sliding log',
      (redis) => createRedisSlidingLog({ redis, limit: 100, windowMs: 60_000, timeoutMs: 5000 }),
    ],
    [
      'fixed window',
      (redis) => createRedisFixedWindow({ redis, limit: 100, windowMs: LONG_WINDOW_MS, timeoutMs: 5000 }),
    ],
    [
      'sliding counter',
      (redis) => createRedisSlidingCounter({ redis, limit: 100, windowMs: LONG_WINDOW_MS, timeoutMs: 5000 }),
    ],
    [
      'token bucket',
      (redis) => createRedisTokenBucket({ redis, capacity: 100, refillPerSec: 0.0001, timeoutMs: 5000 }),
    ],
  ];
  for (const [name, create] of cases) {
    it(`${name}: 500 concurrent calls over 5 connections admit exactly 100`, async () => {
      // One limiter object per connection, as separate processes would have.
      const limiters = adapters.map(create);
      const decisions = await Promise.all(
        Array.from({ length: 500 }, (_, i) => limiters[i % limiters.length]!.limit(`concurrent:${name}`)),
      );
      assert.equal(decisions.filter((d) => d.reason !== undefined).length, 0, 'no fault decisions');
      assert.equal(decisions.filter((d) => d.allowed).length, 100);
      const remainings = decisions.filter((d) => d.allowed).map((d) => Math.floor(d.remaining));
      assert.deepEqual(
        remainings.sort((a, b) => a - b),
        Array.from({ length: 100 }, (_, i) => i),
        'each admitted call saw a distinct remaining count',
      );
    });
  }

  it('sliding log stores one unique member per admitted unit', async () => {
    const [client] = clients;
    const limiter = createRedisSlidingLog({
      redis: adapters[0]!,
      limit: 10,
      windowMs: 60_000,
      prefix: 'cost',
    });
    const allowed = [];
    for (const cost of [4, 4, 4, 2, 1, 0]) allowed.push((await limiter.limit('k', cost)).allowed);
    assert.deepEqual(allowed, [true, true, false, true, false, true]);
    const members = await client!.zrange('cost:{k}:sl', 0, -1);
    assert.equal(members.length, 10);
    assert.equal(new Set(members).size, 10);
  });

  it('same-millisecond burst: the naive ZADD now now over-admits, ours admits exactly the limit', async (t) => {
    const [client] = clients;
    const limit = 10;
    const burst = 300;
    // Redis runs these scripts back to back, many per millisecond.
    const naive = await Promise.all(
      Array.from({ length: burst }, (_, i) =>
        clients[i % clients.length]!.eval(NAIVE_SLIDING_LOG, 1, 'naive:{burst}', limit, 60_000),
      ),
    );
    const naiveAdmitted = naive.filter((r) => r === 1).length;
    t.diagnostic(`naive admitted ${naiveAdmitted} of ${burst} (limit ${limit})`);
    const naiveMembers = await client!.zcard('naive:{burst}');
    const limiters = adapters.map((redis) =>
      createRedisSlidingLog({ redis, limit, windowMs: 60_000, timeoutMs: 5000 }),
    );
    const ours = await Promise.all(
      Array.from({ length: burst }, (_, i) => limiters[i % limiters.length]!.limit('burst')),
    );
    const oursAdmitted = ours.filter((d) => d.allowed).length;

    assert.ok(
      naiveAdmitted > limit,
      `the naive log admitted ${naiveAdmitted} of ${burst} against a limit of ${limit} (${naiveMembers} members)`,
    );
    assert.ok(naiveMembers < naiveAdmitted, 'same-millisecond members collapsed into one');
    assert.equal(oursAdmitted, limit);
    assert.equal(await client!.zcard('spillway:{burst}:sl'), limit);
  });
});
