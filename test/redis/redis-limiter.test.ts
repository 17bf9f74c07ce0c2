// The call path shared by the Redis limiters, against a fake client (no server): validation before
// any command, per-call timeout, fail policies, insurance, throttled logging, NOSCRIPT fallback.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../../src/core/clock.js';
import type { Decision, SyncLimiter } from '../../src/core/decision.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  FAIL_CLOSED_RETRY_AFTER_MS,
  fixedWindowScript,
  ioredisAdapter,
  type RedisLimiter,
  type RedisLimiterCommonOptions,
  type RedisScriptClient,
  redisKey,
} from '../../src/redis/index.js';
import { createRecordingRedisClient, deferred, type RecordedCall } from './recording-redis-client.js';

type Factory = (o: RedisLimiterCommonOptions & { limit: number }) => RedisLimiter;

const factories: Record<string, Factory> = {
  'fixed window': (o) => createRedisFixedWindow({ ...o, windowMs: 1000 }),
  'sliding log': (o) => createRedisSlidingLog({ ...o, windowMs: 1000 }),
  'sliding counter': (o) => createRedisSlidingCounter({ ...o, windowMs: 1000 }),
  'token bucket': ({ limit, ...o }) => createRedisTokenBucket({ ...o, capacity: limit, refillPerSec: 1 }),
};

function code(c: string) {
  return (error: unknown) => isSpillwayError(error) && error.code === c;
}

/** Lets already-settled promise callbacks and the unhandled-rejection check run. */
async function flushMicrotasks(): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
  await new Promise((resolve) => setImmediate(resolve));
}

describe('Redis limiter validation happens before any Redis command', () => {
  it('rejects invalid limits, windows, capacities and rates at construction', () => {
    const redis = createRecordingRedisClient();
    const bad = [0, -1, Number.NaN, Number.POSITIVE_INFINITY, '10' as unknown as number];
    for (const value of bad) {
      assert.throws(
        () => createRedisFixedWindow({ redis, limit: value, windowMs: 1000 }),
        code(ErrorCode.InvalidLimit),
      );
      assert.throws(
        () => createRedisSlidingLog({ redis, limit: 10, windowMs: value }),
        code(ErrorCode.InvalidLimit),
      );
      assert.throws(
        () => createRedisSlidingCounter({ redis, limit: value, windowMs: 1000 }),
        code(ErrorCode.InvalidLimit),
      );
      assert.throws(
        () => createRedisTokenBucket({ redis, capacity: value, refillPerSec: 1 }),
        code(ErrorCode.InvalidLimit),
      );
      assert.throws(
        () => createRedisTokenBucket({ redis, capacity: 5, refillPerSec: value }),
        code(ErrorCode.InvalidLimit),
      );
    }
    // Window counters count whole requests in whole milliseconds.
    assert.throws(
      () => createRedisFixedWindow({ redis, limit: 1.5, windowMs: 1000 }),
      code(ErrorCode.InvalidLimit),
    );
    assert.throws(
      () => createRedisSlidingLog({ redis, limit: 10, windowMs: 0.5 }),
      code(ErrorCode.InvalidLimit),
    );
    assert.throws(
      () => createRedisSlidingCounter({ redis, limit: 2 ** 40, windowMs: 2 ** 20 }),
      code(ErrorCode.InvalidLimit),
    );
    // Fractional capacity and rate are fine for a token bucket.
    createRedisTokenBucket({ redis, capacity: 2.5, refillPerSec: 0.25 });
    assert.deepEqual(redis.calls, []);
  });

  it('rejects invalid common options at construction', () => {
    const redis = createRecordingRedisClient();
    const base = { redis, limit: 10, windowMs: 1000 };
    const invalid: Partial<RedisLimiterCommonOptions>[] = [
      { prefix: '' },
      { prefix: 'a{b' },
      { prefix: 'a}b' },
      { timeoutMs: 0 },
      { timeoutMs: Number.NaN },
      // Past what a Node timer holds: it would fire after 1 ms, in a loop.
      { timeoutMs: 2 ** 31 },
      { failPolicy: 'maybe' as 'open' },
      { maxKeyLength: 0 },
      { redis: {} as RedisScriptClient },
      { insurance: {} as SyncLimiter },
    ];
    for (const options of invalid) {
      assert.throws(
        () => createRedisFixedWindow({ ...base, ...options }),
        code(ErrorCode.InvalidOption),
        JSON.stringify(options),
      );
    }
    assert.deepEqual(redis.calls, []);
  });

  for (const [name, create] of Object.entries(factories)) {
    it(`${name}: invalid cost and key reject with a stable code and send nothing`, async () => {
      const redis = createRecordingRedisClient();
      const limiter = create({ redis, limit: 10, maxKeyLength: 16 });
      for (const cost of [
        -1,
        Number.NaN,
        Number.POSITIVE_INFINITY,
        Number.NEGATIVE_INFINITY,
        11,
        '1' as unknown as number,
      ]) {
        await assert.rejects(limiter.limit('k', cost), code(ErrorCode.InvalidCost), `cost ${cost}`);
      }
      for (const key of ['', 'x'.repeat(17), 42 as unknown as string, undefined as unknown as string]) {
        await assert.rejects(limiter.limit(key), code(ErrorCode.InvalidKey), `key ${String(key)}`);
      }
      assert.deepEqual(redis.calls, []);
      assert.equal(limiter.stats.calls, 0);
      await limiter.limit('x'.repeat(16), 10);
      assert.equal(redis.calls.length, 1, 'a valid call does reach the client');
    });
  }

  it('window counters reject fractional cost; the token bucket accepts it', async () => {
    const redis = createRecordingRedisClient();
    for (const name of ['fixed window', 'sliding log', 'sliding counter']) {
      const limiter = factories[name]!({ redis, limit: 10 });
      await assert.rejects(limiter.limit('k', 0.5), code(ErrorCode.InvalidCost), name);
    }
    assert.equal(redis.calls.length, 0);
    await factories['token bucket']!({ redis, limit: 10 }).limit('k', 0.5);
    assert.deepEqual(redis.calls[0]?.args, [10, 1, 0.5, 0]);
  });
});

