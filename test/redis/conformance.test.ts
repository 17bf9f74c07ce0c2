// The shared limiter conformance suite, run against the four Redis limiters on a private
// redis-server in real time.
import { after, before, it } from 'node:test';
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
import { type ConformanceSubject, describeLimiterConformance } from '../conformance/limiter-conformance.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';
import { connectRedis, redisTimeMs, sleep } from './connect-redis.js';

// Real time: long enough that a loaded 2-core CI machine's late timers (tens of ms) cannot turn
// "a quarter of retryAfterMs early" into "already due"; short enough to keep the file at seconds.
const TIME_WINDOW_MS = 1000;
const ADVANCE_MARGIN_MS = 15;
// Generous: a loaded machine must not turn a slow reply into a fail-open decision.
const TIMEOUT_MS = 5000;

let server: RedisServer | undefined;
let client: Redis | undefined;
let redis: RedisScriptClient;
let subjectCount = 0;

/**
 * Windows of the fixed window and sliding counter are aligned on the Redis clock. A case whose
 * calls straddle a boundary would see a fresh window mid-case, so these subjects start each
 * limiter early in a window: at least 3/4 of a short window, or 5 s of a long one, ahead.
 */
async function awayFromBoundary(windowMs: number): Promise<void> {
  if (!client) throw new Error('redis client not connected');
  const neededMs = Math.min((windowMs * 3) / 4, 5000);
  const nowMs = await redisTimeMs(client);
  const leftMs = windowMs - (nowMs % windowMs);
  if (leftMs < neededMs) await sleep(leftMs + 5);
}

function redisSubject(
  name: string,
  create: (o: { limit: number; windowMs: number; prefix: string }) => RedisLimiter | Promise<RedisLimiter>,
  skip?: ConformanceSubject['skip'],
): ConformanceSubject {
  return {
    name,
    windowMs: TIME_WINDOW_MS,
    create: ({ limit, windowMs }) => create({ limit, windowMs, prefix: `conformance-${++subjectCount}` }),
    advance: (ms) => sleep(Math.ceil(ms) + ADVANCE_MARGIN_MS),
    ...(skip ? { skip } : {}),
  };
}

if (redisServerAvailable() || process.env.CI === 'true') {
  before(async () => {
    server = await startRedis();
    client = await connectRedis(server);
    redis = ioredisAdapter(client);
  });
  after(async () => {
    client?.disconnect();
    await server?.stop();
  });

  describeLimiterConformance(
    redisSubject('redis fixed window', async ({ limit, windowMs, prefix }) => {
      await awayFromBoundary(windowMs);
      return createRedisFixedWindow({ redis, prefix, limit, windowMs, timeoutMs: TIMEOUT_MS });
    }),
  );

  describeLimiterConformance(
    redisSubject('redis sliding log', ({ limit, windowMs, prefix }) =>
      createRedisSlidingLog({ redis, prefix, limit, windowMs, timeoutMs: TIMEOUT_MS }),
    ),
  );

  describeLimiterConformance(
    redisSubject(
      'redis sliding counter',
      async ({ limit, windowMs, prefix }) => {
        await awayFromBoundary(windowMs);
        return createRedisSlidingCounter({ redis, prefix, limit, windowMs, timeoutMs: TIMEOUT_MS });
      },
      {
        'decision-fields':
          'retryAfterMs may exceed one window: with the limit filled early in a window, those calls still weigh ' +
          '(scaled by the overlap) in the next one, e.g. 3 of 3 at the start of a 60 s window admit the next call ' +
          '20 s into the following window (~80 s); the fields are checked in test/redis/algorithms.test.ts',
        replenishes:
          'one window after the last admission the previous window still weighs (up to a whole call here): ' +
          'the estimate assumes uniform arrival, so the whole limit returns only by resetAtMs, up to two windows ' +
          'later; replenishment is tested in test/redis/algorithms.test.ts',
      },
    ),
  );

  describeLimiterConformance(
    redisSubject('redis token bucket', ({ limit, windowMs, prefix }) =>
      createRedisTokenBucket({
        redis,
        prefix,
        capacity: limit,
        refillPerSec: (limit * 1000) / windowMs,
        timeoutMs: TIMEOUT_MS,
      }),
    ),
  );
} else {
  it('redis limiter conformance', (t) => t.skip('redis-server is not installed'));
}
