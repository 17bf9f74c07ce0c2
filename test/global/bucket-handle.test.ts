import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ErrorCode } from '../../src/core/errors.js';
import { harness } from './fixtures.js';

describe('bucket handle decisions', () => {
  it('admits everything before any directive (ratio 0, enforce)', () => {
    const { limiter } = harness();
    const handle = limiter.bucket('payments:charge');
    for (let i = 0; i < 10_000; i++) assert.equal(handle.allow(), true);
    assert.equal(handle.dropRatio, 0);
    assert.equal(handle.mode, 'enforce');
    const [bucket] = limiter.snapshot().buckets;
    assert.equal(bucket?.offered, 10_000);
    assert.equal(bucket?.admitted, 10_000);
  });

  it('drops the directive ratio of offered calls, statistically (0.3 over 100k within ±1%)', async () => {
    const { limiter, aggregator, flush } = harness({}, 12345);
    const handle = limiter.bucket('payments:charge');
    aggregator.set('payments:charge', { dropRatio: 0.3 });
    await flush();
    assert.equal(handle.dropRatio, 0.3);
    assert.equal(handle.effectiveRatio, 0.3);
    const n = 100_000;
    let dropped = 0;
    for (let i = 0; i < n; i++) if (!handle.allow()) dropped++;
    assert.ok(Math.abs(dropped / n - 0.3) < 0.01, `drop fraction ${dropped / n}`);
    const bucket = limiter.snapshot().buckets[0]!;
    assert.equal(bucket.offered, n, 'offered counts dropped calls too');
    assert.equal(bucket.dropped, dropped);
    assert.equal(bucket.admitted, n - dropped);
  });

  it('drops everything at ratio 1 and nothing at ratio 0', async () => {
    const { limiter, aggregator, flush } = harness();
    const all = limiter.bucket('all');
    const none = limiter.bucket('none');
    aggregator.set('all', { dropRatio: 1 });
    aggregator.set('none', { dropRatio: 0 });
    await flush();
    for (let i = 0; i < 1000; i++) {
      assert.equal(all.allow(), false);
      assert.equal(none.allow(), true);
    }
  });

  it('shadow mode admits every call and counts would-drops at the ratio', async () => {
    const { limiter, aggregator, flush } = harness({}, 7);
    const handle = limiter.bucket('search');
    aggregator.set('search', { dropRatio: 0.4, mode: 'shadow' });
    await flush();
    assert.equal(handle.mode, 'shadow');
    const n = 50_000;
    for (let i = 0; i < n; i++) assert.equal(handle.allow(), true);
    const bucket = limiter.snapshot().buckets[0]!;
    assert.equal(bucket.admitted, n);
    assert.equal(bucket.dropped, 0);
    assert.ok(Math.abs(bucket.wouldDrop / n - 0.4) < 0.01, `would-drop fraction ${bucket.wouldDrop / n}`);
    const decision = handle.decide();
    assert.equal(decision.allowed, true);

    // Flipping to enforce needs nothing but the next directive.
    aggregator.set('search', { dropRatio: 0.4, mode: 'enforce' });
    await flush();
    assert.equal(handle.mode, 'enforce');
    let dropped = 0;
    for (let i = 0; i < n; i++) if (!handle.allow()) dropped++;
    assert.ok(Math.abs(dropped / n - 0.4) < 0.01);
  });

  it("decide() returns the same decision shape with reason 'shadow' on a would-drop", async () => {
    const { limiter, aggregator, flush } = harness();
    const shadow = limiter.bucket('s');
    const enforce = limiter.bucket('e');
    aggregator.set('s', { dropRatio: 1, mode: 'shadow', limitRps: 50 });
    aggregator.set('e', { dropRatio: 1, limitRps: 50 });
    await flush();
    const wouldDrop = shadow.decide();
    assert.equal(wouldDrop.allowed, true);
    assert.equal(wouldDrop.reason, 'shadow');
    assert.equal(wouldDrop.limit, 50);
    const drop = enforce.decide(2);
    assert.equal(drop.allowed, false);
    assert.equal(drop.remaining, 0);
    assert.equal(drop.retryAfterMs, 1000, 'a ratio can only change with the next report');
    assert.equal(drop.reason, undefined);
    const snap = limiter.snapshot().buckets.find((b) => b.key === 'e')!;
    assert.equal(snap.dropped, 2);
    const byKey = limiter.limit('e');
    assert.equal(byKey.allowed, false);
  });

  it("decide()'s remaining is the fleet's unused share of the limit, as RateLimit's r means (issue #35)", async () => {
    const { limiter, aggregator, flush } = harness();
    const idle = limiter.bucket('idle');
    const busy = limiter.bucket('busy');
    const over = limiter.bucket('over');
    const shadow = limiter.bucket('shadow');
    aggregator.set('idle', { dropRatio: 0, limitRps: 500, offeredRps: 0 });
    aggregator.set('busy', { dropRatio: 0, limitRps: 500, offeredRps: 380 });
    aggregator.set('over', { dropRatio: 0.5, limitRps: 500, offeredRps: 1000 });
    aggregator.set('shadow', { dropRatio: 0.5, limitRps: 500, offeredRps: 1000, mode: 'shadow' });
    await flush();
    assert.equal(idle.decide().remaining, 500, 'an idle fleet leaves the whole limit');
    assert.equal(busy.decide().remaining, 120, 'the limit less what the fleet admits');
    const atLimit = [over.decide(), over.decide(), over.decide(), over.decide()].find((d) => d.allowed)!;
    assert.equal(atLimit.remaining, 0, 'a fleet at its limit leaves nothing, even on an admitted call');
    assert.equal(shadow.decide().remaining, 500, 'a shadow bucket shows no limit it does not enforce');
  });

  it('counts cost units; the ratio applies per call', async () => {
    const { limiter, aggregator, flush } = harness({}, 99);
    const handle = limiter.bucket('upload');
    aggregator.set('upload', { dropRatio: 0.5 });
    await flush();
    let droppedCalls = 0;
    for (let i = 0; i < 10_000; i++) if (!handle.allow(5)) droppedCalls++;
    const bucket = limiter.snapshot().buckets[0]!;
    assert.equal(bucket.offered, 50_000);
    assert.equal(bucket.dropped, droppedCalls * 5);
    assert.equal(bucket.admitted, (10_000 - droppedCalls) * 5);
    assert.ok(Math.abs(droppedCalls / 10_000 - 0.5) < 0.02);
  });

  it('rejects invalid costs with ERR_SPILLWAY_INVALID_COST and counts nothing for them', () => {
    const { limiter } = harness();
    const handle = limiter.bucket('k');
    for (const cost of [-1, Number.NaN, Number.POSITIVE_INFINITY, '3' as unknown as number]) {
      assert.throws(() => handle.allow(cost), { code: ErrorCode.InvalidCost }, String(cost));
      assert.throws(() => handle.decide(cost), { code: ErrorCode.InvalidCost });
      assert.throws(() => limiter.allow('k', cost), { code: ErrorCode.InvalidCost });
    }
    assert.equal(limiter.snapshot().buckets[0]!.offered, 0);
    assert.equal(handle.allow(2.5), true, 'fractional costs are fine');
  });

  it('rejects invalid keys with ERR_SPILLWAY_INVALID_KEY (length counted in UTF-8 bytes)', () => {
    const { limiter } = harness({ maxKeyLength: 8 });
    for (const key of ['', 'x'.repeat(9), 'ééééé', 42 as unknown as string, undefined as unknown as string]) {
      assert.throws(() => limiter.bucket(key), { code: ErrorCode.InvalidKey }, String(key));
      assert.throws(() => limiter.allow(key), { code: ErrorCode.InvalidKey });
      assert.throws(() => limiter.limit(key), { code: ErrorCode.InvalidKey });
    }
    assert.equal(limiter.allow('x'.repeat(8)), true);
    assert.equal(limiter.snapshot().bucketCount, 1);
  });

  it('by-key calls and the handle share one bucket', () => {
    const { limiter } = harness();
    const handle = limiter.bucket('shared');
    limiter.allow('shared', 3);
    handle.allow(2);
    limiter.limit('shared');
    assert.equal(limiter.snapshot().buckets[0]!.offered, 6);
    assert.equal(limiter.bucket('shared'), handle);
  });

  it('starts buckets in shadow with defaultMode shadow', () => {
    const { limiter } = harness({ defaultMode: 'shadow' });
    assert.equal(limiter.bucket('x').mode, 'shadow');
  });
});