describe('Redis limiter arguments and keys', () => {
  it('ARGV carries configuration, cost and a deadline that is 0 while the Redis clock is unknown', async () => {
    // The fake replies without Redis time, so no deadline can be put on the Redis clock: the
    // caller's clock is never sent, whatever it reads.
    const redis = createRecordingRedisClient();
    const clock = new ManualClock(1_700_000_000_000);
    const options = { redis, limit: 7, scheduler: clock };
    for (const create of Object.values(factories)) await create(options).limit('k', 3);
    clock.advance(3_600_000);
    for (const create of Object.values(factories)) await create(options).limit('k', 3);
    const args = redis.calls.map((c) => c.args);
    assert.deepEqual(args, [
      [7, 1000, 3, 0],
      [7, 1000, 3, 0],
      [7, 1000, 3, 0],
      [7, 1, 3, 0],
      [7, 1000, 3, 0],
      [7, 1000, 3, 0],
      [7, 1000, 3, 0],
      [7, 1, 3, 0],
    ]);
  });

  it('all keys of one call share a hash tag, whatever braces the caller key holds', () => {
    // Redis Cluster's rule: the tag is between the first `{` and the first `}` after it, if non-empty.
    const hashTag = (k: string) => {
      const open = k.indexOf('{');
      const close = open < 0 ? -1 : k.indexOf('}', open + 1);
      return close > open + 1 ? k.slice(open + 1, close) : k;
    };
    for (const key of ['user:1', '}x', '{a}', 'a{b}c', '%7B', '{}']) {
      const keys = ['fw', 'sl', 'sl:seq'].map((suffix) => redisKey('p', key, suffix));
      const tags = new Set(keys.map(hashTag));
      assert.equal(tags.size, 1, `${key}: ${keys.join(' ')}`);
      assert.ok(!keys.some((k) => hashTag(k) === k), `${key}: a tag exists`);
    }
    assert.notEqual(redisKey('p', '{', 'fw'), redisKey('p', '%7B', 'fw'), 'encoding is injective');
    assert.equal(redisKey('spillway', 'user:1', 'fw'), 'spillway:{user:1}:fw');
  });
});

