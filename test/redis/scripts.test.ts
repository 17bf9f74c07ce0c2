// The Lua scripts: SHA1s pinned and equal to what Redis computes, headers that name every KEYS[i]
// and ARGV[i], a call past its deadline touching nothing, and EVALSHA recovering from a flushed
// script cache mid-run.
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
import { connectRedis, redisTimeMs } from './connect-redis.js';

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
  'fixed-window': '62813ff3c3947039f67545a457bac83f1e8b9612',
  'sliding-log': 'cbaf1c93e3b43ef65979281ff0865d816396dc5f',
  'sliding-counter': 'f02b07315bab46dbd35bb9d76bec6b596a9b0151',
  'token-bucket': '1f49897c9f735a12fff65aafc17a340817237afc',
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

  it('past its deadline (ARGV[4], Redis time) a script reads and writes nothing and says so; on time it counts', async (t) => {
    if (!requireRedis(t)) return;
    // name, key, ARGV before the deadline (configuration, cost 1), and a key of the layout before
    // this one, which a call on time would rewrite (a rolling upgrade) and a late call must not.
    const cases: [string, string, (string | number)[], () => Promise<unknown>][] = [
      ['fixed-window', 'late:{k}:fw', [10, WINDOW_MS, 1], () => client.hset('late:{old}:fw', 'w', 0, 'c', 1)],
      ['sliding-log', 'late:{k}:sl', [10, 60_000, 1], async () => {}],
      ['sliding-counter', 'late:{k}:sc', [10, WINDOW_MS, 1], async () => {}],
      [
        'token-bucket',
        'late:{k}:tb',
        [10, 0.001, 1],
        () => client.hset('late:{old}:tb', 'tokens', 3, 'ts', 1),
      ],
    ];
    const scriptCalls = async () => {
      const info = await client.info('commandstats');
      return Object.fromEntries(
        [...info.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)].map((m) => [m[1], Number(m[2])]),
      );
    };
    for (const [name, key, args, writeOldLayout] of cases) {
      const source = used[name]!.source;
      const run = async (k: string, deadlineMs: number) =>
        ((await client.eval(source, 1, k, ...args, deadlineMs)) as number[]).map(Number);
      // No deadline (0) and a deadline ahead: counted, with Redis TIME in the reply.
      const beforeMs = await redisTimeMs(client);
      const counted = [await run(key, 0), await run(key, beforeMs + 10_000)];
      const afterMs = await redisTimeMs(client);
      for (const reply of counted) {
        assert.equal(reply.length, 5, name);
        assert.equal(reply[0], 1, `${name}: counted`);
        assert.ok(
          reply[4]! >= beforeMs * 1000 && reply[4]! < (afterMs + 1) * 1000,
          `${name}: now_us ${reply[4]}`,
        );
      }
      const dump = await client.dumpBuffer(key);
      await writeOldLayout();
      const oldKey = key.replace('{k}', '{old}');
      const oldDump = await client.dumpBuffer(oldKey);

      await client.config('RESETSTAT');
      const lateMs = (await redisTimeMs(client)) - 1;
      for (const k of [key, oldKey, 'late:{fresh}:x']) {
        const reply = await run(k, lateMs);
        assert.deepEqual(reply.slice(0, 4), [-1, 0, 0, 0], `${name} ${k}: expired`);
        assert.ok(reply[4]! > lateMs * 1000, `${name}: now_us ${reply[4]} past the deadline`);
      }
      const commands = await scriptCalls();
      assert.deepEqual(
        Object.keys(commands).sort(),
        ['eval', 'time'],
        `${name}: only TIME ran inside the script (${JSON.stringify(commands)})`,
      );
      // Three scripts, and the test's own TIME for lateMs.
      assert.deepEqual([commands.eval, commands.time], [3, 3 + 1], name);
      assert.deepEqual(await client.dumpBuffer(key), dump, `${name}: state unchanged`);
      assert.deepEqual(await client.dumpBuffer(oldKey), oldDump, `${name}: old layout not rewritten`);
      assert.equal(await client.exists('late:{fresh}:x'), 0);
      // The same call on time does count, so the checks above can fail.
      assert.equal((await run(key, (await redisTimeMs(client)) + 1_000))[0], 1);
      assert.notDeepEqual(await client.dumpBuffer(key), dump, `${name}: an on-time call writes`);
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
