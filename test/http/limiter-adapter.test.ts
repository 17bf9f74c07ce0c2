import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../../src/core/clock.js';
import type { Decision, SyncLimiter } from '../../src/core/decision.js';
import { createGlobalLimiter } from '../../src/global/global-limiter.js';
import { toEdgeLimiter } from '../../src/http/limiter-adapter.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';
import { createRedisFixedWindow } from '../../src/redis/redis-fixed-window.js';

const allowed: Decision = { allowed: true, limit: 1, remaining: 0, resetAtMs: 0, retryAfterMs: 0 };

describe('toEdgeLimiter', () => {
  it('keyed local limiters are sync and decide without a promise', () => {
    const clock = new ManualClock();
    for (const limiter of [
      createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, clock }),
      createKeyedGcra({ limit: 1, periodMs: 1000, burst: 1, clock }),
    ]) {
      const edge = toEdgeLimiter(limiter);
      assert.equal(edge.kind, 'sync');
      if (edge.kind !== 'sync') continue;
      assert.equal(edge.limit('k').allowed, true);
      assert.equal(edge.limit('k').allowed, false);
    }
  });

  it('the global limiter is sync', () => {
    const limiter = createGlobalLimiter({ reporterId: 'test', clients: [], scheduler: new ManualClock() });
    const edge = toEdgeLimiter(limiter);
    assert.equal(edge.kind, 'sync');
    if (edge.kind === 'sync') assert.equal(edge.limit('bucket').allowed, true);
  });

  it('Redis limiters are async', async () => {
    const redis = {
      evalsha: async () => [1, 4, 0, 0],
      eval: async () => [1, 4, 0, 0],
    };
    const limiter = createRedisFixedWindow({ redis, limit: 5, windowMs: 1000 });
    const edge = toEdgeLimiter(limiter);
    assert.equal(edge.kind, 'async');
    const result = edge.limit('k');
    assert.ok(result instanceof Promise);
    assert.equal((await result).remaining, 4);
  });

  it('an unknown limiter is async and a sync result is wrapped; { kind: sync } keeps it sync', async () => {
    const custom: SyncLimiter = { limit: () => allowed };
    const edge = toEdgeLimiter(custom);
    assert.equal(edge.kind, 'async');
    assert.deepEqual(await edge.limit('k'), allowed);
    const forced = toEdgeLimiter(custom, { kind: 'sync' });
    assert.equal(forced.kind, 'sync');
    assert.deepEqual(forced.limit('k'), allowed);
  });

  it('a sync throw from an unknown limiter becomes a rejection', async () => {
    const throwing: SyncLimiter = {
      limit: () => {
        throw new Error('bad key');
      },
    };
    await assert.rejects(toEdgeLimiter(throwing).limit('k') as Promise<Decision>, /bad key/);
  });

  it('rejects something that is not a limiter', () => {
    assert.throws(() => toEdgeLimiter({} as SyncLimiter), { code: 'ERR_SPILLWAY_INVALID_OPTION' });
  });
});
