// The Lua scripts: SHA1s pinned and equal to what Redis computes, headers that name every KEYS[i]
// and ARGV[i], and EVALSHA recovering from a flushed script cache mid-run.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  fixedWindowScript,
  ioredisAdapter,
  type LuaScript,
  slidingCounterScript,
  slidingLogScript,
  tokenBucketScript,
} from '../../src/redis/index.js';
import { type RedisServer, redisServerAvailable, requireRedis, startRedis } from '../helpers/redis-server.js';
import { connectRedis } from './connect-redis.js';

const scriptsDir = new URL('../../src/redis/scripts/', import.meta.url);
const used: Record<string, LuaScript> = {
  'fixed-window': fixedWindowScript,
  'sliding-log': slidingLogScript,
  'sliding-counter': slidingCounterScript,
  'token-bucket': tokenBucketScript,
};
// Changing a script changes its SHA: servers then cache both versions, and anyone pinning SHAs
// (e.g. pre-loading with SCRIPT LOAD) must update. Update these pins deliberately, with a CHANGELOG line.
const pinned: Record<string, string> = {
  'fixed-window': '697bc99b3a02f099428c8dab67f0d2a9680dbb2e',
  'sliding-log': '602e1ca12a6d6cfe895c9cf72b3d601743a8c418',
  'sliding-counter': '7c5ef474ed804210d4ee523d321237b63763475b',
  'token-bucket': '5347473919d24110a035d25d24f2768bdbf80137',
};

describe('Lua script files', () => {
  it('every .lua file is used, and the SHA the code sends is the SHA1 of the file on disk', () => {
    const files = readdirSync(scriptsDir)
      .filter((f) => f.endsWith('.lua'))
      .map((f) => f.replace(/\.lua$/, ''))
      .sort();
    assert.deepEqual(files, Object.keys(used).sort());
    for (const [name, script] of Object.entries(used)) {
      const source = readFileSync(new URL(`${name}.lua`, scriptsDir), 'utf8');
      assert.equal(script.source, source, name);
      assert.equal(script.sha, createHash('sha1').update(source).digest('hex'), name);
      assert.equal(script.sha, pinned[name], `${name}: SHA changed; update the pin deliberately`);
    }
  });

  it('each header names every KEYS[i] and ARGV[i] the script uses, and the return value', () => {
    for (const [name, script] of Object.entries(used)) {
      const lines = script.source.split('\n');
      const headerEnd = lines.findIndex((line) => !line.startsWith('--'));
      const header = lines.slice(0, headerEnd).join('\n');
      const body = lines.slice(headerEnd).join('\n');
      const usedRefs = new Set(body.match(/\b(KEYS|ARGV)\[\d+\]/g));
      assert.ok(usedRefs.size > 0, name);
      for (const ref of usedRefs) {
        assert.match(header, new RegExp(`^-- ${ref.replace(/[[\]]/g, '\\$&')}\\s`, 'm'), `${name}: ${ref}`);
      }
      const documented = new Set(header.match(/^-- (KEYS|ARGV)\[\d+\]/gm)?.map((s) => s.slice(3)));
      assert.deepEqual([...documented].sort(), [...usedRefs].sort(), `${name}: header documents unused refs`);
      assert.match(header, /^-- Returns\s/m, `${name}: return value`);
      assert.match(body, /redis\.call\('TIME'\)/, `${name}: time comes from Redis`);
    }
  });
});

// Windows aligned to epoch multiples of ~11.6 days: a run never straddles a boundary, so counts are exact.
const WINDOW_MS = 1_000_000_000;

