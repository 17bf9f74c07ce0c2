// The limiters take time from Redis TIME only. Three "hosts" whose clocks are skewed by minutes
// (Date.now and performance.now patched in this process) share keys and see one consistent
// limiter: the same windows, the same counts. The only time in ARGV is each call's deadline, and
// it is on the Redis clock (learned from replies), so a skewed host's calls are never skipped.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Redis } from 'ioredis';
import type { Decision } from '../../src/core/decision.js';
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
import { connectRedis, redisTimeMs } from './connect-redis.js';

const SKEWS_MS = [-7 * 60_000, 0, 11 * 60_000];
const WINDOW_MS = 1_000_000_000; // aligned windows of ~11.6 days: no boundary during the run

/** Runs `fn` with this process's wall and monotonic clocks moved by `skewMs`, then restores them. */
async function withClockSkew<T>(skewMs: number, fn: () => Promise<T>): Promise<T> {
  const realDateNow = Date.now;
  const realPerformanceNow = performance.now.bind(performance);
  Date.now = () => realDateNow() + skewMs;
  Object.defineProperty(performance, 'now', {
    value: () => realPerformanceNow() + skewMs,
    configurable: true,
  });
  try {
    return await fn();
  } finally {
    Date.now = realDateNow;
    // Removes the own property; `now` resolves to Performance.prototype.now again.
    Reflect.deleteProperty(performance, 'now');
  }
}

describe('caller clocks are never used', {
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

  /** Where resetAtMs must fall, given Redis time before and after the calls. */
  type ResetRange = (d: Decision, redisBeforeMs: number, redisAfterMs: number) => [number, number];
  const windowEnd = (ms: number) => ms - (ms % WINDOW_MS) + WINDOW_MS;
  // name, factory, the exact ARGV every call must send, where resetAtMs must fall
  const algorithms: [string, (redis: RedisScriptClient) => RedisLimiter, (string | number)[], ResetRange][] =
    [
      [
        'fixed window',
        (redis) => createRedisFixedWindow({ redis, prefix: 'skew', limit: 9, windowMs: WINDOW_MS }),
        [9, WINDOW_MS, 1],
        (_d, beforeMs, afterMs) => [windowEnd(beforeMs), windowEnd(afterMs)],
      ],
      [
        'sliding log',
        (redis) => createRedisSlidingLog({ redis, prefix: 'skew', limit: 9, windowMs: 60_000 }),
        [9, 60_000, 1],
        // The newest entry leaves the window one window after it was added.
        (_d, beforeMs, afterMs) => [beforeMs + 60_000, afterMs + 60_000],
      ],
      [
        'sliding counter',
        (redis) => createRedisSlidingCounter({ redis, prefix: 'skew', limit: 9, windowMs: WINDOW_MS }),
        [9, WINDOW_MS, 1],
        (_d, beforeMs, afterMs) => [windowEnd(beforeMs) + WINDOW_MS, windowEnd(afterMs) + WINDOW_MS],
      ],
      [
        'token bucket',
        (redis) => createRedisTokenBucket({ redis, prefix: 'skew', capacity: 9, refillPerSec: 1e-3 }),
        [9, 1e-3, 1],
        // Full again after (capacity - remaining) / refillPerSec; one token takes 1e6 ms.
        (d, beforeMs, afterMs) => [beforeMs + (9 - d.remaining) * 1e6, afterMs + (9 - d.remaining) * 1e6],
      ],
    ];

  for (const [name, create, expectedArgs, resetRange] of algorithms) {
    it(`${name}: hosts skewed by -7 and +11 minutes share one consistent limit`, async () => {
      const sentArgs: (string | number)[][] = [];
      const adapter = ioredisAdapter(client);
      const recording: RedisScriptClient = {
        evalsha: (sha, keys, args) => {
          sentArgs.push(args);
          return adapter.evalsha(sha, keys, args);
        },
        eval: (script, keys, args) => {
          sentArgs.push(args);
          return adapter.eval(script, keys, args);
        },
      };
      // One limiter per "host", created and called under that host's clock.
      const hosts = await Promise.all(
        SKEWS_MS.map((skewMs) => withClockSkew(skewMs, async () => create(recording))),
      );
      const decisions: Decision[] = [];
      const redisBeforeMs = await redisTimeMs(client);
      for (let call = 0; call < 12; call++) {
        const host = call % hosts.length;
        decisions.push(await withClockSkew(SKEWS_MS[host]!, () => hosts[host]!.limit(name)));
      }
      const redisAfterMs = await redisTimeMs(client);

      assert.deepEqual(
        decisions.map((d) => d.allowed),
        [...Array(9).fill(true), false, false, false],
        'exactly the limit across all hosts, whatever their clocks',
      );
      assert.deepEqual(
        decisions.slice(0, 9).map((d) => Math.round(d.remaining)),
        [8, 7, 6, 5, 4, 3, 2, 1, 0],
      );
      assert.ok(
        decisions.every((d) => d.reason === undefined),
        'no call timed out or failed (a skewed clock must not look like a timeout)',
      );
      // Reset times are on the Redis clock to the millisecond: a caller clock would put them minutes off.
      for (const d of decisions) {
        const [lowMs, highMs] = resetRange(d, redisBeforeMs, redisAfterMs);
        assert.ok(
          d.resetAtMs >= lowMs - 1 && d.resetAtMs <= highMs + 1,
          `resetAtMs ${d.resetAtMs} outside [${lowMs}, ${highMs}] from Redis time`,
        );
      }
      // Every call sent the same configuration and cost. The deadline is 0 until a host's first
      // reply has shown it the Redis clock, then its timeout (100 ms) ahead of Redis time at the
      // send, plus the estimate's error (a round trip; 1 s allowed on a loaded machine) and margin
      // (5 ms): never minutes off.
      assert.ok(sentArgs.length >= 12, 'EVALSHA for each call, plus EVAL after the first NOSCRIPT');
      for (const args of sentArgs) assert.deepEqual(args.slice(0, 3), expectedArgs);
      const deadlines = sentArgs.map((args) => Number(args[3]));
      assert.ok(deadlines.filter((d) => d === 0).length <= 2 * hosts.length, `${deadlines}`);
      for (const deadlineMs of deadlines.filter((d) => d !== 0)) {
        assert.ok(
          deadlineMs >= redisBeforeMs + 100 && deadlineMs <= redisAfterMs + 100 + 5 + 1_000,
          `deadline ${deadlineMs} not on the Redis clock [${redisBeforeMs}, ${redisAfterMs}] + timeoutMs`,
        );
      }
      assert.ok(deadlines.filter((d) => d !== 0).length >= 12 - hosts.length, 'deadlines were sent');
      for (const host of hosts) assert.equal(host.stats.expired, 0);
    });
  }
});
