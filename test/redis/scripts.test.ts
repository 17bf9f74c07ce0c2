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
  'fixed-window': 'd302e63855427c9d97725277fd70f5d78f745ce6',
  'sliding-log': 'a817b5c5e4d0b8efe6843e692ffaf2ecfdf57bb0',
  'sliding-counter': 'c557959f9c6528988c7616197c6e0fa2817d5655',
  'token-bucket': 'a138b8e43ff543f48f2ff440c5f4b69f2bf0d187',
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