/** A Redis client whose every call waits until the test settles it (`pending[i]`), in call order. */
function hungClient() {
  const pending: ReturnType<typeof deferred<unknown>>[] = [];
  const redis = createRecordingRedisClient(() => {
    const d = deferred<unknown>();
    pending.push(d);
    return d.promise;
  });
  return { redis, pending };
}

describe('Redis limiter faults', () => {
  it('a timeout resolves with fail-open, and the late rejection is swallowed', async () => {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisSlidingLog({
      redis,
      limit: 5,
      windowMs: 1000,
      timeoutMs: 50,
      scheduler: clock,
    });
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      let settled: Decision | undefined;
      const call = limiter.limit('k').then((d) => {
        settled = d;
        return d;
      });
      clock.advance(49);
      await flushMicrotasks();
      assert.equal(settled, undefined, 'not before the timeout');
      clock.advance(1);
      const decision = await call;
      assert.deepEqual(decision, {
        allowed: true,
        limit: 5,
        remaining: 0,
        resetAtMs: clock.nowMs(),
        retryAfterMs: 0,
        reason: 'fail-open',
        storeFault: 'timeout',
      });
      pending[0]!.reject(new Error('Connection is closed.'));
      await flushMicrotasks();
      assert.deepEqual(unhandled, []);
      assert.equal(clock.pendingTimers, 0);
      assert.deepEqual(
        { ...limiter.stats },
        {
          calls: 1,
          timeouts: 1,
          errors: 0,
          failOpen: 1,
          failClosed: 0,
          insurance: 0,
          noscriptReloads: 0,
          expired: 0,
        },
      );
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('a late successful reply after a timeout changes nothing', async () => {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisFixedWindow({
      redis,
      limit: 5,
      windowMs: 1000,
      failPolicy: 'closed',
      scheduler: clock,
    });
    const call = limiter.limit('k');
    clock.advance(100);
    const decision = await call;
    pending[0]!.resolve([1, 4, 0, 0]);
    await flushMicrotasks();
    assert.equal(decision.allowed, false);
    assert.equal(decision.reason, 'fail-closed');
    assert.equal(decision.storeFault, 'timeout');
    assert.equal(decision.retryAfterMs, FAIL_CLOSED_RETRY_AFTER_MS);
    assert.equal(limiter.stats.failClosed, 1);
  });

  it('an error reply resolves with fail-closed, and no timer outlives the timeout', async () => {
    const redis = createRecordingRedisClient(async () => {
      throw new Error('READONLY You cannot write against a read only replica.');
    });
    const clock = new ManualClock();
    const limiter = createRedisTokenBucket({
      redis,
      capacity: 5,
      refillPerSec: 1,
      failPolicy: 'closed',
      scheduler: clock,
    });
    const decision = await limiter.limit('k');
    assert.equal(decision.allowed, false);
    assert.equal(decision.reason, 'fail-closed');
    assert.equal(decision.storeFault, 'error');
    assert.equal(decision.resetAtMs, clock.nowMs() + FAIL_CLOSED_RETRY_AFTER_MS);
    // The shared deadline timer is not cancelled per call: it fires once, finds nothing in
    // flight and is not armed again.
    assert.ok(clock.pendingTimers <= 1, `${clock.pendingTimers} timers`);
    clock.advance(100);
    assert.equal(clock.pendingTimers, 0);
    assert.equal(limiter.stats.errors, 1);
    assert.equal(limiter.stats.timeouts, 0);
  });

  it('a malformed script reply is an error fault, not a decision', async () => {
    const redis = createRecordingRedisClient(async () => 'OK');
    const limiter = createRedisFixedWindow({ redis, limit: 5, windowMs: 1000, scheduler: new ManualClock() });
    const decision = await limiter.limit('k');
    assert.equal(decision.reason, 'fail-open');
    assert.equal(decision.storeFault, 'error');
  });

  it('with insurance, the local limiter decides while Redis is unreachable', async () => {
    const redis = createRecordingRedisClient(async () => {
      throw new Error('connect ECONNREFUSED');
    });
    const seen: [string, number | undefined][] = [];
    let left = 2;
    const insurance: SyncLimiter = {
      limit(key, cost) {
        seen.push([key, cost]);
        const allowed = left > 0;
        if (allowed) left--;
        return { allowed, limit: 2, remaining: left, resetAtMs: 0, retryAfterMs: allowed ? 0 : 500 };
      },
    };
    const limiter = createRedisSlidingCounter({
      redis,
      limit: 100,
      windowMs: 1000,
      failPolicy: 'closed',
      insurance,
      scheduler: new ManualClock(),
    });
    const decisions = [await limiter.limit('a'), await limiter.limit('a'), await limiter.limit('a', 3)];
    assert.deepEqual(
      decisions.map((d) => [d.allowed, d.reason, d.storeFault, d.retryAfterMs]),
      [
        [true, 'insurance', 'error', 0],
        [true, 'insurance', 'error', 0],
        [false, 'insurance', 'error', 500],
      ],
    );
    assert.deepEqual(seen, [
      ['a', 1],
      ['a', 1],
      ['a', 3],
    ]);
    assert.equal(limiter.stats.insurance, 3);
    assert.equal(limiter.stats.failClosed, 0);
  });

  it('an insurance limiter that throws falls back to the fail policy', async () => {
    const redis = createRecordingRedisClient(async () => {
      throw new Error('down');
    });
    const insurance: SyncLimiter = {
      limit() {
        throw new Error('cost too large for the insurance limit');
      },
    };
    const limiter = createRedisFixedWindow({
      redis,
      limit: 10,
      windowMs: 1000,
      insurance,
      scheduler: new ManualClock(),
    });
    const decision = await limiter.limit('k', 10);
    assert.equal(decision.reason, 'fail-open');
    assert.equal(limiter.stats.failOpen, 1);
    assert.equal(limiter.stats.insurance, 0);
  });

  it('logs faults at most once per 10 s, with the number suppressed', async () => {
    const redis = createRecordingRedisClient(async () => {
      throw new Error('down');
    });
    const clock = new ManualClock();
    const lines: { obj: Record<string, unknown>; msg: string }[] = [];
    const logger = {
      warn: (obj: object, msg: string) => lines.push({ obj: obj as Record<string, unknown>, msg }),
    };
    const limiter = createRedisFixedWindow({ redis, limit: 10, windowMs: 1000, logger, scheduler: clock });
    for (let i = 0; i < 50; i++) {
      await limiter.limit('k');
      clock.advance(100);
    }
    assert.equal(lines.length, 1);
    assert.equal(lines[0]?.obj.storeFault, 'error');
    assert.equal(lines[0]?.obj.err, 'down');
    assert.match(lines[0]!.msg, /fixed-window.*failed.*fail-open/);
    clock.advance(5000);
    await limiter.limit('k');
    assert.equal(lines.length, 2);
    assert.equal(lines[1]?.obj.suppressed, 49);
    assert.equal(limiter.stats.failOpen, 51);
  });

  it('NOSCRIPT falls back to EVAL with the script source and counts the reload', async () => {
    const sources: string[] = [];
    let cached = false;
    const calls: RecordedCall[] = [];
    const redis: RedisScriptClient = {
      evalsha: async (sha, keys, args) => {
        calls.push({ command: 'evalsha', keys, args });
        assert.equal(sha, fixedWindowScript.sha);
        if (!cached) throw new Error('NOSCRIPT No matching script. Please use EVAL.');
        return [1, 9, 0, 0];
      },
      eval: async (script, keys, args) => {
        calls.push({ command: 'eval', keys, args });
        sources.push(script);
        cached = true;
        return [1, 9, 0, 0];
      },
    };
    const limiter = createRedisFixedWindow({ redis, limit: 10, windowMs: 1000 });
    await limiter.limit('k');
    await limiter.limit('k');
    assert.deepEqual(
      calls.map((c) => c.command),
      ['evalsha', 'eval', 'evalsha'],
    );
    assert.deepEqual(sources, [fixedWindowScript.source]);
    assert.equal(limiter.stats.noscriptReloads, 1);
    assert.equal(limiter.stats.errors, 0);
  });
});

describe('Redis limiter deadlines (one shared timer)', () => {
  it('each call times out at its own deadline, however many are in flight', async () => {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisFixedWindow({
      redis,
      limit: 5,
      windowMs: 1000,
      timeoutMs: 50,
      scheduler: clock,
    });
    const settledAt: (number | undefined)[] = [undefined, undefined, undefined];
    const track = (i: number, call: Promise<Decision>) =>
      call.then((d) => {
        settledAt[i] = clock.nowMs();
        return d;
      });
    const startMs = clock.nowMs();
    const a = track(0, limiter.limit('a'));
    clock.advance(20);
    const b = track(1, limiter.limit('b'));
    clock.advance(10);
    const c = track(2, limiter.limit('c'));
    pending[1]!.resolve([1, 4, 0, 0]); // b answers in time
    await flushMicrotasks();
    assert.equal(clock.pendingTimers, 1, 'one timer for all calls in flight');
    clock.advance(19); // t = 49
    await flushMicrotasks();
    assert.deepEqual(settledAt, [undefined, startMs + 30, undefined]);
    clock.advance(1); // t = 50: a's deadline
    await flushMicrotasks();
    assert.deepEqual(settledAt, [startMs + 50, startMs + 30, undefined]);
    clock.advance(29); // t = 79
    await flushMicrotasks();
    assert.equal(settledAt[2], undefined, 'c is not timed out before its own deadline');
    clock.advance(1); // t = 80: c's deadline
    await flushMicrotasks();
    assert.equal(settledAt[2], startMs + 80);
    assert.equal((await a).storeFault, 'timeout');
    assert.equal((await b).reason, undefined);
    assert.equal((await c).storeFault, 'timeout');
    assert.equal(clock.pendingTimers, 0);
    assert.deepEqual(
      { timeouts: limiter.stats.timeouts, failOpen: limiter.stats.failOpen },
      { timeouts: 2, failOpen: 2 },
    );
  });

  it('a call made after an idle spell still gets its full timeout', async () => {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisSlidingCounter({
      redis,
      limit: 5,
      windowMs: 1000,
      timeoutMs: 50,
      scheduler: clock,
    });
    const first = limiter.limit('k');
    pending[0]!.resolve([1, 4, 0, 0]);
    await first;
    clock.advance(40); // the timer armed for the first call is still pending (due at 50)
    let settled = false;
    const second = limiter.limit('k').then((d) => {
      settled = true;
      return d;
    });
    clock.advance(10); // the old timer fires at 50; the second call's deadline is 90
    await flushMicrotasks();
    assert.equal(settled, false);
    clock.advance(39);
    await flushMicrotasks();
    assert.equal(settled, false);
    clock.advance(1);
    assert.equal((await second).storeFault, 'timeout');
  });

  it('NOSCRIPT after the timeout answered: no EVAL is sent, nothing is counted as a reload', async () => {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisTokenBucket({
      redis,
      capacity: 5,
      refillPerSec: 1,
      timeoutMs: 50,
      scheduler: clock,
    });
    const call = limiter.limit('k');
    clock.advance(50);
    assert.equal((await call).storeFault, 'timeout');
    pending[0]!.reject(new Error('NOSCRIPT No matching script. Please use EVAL.'));
    await flushMicrotasks();
    assert.deepEqual(
      redis.calls.map((c) => c.command),
      ['evalsha'],
      'the abandoned call sends no EVAL',
    );
    assert.equal(limiter.stats.noscriptReloads, 0);

    // Not abandoned: the same NOSCRIPT does fall back, so the check above can fail.
    const live = limiter.limit('k');
    pending[1]!.reject(new Error('NOSCRIPT No matching script. Please use EVAL.'));
    await flushMicrotasks();
    assert.deepEqual(
      redis.calls.map((c) => c.command),
      ['evalsha', 'evalsha', 'eval'],
    );
    pending[2]!.resolve([1, 4_000_000, 0, 0]);
    const decision = await live;
    assert.equal(decision.remaining, 4, 'token bucket replies millionths');
    assert.equal(limiter.stats.noscriptReloads, 1);
  });
});

describe('Redis limiter deadlines on the Redis clock', () => {
  // The fake Redis clock runs 250 s ahead of the caller's: what is sent must be in Redis time.
  const SKEW_MS = 250_000;
  const MARGIN_MS = 5;

  function setUp() {
    const { redis, pending } = hungClient();
    const clock = new ManualClock();
    const limiter = createRedisFixedWindow({
      redis,
      limit: 5,
      windowMs: 1000,
      timeoutMs: 50,
      scheduler: clock,
    });
    /** Redis TIME in microseconds for a script that ran `agoMs` before the caller's now. */
    const redisUs = (agoMs = 0) => (clock.nowMs() - agoMs + SKEW_MS) * 1000;
    const deadlineSent = (i: number) => redis.calls[i]!.args[3] as number;
    return { redis, pending, clock, limiter, redisUs, deadlineSent };
  }

  it('sends no deadline before a reply has shown the Redis clock, then the caller deadline in Redis time', async () => {
    const { pending, clock, limiter, redisUs, deadlineSent } = setUp();
    const first = limiter.limit('k');
    assert.equal(deadlineSent(0), 0, 'Redis clock unknown: no deadline');
    clock.advance(2); // the script ran 1 ms after the send, its reply is seen 1 ms later
    pending[0]!.resolve([1, 4, 0, 0, redisUs(1)]);
    assert.equal((await first).reason, undefined);

    clock.advance(10);
    const sentMs = clock.nowMs();
    const second = limiter.limit('k');
    // The caller stops waiting at sentMs + 50, which is sentMs + 50 + SKEW_MS on the Redis clock.
    // The estimate may be higher by the sample's send leg (its round trip 2 ms, less the 1 ms
    // from TIME to receipt) plus the margin, never lower.
    const callerGivesUpRedisMs = sentMs + 50 + SKEW_MS;
    assert.ok(deadlineSent(1) >= callerGivesUpRedisMs, `${deadlineSent(1)} >= ${callerGivesUpRedisMs}`);
    assert.equal(deadlineSent(1), callerGivesUpRedisMs + 1 + MARGIN_MS);
    pending[1]!.resolve([1, 3, 0, 0, redisUs()]);
    assert.equal((await second).remaining, 3);
    assert.equal(limiter.stats.expired, 0);
  });

  it('an "expired" reply after the timeout answered changes nothing and sends nothing more', async () => {
    const { redis, pending, clock, limiter, redisUs } = setUp();
    const warm = limiter.limit('k');
    pending[0]!.resolve([1, 4, 0, 0, redisUs()]);
    await warm;
    const call = limiter.limit('k');
    clock.advance(50);
    const decision = await call;
    assert.deepEqual([decision.reason, decision.storeFault], ['fail-open', 'timeout']);
    clock.advance(2_000); // Redis resumes from a pause and runs the call: past its deadline
    pending[1]!.resolve([-1, 0, 0, 0, redisUs()]);
    await flushMicrotasks();
    assert.equal(redis.calls.length, 2, 'no retry for a call already answered');
    assert.deepEqual(
      { ...limiter.stats },
      {
        calls: 2,
        timeouts: 1,
        errors: 0,
        failOpen: 1,
        failClosed: 0,
        insurance: 0,
        noscriptReloads: 0,
        expired: 1,
      },
    );
  });

  it('an "expired" reply while the caller still waits (Redis clock stepped forward) is retried once, with the corrected deadline', async () => {
    const { redis, pending, clock, limiter, redisUs, deadlineSent } = setUp();
    const warm = limiter.limit('k');
    pending[0]!.resolve([1, 4, 0, 0, redisUs()]);
    await warm;
    const sentMs = clock.nowMs();
    const call = limiter.limit('k');
    assert.equal(deadlineSent(1), sentMs + 50 + SKEW_MS + MARGIN_MS);
    clock.advance(3);
    // The Redis clock jumped 60 s ahead: by it, the call is past its deadline although on time.
    pending[1]!.resolve([-1, 0, 0, 0, redisUs() + 60_000_000]);
    await flushMicrotasks();
    assert.equal(redis.calls.length, 3, 'sent again');
    assert.ok(
      deadlineSent(2) >= sentMs + 50 + SKEW_MS + 60_000,
      `retry deadline ${deadlineSent(2)} on the new clock`,
    );
    assert.ok(deadlineSent(2) <= sentMs + 50 + SKEW_MS + 60_000 + 3 + MARGIN_MS);
    clock.advance(1);
    pending[2]!.resolve([1, 3, 0, 0, redisUs() + 60_000_000]);
    const decision = await call;
    assert.deepEqual([decision.allowed, decision.reason, decision.remaining], [true, undefined, 3]);
    assert.deepEqual([limiter.stats.expired, limiter.stats.timeouts], [1, 0]);
  });

  it('a retried call that expires again is a timeout at once: one retry per call', async () => {
    const { redis, pending, clock, limiter, redisUs } = setUp();
    const warm = limiter.limit('k');
    pending[0]!.resolve([1, 4, 0, 0, redisUs()]);
    await warm;
    let settledAtMs: number | undefined;
    const call = limiter.limit('k').then((d) => {
      settledAtMs = clock.nowMs();
      return d;
    });
    clock.advance(1);
    pending[1]!.resolve([-1, 0, 0, 0, redisUs() + 60_000_000]);
    await flushMicrotasks();
    clock.advance(1);
    pending[2]!.resolve([-1, 0, 0, 0, redisUs() + 120_000_000]);
    const decision = await call;
    assert.deepEqual([decision.reason, decision.storeFault], ['fail-open', 'timeout']);
    assert.equal(settledAtMs, clock.nowMs(), 'answered when the second "expired" came, not at the timeout');
    assert.equal(redis.calls.length, 3);
    assert.deepEqual([limiter.stats.expired, limiter.stats.timeouts, limiter.stats.failOpen], [2, 1, 1]);
  });

  it('the deadline of an EVAL after NOSCRIPT is the one the EVALSHA carried', async () => {
    const { redis, pending, limiter, redisUs, deadlineSent } = setUp();
    const warm = limiter.limit('k');
    pending[0]!.resolve([1, 4, 0, 0, redisUs()]);
    await warm;
    const call = limiter.limit('k');
    pending[1]!.reject(new Error('NOSCRIPT No matching script. Please use EVAL.'));
    await flushMicrotasks();
    assert.deepEqual(
      redis.calls.map((c) => c.command),
      ['evalsha', 'evalsha', 'eval'],
    );
    assert.ok(deadlineSent(1) > 0);
    assert.equal(deadlineSent(2), deadlineSent(1));
    pending[2]!.resolve([1, 3, 0, 0, redisUs()]);
    assert.equal((await call).remaining, 3);
  });

  it('a first element other than 1, 0 or -1 with the time is a malformed reply (error fault)', async () => {
    const { pending, limiter, redisUs } = setUp();
    const call = limiter.limit('k');
    pending[0]!.resolve([2, 4, 0, 0, redisUs()]);
    assert.deepEqual([(await call).reason, (await call).storeFault], ['fail-open', 'error']);
    const fourNoTime = limiter.limit('k');
    pending[1]!.resolve([-1, 0, 0, 0]);
    assert.equal(
      (await fourNoTime).storeFault,
      'error',
      '"expired" without the Redis time is not a script reply',
    );
  });
});

describe('ioredisAdapter', () => {
  it('passes keys and arguments as EVALSHA/EVAL expect, and offers scriptLoad only off Cluster', async () => {
    const sent: unknown[][] = [];
    const fake = {
      isCluster: false,
      evalsha: async (...args: unknown[]) => sent.push(['evalsha', ...args]),
      eval: async (...args: unknown[]) => sent.push(['eval', ...args]),
      script: async (...args: unknown[]) => {
        sent.push(['script', ...args]);
        return 'abc';
      },
    };
    const adapter = ioredisAdapter(fake as unknown as Parameters<typeof ioredisAdapter>[0]);
    await adapter.evalsha('sha', ['k1', 'k2'], [1, 'x']);
    await adapter.eval('return 1', ['k1'], [2]);
    assert.equal(await adapter.scriptLoad?.('return 1'), 'abc');
    assert.deepEqual(sent, [
      ['evalsha', 'sha', 2, 'k1', 'k2', 1, 'x'],
      ['eval', 'return 1', 1, 'k1', 2],
      ['script', 'LOAD', 'return 1'],
    ]);
    const cluster = ioredisAdapter({ ...fake, isCluster: true } as unknown as Parameters<
      typeof ioredisAdapter
    >[0]);
    assert.equal(cluster.scriptLoad, undefined);
  });
});
