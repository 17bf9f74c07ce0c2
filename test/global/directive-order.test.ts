import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isNewerDirective } from '../../src/global/index.js';
import { advance, harness } from './fixtures.js';

describe('isNewerDirective', () => {
  it('a newer epoch wins whatever the version; within an epoch the higher version wins; equal is not newer', () => {
    assert.equal(isNewerDirective(2n, 1n, 1n, 99n), true);
    assert.equal(isNewerDirective(1n, 99n, 2n, 1n), false);
    assert.equal(isNewerDirective(1n, 6n, 1n, 5n), true);
    assert.equal(isNewerDirective(1n, 4n, 1n, 5n), false);
    assert.equal(isNewerDirective(1n, 5n, 1n, 5n), false);
  });
});

describe('directive ordering on a live limiter', () => {
  it('ignores old versions and older epochs, lets a new epoch win', async () => {
    const h = harness();
    const handle = h.limiter.bucket('b');
    const step = async (epoch: number, version: number, dropRatio: number) => {
      h.aggregator.set('b', { epoch, version, dropRatio, ttlMs: 5_000 });
      await h.flush();
      return handle.dropRatio;
    };
    assert.equal(await step(5, 10, 0.2), 0.2);
    assert.equal(await step(5, 9, 0.9), 0.2, 'an older version is ignored');
    assert.equal(await step(5, 10, 0.9), 0.2, 'the same (epoch, version) is not applied twice');
    assert.equal(await step(5, 11, 0.3), 0.3, 'a newer version applies');
    assert.equal(await step(4, 100, 0.8), 0.3, 'a lower epoch loses, whatever its version');
    assert.equal(await step(6, 1, 0.4), 0.4, 'a new epoch wins with a low version');
    const stats = h.limiter.snapshot().reporter;
    assert.equal(stats.directivesApplied, 3);
    assert.equal(stats.directivesOutdated, 3);
    assert.equal(stats.lastEpoch, 1, 'the fake reply epoch');
    const snap = h.limiter.snapshot().buckets[0]!;
    assert.equal(snap.epoch, 6);
    assert.equal(snap.version, 1);
  });

  it('an equal directive relayed again does not extend its TTL', async () => {
    const h = harness({ stalePolicy: { kind: 'open' } });
    const handle = h.limiter.bucket('b');
    h.aggregator.set('b', { epoch: 3, version: 7, dropRatio: 0.5, ttlMs: 2_000 });
    await h.flush();
    await advance(h.clock, 1_500, 500);
    await h.flush();
    await advance(h.clock, 600, 100);
    await h.flush();
    assert.equal(h.limiter.snapshot().buckets[0]!.stale, true);
    assert.equal(handle.effectiveRatio, 0);
  });

  it('accepts a lower epoch once the held directive is stale (a controller whose clock went back)', async () => {
    const h = harness();
    const handle = h.limiter.bucket('b');
    h.aggregator.set('b', { epoch: 9, version: 1, dropRatio: 0.5, ttlMs: 1_000 });
    await h.flush();
    h.aggregator.set('b', { epoch: 8, version: 1, dropRatio: 0.1, ttlMs: 1_000 });
    await h.flush();
    assert.equal(handle.dropRatio, 0.5, 'fresh: the lower epoch loses');
    await advance(h.clock, 1_000, 500);
    await h.flush();
    assert.equal(handle.dropRatio, 0.1, 'stale: the lower epoch is accepted');
    h.aggregator.set('b', { epoch: 8, version: 0, dropRatio: 0.9, ttlMs: 1 });
    await advance(h.clock, 10, 10);
    await h.flush();
    assert.equal(handle.dropRatio, 0.1, 'within an epoch a stale directive still never goes back a version');
  });

  it('ignores directives for unknown buckets without creating them', async () => {
    const h = harness();
    h.limiter.bucket('known');
    h.aggregator.set('known', { dropRatio: 0.1 });
    h.aggregator.set('unknown', { dropRatio: 0.9 });
    await h.flush();
    const snap = h.limiter.snapshot();
    assert.equal(snap.bucketCount, 1);
    assert.equal(snap.reporter.directivesUnknown, 1);
    assert.equal(snap.buckets[0]!.dropRatio, 0.1);
  });

  it('clamps out-of-range ratios and skips NaN ones', async () => {
    const h = harness();
    const high = h.limiter.bucket('high');
    const nan = h.limiter.bucket('nan');
    h.aggregator.set('high', { dropRatio: 7 });
    h.aggregator.set('nan', { dropRatio: Number.NaN });
    await h.flush();
    assert.equal(high.dropRatio, 1);
    assert.equal(nan.dropRatio, 0);
    assert.equal(nan.allow(), true);
  });
});
