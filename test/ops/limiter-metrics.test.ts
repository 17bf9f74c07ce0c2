import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createGlobalLimiter } from '../../src/global/global-limiter.js';
import { addLimiterMetrics } from '../../src/ops/limiter-metrics.js';
import { createMetrics } from '../../src/ops/metrics.js';

function seriesCount(text: string, name: string): number {
  return text.split('\n').filter((line) => line.startsWith(`${name}{`)).length;
}

describe('addLimiterMetrics', () => {
  it('bounds per-bucket series under a flood of keys: pinned and busiest buckets kept, the rest counted', async () => {
    const limiter = createGlobalLimiter({ reporterId: 'h1', clients: [], maxBuckets: 5_000 });
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    addLimiterMetrics(metrics, limiter, { maxBucketSeries: 50 });
    const pinned = limiter.bucket('payments:charge');
    for (let i = 0; i < 20; i++) limiter.allow('api:caller=busy');
    for (let i = 0; i < 4_000; i++) limiter.allow(`api:caller=flood-${i}`);

    const text = await metrics.registry.metrics();
    assert.equal(seriesCount(text, 'spillway_offered_total'), 50);
    assert.equal(seriesCount(text, 'spillway_drop_ratio'), 50);
    assert.match(text, /^spillway_offered_total\{bucket="payments:charge"\} 0$/m, 'a pinned bucket is kept');
    assert.match(text, /^spillway_offered_total\{bucket="api:caller=busy"\} 20$/m, 'the busiest is kept');
    assert.match(text, /^spillway_bucket_series_omitted 3952$/m);
    assert.match(text, /^spillway_buckets 4002$/m, 'table-wide series still count every bucket');
    assert.ok(pinned.allow());
    await limiter.stop();
  });

  it('exports every bucket while within the bound, and refuses a bad bound', async () => {
    const limiter = createGlobalLimiter({ reporterId: 'h1', clients: [] });
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    addLimiterMetrics(metrics, limiter);
    for (let i = 0; i < 300; i++) limiter.allow(`tenant-${i}`);
    const text = await metrics.registry.metrics();
    assert.equal(seriesCount(text, 'spillway_offered_total'), 300);
    assert.match(text, /^spillway_bucket_series_omitted 0$/m);
    assert.throws(() => addLimiterMetrics(metrics, limiter, { maxBucketSeries: -1 }), {
      code: 'ERR_SPILLWAY_INVALID_OPTION',
    });
    await limiter.stop();
  });
});
