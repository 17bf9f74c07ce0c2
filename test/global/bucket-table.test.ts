import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ErrorCode } from '../../src/core/errors.js';
import { advance, harness } from './fixtures.js';

describe('bounded bucket table', () => {
  it('1,000,000 distinct keys keep the table at maxBuckets; held handles keep working and reporting', async () => {
    const h = harness({ maxBuckets: 10_000 });
    const held = h.limiter.bucket('payments:charge');
    h.aggregator.set('payments:charge', { dropRatio: 1 });
    await h.flush();
    for (let i = 0; i < 1_000_000; i++) assert.equal(h.limiter.allow(`api:caller=${i}`), true);
    const snap = h.limiter.snapshot();
    assert.equal(snap.bucketCount, 10_000);
    assert.equal(snap.overflowOffered, 1_000_000 - 9_999, 'new keys past the bound are admitted and counted');
    assert.equal(held.allow(), false, 'the held bucket still applies its directive');
    assert.equal(h.limiter.allow('payments:charge'), false);
    assert.throws(() => h.limiter.bucket('one-more'), { code: ErrorCode.CapacityExceeded });

    await h.flush();
    const report = h.aggregator.last;
    assert.equal(report.buckets.length, 5_000, 'at most maxBucketsPerReport keys per report');
    assert.ok(
      !report.buckets.some((b) => b.bucket === '(overflow)'),
      'the overflow handle is never reported',
    );
  });

  it('expires idle by-key buckets (never held ones) and makes room again', async () => {
    const h = harness({ maxBuckets: 3, idleExpiryMs: 10_000 });
    const held = h.limiter.bucket('held');
    h.limiter.allow('a');
    h.limiter.allow('b');
    assert.equal(h.limiter.allow('c'), true);
    assert.equal(h.limiter.snapshot().bucketCount, 3);
    assert.equal(h.limiter.snapshot().overflowOffered, 1);
    h.limiter.start();
    await advance(h.clock, 5_000, 500);
    h.limiter.allow('a');
    await advance(h.clock, 7_000, 500);
    // b went idle 12 s ago and was reported; a had traffic 7 s ago.
    const keys = h.limiter
      .snapshot()
      .buckets.map((b) => b.key)
      .sort();
    assert.deepEqual(keys, ['a', 'held']);
    assert.equal(h.limiter.snapshot().bucketsExpired, 1);
    await advance(h.clock, 60_000, 1_000);
    assert.deepEqual(
      h.limiter.snapshot().buckets.map((b) => b.key),
      ['held'],
    );
    assert.equal(held.allow(), true);
    h.limiter.allow('c');
    h.limiter.bucket('d');
    assert.equal(h.limiter.snapshot().bucketCount, 3);
    await h.limiter.stop();
  });

  it('bucket() makes room by expiring idle buckets before refusing', async () => {
    const h = harness({ maxBuckets: 2, idleExpiryMs: 1_000 });
    h.limiter.allow('a');
    h.limiter.allow('b');
    await h.flush();
    h.clock.advance(2_000);
    const handle = h.limiter.bucket('c');
    assert.equal(handle.key, 'c');
    assert.equal(h.limiter.snapshot().bucketCount, 1);
  });
});
