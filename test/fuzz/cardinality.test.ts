import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { createGlobalLimiter } from '../../src/global/global-limiter.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';

// A cardinality attack: a million distinct keys (one per request, as a client rotating an API key
// or a header would send) through the by-key APIs. Memory must stay bounded by the tables' caps,
// and the buckets that matter must keep working.

const KEYS = 1_000_000;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

function heapUsedMb(): number {
  gc();
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
}

describe('cardinality attack: a million distinct keys', { timeout: 120_000 }, () => {
  it('global limiter: bounded table, pinned buckets keep deciding', async (t) => {
    const limiter = createGlobalLimiter({ reporterId: 'h1', clients: [], maxBuckets: 10_000 });
    const pinned = limiter.bucket('payments:charge');
    const before = heapUsedMb();
    for (let i = 0; i < KEYS; i++) limiter.allow(`api:caller=${i}`);
    const after = heapUsedMb();
    const snapshot = limiter.snapshot();
    t.diagnostic(
      `heap ${before.toFixed(1)} -> ${after.toFixed(1)} MB; buckets ${snapshot.bucketCount}/${snapshot.maxBuckets}; overflow ${snapshot.overflowOffered}`,
    );
    assert.ok(snapshot.bucketCount <= 10_000);
    assert.equal(
      snapshot.overflowOffered,
      KEYS - (10_000 - 1),
      'keys past the cap were decided by the overflow bucket',
    );
    assert.ok(after - before < 24, `heap grew ${(after - before).toFixed(1)} MB`);
    assert.ok(pinned.allow(), 'the pinned bucket still decides');
    assert.ok(limiter.snapshot().buckets.some((b) => b.key === 'payments:charge' && b.offered === 1));
    await limiter.stop();
  });

  for (const [name, create] of [
    ['keyed token bucket', () => createKeyedTokenBucket({ capacity: 5, refillPerSec: 1, maxKeys: 50_000 })],
    ['keyed GCRA', () => createKeyedGcra({ limit: 5, periodMs: 1000, maxKeys: 50_000 })],
  ] as const) {
    it(`${name}: at most maxKeys held, and a hot key is still limited`, (t) => {
      const limiter = create();
      const before = heapUsedMb();
      for (let i = 0; i < 5; i++) assert.ok(limiter.tryTake('hot'));
      assert.equal(limiter.tryTake('hot'), false, 'the hot key is limited before the attack');
      for (let i = 0; i < KEYS; i++) limiter.tryTake(`k${i}`);
      const after = heapUsedMb();
      t.diagnostic(
        `heap ${before.toFixed(1)} -> ${after.toFixed(1)} MB; ${limiter.size} keys; ${limiter.evictions} evictions`,
      );
      assert.ok(limiter.size <= 50_000);
      assert.ok(after - before < 24, `heap grew ${(after - before).toFixed(1)} MB`);
      // The hot key was evicted by the flood (LRU): it starts full again, and is limited again.
      let admitted = 0;
      for (let i = 0; i < 10; i++) if (limiter.tryTake('hot')) admitted++;
      assert.ok(admitted <= 5, `hot key admitted ${admitted} of 10`);
    });
  }
});