describe('Lua scripts on a real Redis', {
  skip: !redisServerAvailable() && process.env.CI !== 'true',
}, () => {
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

  it("SCRIPT LOAD answers each script's pinned SHA", async (t) => {
    if (!requireRedis(t)) return;
    const adapter = ioredisAdapter(client);
    for (const [name, script] of Object.entries(used)) {
      assert.equal(await adapter.scriptLoad?.(script.source), script.sha, name);
    }
  });

  it('sliding log: a member whose microsecond is taken gets a suffix, so none is lost (clock pinned)', async (t) => {
    if (!requireRedis(t)) return;
    // The same script with TIME pinned, as if the Redis clock stood still (or stepped back).
    const pinned = slidingLogScript.source.replace("redis.call('TIME')", "{'1700000000', '000042'}");
    assert.notEqual(pinned, slidingLogScript.source);
    const key = 'pinned:{k}:sl';
    const run = async (cost: number) => (await client.eval(pinned, 1, key, 10, 60_000, cost)) as number[];
    const replies = [await run(1), await run(1), await run(3), await run(1), await run(5)];
    assert.deepEqual(
      replies.map(([allowed, remaining]) => [allowed, remaining]),
      [
        [1, 9],
        [1, 8],
        [1, 5],
        [1, 4],
        [0, 4],
      ],
    );
    const base = '1700000000000042';
    assert.deepEqual((await client.zrange(key, 0, -1)).sort(), [
      base,
      `${base}-1`,
      `${base}-2`,
      `${base}-3`,
      `${base}-4`,
      `${base}-5`,
    ]);
  });

  it('token bucket: remaining keeps its fraction for very large capacities too', async (t) => {
    if (!requireRedis(t)) return;
    const redis = ioredisAdapter(client);
    const small = createRedisTokenBucket({ redis, capacity: 3, refillPerSec: 0.001, prefix: 'frac' });
    assert.equal((await small.limit('k', 0.25)).remaining, 2.75);
    const huge = createRedisTokenBucket({ redis, capacity: 1e12, refillPerSec: 0.001, prefix: 'frac-huge' });
    // 1e11 tokens at 0.001/s take 1e17 ms to come back: the TTL too must be sent as an integer.
    const decision = await huge.limit('k', 1e11 + 0.5);
    assert.equal(decision.reason, undefined, 'counted, not a fault');
    assert.equal(decision.allowed, true);
    assert.ok(Math.abs(decision.remaining - (9e11 - 0.5)) < 0.001, `remaining ${decision.remaining}`);
    assert.ok((await client.pttl('frac-huge:{k}:tb')) > 1e16);
  });

  it('SCRIPT FLUSH mid-run: calls keep deciding correctly and noscriptReloads counts the reload', async (t) => {
    if (!requireRedis(t)) return;
    const redis = ioredisAdapter(client);
    const limiters = {
      fixedWindow: createRedisFixedWindow({ redis, limit: 30, windowMs: WINDOW_MS, prefix: 'flush' }),
      slidingLog: createRedisSlidingLog({ redis, limit: 30, windowMs: WINDOW_MS, prefix: 'flush' }),
      slidingCounter: createRedisSlidingCounter({ redis, limit: 30, windowMs: WINDOW_MS, prefix: 'flush' }),
      tokenBucket: createRedisTokenBucket({ redis, capacity: 30, refillPerSec: 0.001, prefix: 'flush' }),
    };
    for (const [name, limiter] of Object.entries(limiters)) {
      for (const script of Object.values(used)) await redis.scriptLoad?.(script.source);
      const remaining: number[] = [];
      for (let i = 0; i < 10; i++) remaining.push(Math.floor((await limiter.limit(name)).remaining));
      assert.equal(limiter.stats.noscriptReloads, 0, `${name}: cached before the flush`);
      assert.equal(await client.script('FLUSH'), 'OK');
      for (let i = 0; i < 10; i++) remaining.push(Math.floor((await limiter.limit(name, 2)).remaining));
      const rejected = await limiter.limit(name, 2);
      assert.deepEqual(
        remaining,
        [29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0],
        name,
      );
      assert.equal(rejected.allowed, false, name);
      assert.equal(limiter.stats.noscriptReloads, 1, name);
      assert.equal(limiter.stats.errors + limiter.stats.timeouts, 0, name);
    }
  });
});
