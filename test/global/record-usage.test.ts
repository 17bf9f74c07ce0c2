import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { advance, harness } from './fixtures.js';

// Usage a data plane elsewhere decided for itself (an Envoy under an RLQS assignment) joins a
// host's reports through `record`, at the rate `onWindowClose` measures it; `peek` reads a bucket's
// directive without pinning it; `hostCount` says how many hosts the reports speak for.
describe('GlobalLimiter.record, peek, onWindowClose and hostCount', () => {
  it('recorded units are reported as offered and admitted with the window they were recorded in', async () => {
    const closes: number[] = [];
    const h = harness({
      onWindowClose: (nowMs) => {
        closes.push(nowMs);
        h.limiter.record('envoy.a', 30, 10);
      },
      hostCount: () => 13,
    });
    h.limiter.allow('envoy.a');
    await h.flush();
    assert.equal(closes.length, 1);
    const usage = h.aggregator.last.buckets.find((b) => b.bucket === 'envoy.a');
    assert.deepEqual([usage?.offered, usage?.admitted], [31, 11]);
    assert.equal(h.aggregator.last.hostCount, 13);
    const snapshot = h.limiter.snapshot().buckets.find((b) => b.key === 'envoy.a');
    assert.deepEqual([snapshot?.offered, snapshot?.admitted, snapshot?.dropped], [31, 11, 20]);
  });

  it('refuses a negative or non-finite count, and clips admitted to offered', () => {
    const h = harness();
    assert.throws(() => h.limiter.record('k', -1, 0), { code: 'ERR_SPILLWAY_INVALID_COST' });
    assert.throws(() => h.limiter.record('k', Number.POSITIVE_INFINITY, 0), {
      code: 'ERR_SPILLWAY_INVALID_COST',
    });
    h.limiter.record('k', 5, 9);
    const snapshot = h.limiter.peek('k');
    assert.deepEqual([snapshot?.offered, snapshot?.admitted], [5, 5]);
  });

  it('peek shows the held directive without pinning or creating the bucket', async () => {
    const h = harness();
    assert.equal(h.limiter.peek('b'), undefined);
    assert.equal(h.limiter.snapshot().bucketCount, 0);
    h.aggregator.set('b', { dropRatio: 0.25, limitRps: 40, offeredRps: 160 });
    h.limiter.allow('b');
    await h.flush();
    const seen = h.limiter.peek('b');
    assert.deepEqual(
      [seen?.dropRatio, seen?.limitRps, seen?.globalOfferedRps, seen?.pinned, seen?.stale],
      [0.25, 40, 160, false, false],
    );
    await advance(h.clock, 4_000, 100);
    assert.equal(h.limiter.peek('b')?.stale, true);
  });

  it('a hostCount that is not a whole number of hosts reports 1', async () => {
    const h = harness({ hostCount: () => Number.NaN });
    h.limiter.allow('c');
    await h.flush();
    assert.equal(h.aggregator.last.hostCount, 1);
  });
});
