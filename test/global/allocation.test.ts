import assert from 'node:assert/strict';
import { PerformanceObserver } from 'node:perf_hooks';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import v8 from 'node:v8';
import vm from 'node:vm';
import { ManualClock } from '../../src/core/clock.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import { harness } from './fixtures.js';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const CALLS = 3_000_000;

/**
 * Garbage collections during a synchronous loop of CALLS calls. A loop that allocates even 16
 * bytes per call fills the young generation many times over; one that allocates nothing cannot
 * trigger a collection (nothing else runs while the loop holds the thread).
 */
async function gcsDuring(loop: () => void): Promise<number> {
  let gcs = 0;
  const observer = new PerformanceObserver((list) => {
    gcs += list.getEntries().length;
  });
  observer.observe({ entryTypes: ['gc'] });
  gc();
  await sleep(20);
  gcs = 0;
  loop();
  await sleep(50);
  observer.disconnect();
  return gcs;
}

describe('hot path allocation', () => {
  it('the probe sees allocation: a loop keeping one small object per call collects garbage', async () => {
    const sink: { last: { i: number } | undefined } = { last: undefined };
    const gcs = await gcsDuring(() => {
      for (let i = 0; i < CALLS; i++) sink.last = { i };
    });
    assert.ok(gcs > 0, 'the probe must be able to fail');
  });

  it('handle.allow() and limiter.allow(key) with a ratio, shadow and burst guard allocate nothing', async () => {
    const h = harness({ burstGuard: {} });
    const keys = Array.from({ length: 100 }, (_, i) => `api:caller=${i}`);
    const enforce = h.limiter.bucket('enforce');
    const shadow = h.limiter.bucket('shadow');
    for (const key of keys) h.limiter.allow(key);
    enforce.allow();
    h.clock.advance(1_000);
    h.aggregator.set('enforce', { dropRatio: 0.3, limitRps: 1e12, offeredRps: 1 });
    h.aggregator.set('shadow', { dropRatio: 0.3, mode: 'shadow' });
    for (const key of keys) h.aggregator.set(key, { dropRatio: 0.3 });
    await h.flush();
    assert.equal(h.limiter.snapshot().buckets.find((b) => b.key === 'enforce')!.guardArmed, true);
    const sink = { admitted: 0 };
    const loop = () => {
      for (let i = 0; i < CALLS; i++) {
        if (enforce.allow()) sink.admitted++;
        if (shadow.allow()) sink.admitted++;
        if (h.limiter.allow(keys[i % 100]!)) sink.admitted++;
      }
    };
    loop(); // warm up: optimised code, settled field representations
    assert.equal(await gcsDuring(loop), 0);
    assert.ok(sink.admitted > 0);
  });

  it('the no-directive path allocates nothing either', async () => {
    const limiter = createGlobalLimiter({ reporterId: 'h', clients: [], scheduler: new ManualClock(0) });
    const handle = limiter.bucket('k');
    const sink = { admitted: 0 };
    const loop = () => {
      for (let i = 0; i < CALLS; i++) if (handle.allow(2)) sink.admitted++;
    };
    loop();
    assert.equal(await gcsDuring(loop), 0);
  });
});
