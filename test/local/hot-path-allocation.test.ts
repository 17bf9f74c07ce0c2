import assert from 'node:assert/strict';
import { PerformanceObserver } from 'node:perf_hooks';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import v8 from 'node:v8';
import vm from 'node:vm';
import type { Clock } from '../../src/core/clock.js';
import { createGcra } from '../../src/local/gcra.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';
import { createTokenBucket } from '../../src/local/token-bucket.js';

// The contract "tryTake allocates nothing" only holds for optimised code, so the loops below are
// optimised on purpose (V8 natives) instead of hoping a warm-up was long enough on a busy machine.
v8.setFlagsFromString('--allow-natives-syntax');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;
const optimize = new Function(
  'fn',
  '%PrepareFunctionForOptimization(fn); fn(1000); fn(1000); %OptimizeFunctionOnNextCall(fn); fn(1000);',
) as (fn: (calls: number) => void) => void;

/** A clock that moves on every read, so every call takes the refill path too. */
class SteppingClock implements Clock {
  timeMs = 1_700_000_000_000.5;
  nowMs(): number {
    this.timeMs += 0.25;
    return this.timeMs;
  }
}

const CALLS = 2_000_000;
const sink = { admitted: 0 };

async function collectionsDuring(run: (calls: number) => void): Promise<number> {
  let collections = 0;
  const observer = new PerformanceObserver((list) => {
    collections += list.getEntries().length;
  });
  gc();
  await sleep(10);
  observer.observe({ entryTypes: ['gc'] });
  run(CALLS);
  await sleep(50); // entries are delivered asynchronously
  observer.disconnect();
  return collections;
}

describe('tryTake hot paths allocate nothing', () => {
  // 16 bytes a call (one boxed double) over 2,000,000 calls is 32 MB: several young-generation
  // collections. Zero collections means zero allocation.
  it('token bucket', async () => {
    const bucket = createTokenBucket({ capacity: 1e12, refillPerSec: 1e12, clock: new SteppingClock() });
    const run = (calls: number) => {
      for (let i = 0; i < calls; i++) if (bucket.tryTake()) sink.admitted++;
    };
    optimize(run);
    assert.equal(await collectionsDuring(run), 0);
  });

  it('GCRA', async () => {
    const gcra = createGcra({ limit: 1e12, periodMs: 1_000, clock: new SteppingClock() });
    const run = (calls: number) => {
      for (let i = 0; i < calls; i++) if (gcra.tryTake()) sink.admitted++;
    };
    optimize(run);
    assert.equal(await collectionsDuring(run), 0);
  });

  it('keyed token bucket, known key', async () => {
    const limiter = createKeyedTokenBucket({
      capacity: 1e12,
      refillPerSec: 1e12,
      clock: new SteppingClock(),
    });
    limiter.tryTake('api:caller=acme');
    const run = (calls: number) => {
      for (let i = 0; i < calls; i++) if (limiter.tryTake('api:caller=acme')) sink.admitted++;
    };
    optimize(run);
    assert.equal(await collectionsDuring(run), 0);
  });

  it('keyed GCRA, known key', async () => {
    const limiter = createKeyedGcra({ limit: 1e12, periodMs: 1_000, clock: new SteppingClock() });
    limiter.tryTake('api:caller=acme');
    const run = (calls: number) => {
      for (let i = 0; i < calls; i++) if (limiter.tryTake('api:caller=acme')) sink.admitted++;
    };
    optimize(run);
    assert.equal(await collectionsDuring(run), 0);
  });
});
