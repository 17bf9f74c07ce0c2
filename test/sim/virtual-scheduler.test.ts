import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { ManualClock } from '../../src/core/clock.js';
import { VirtualScheduler } from '../../src/sim/virtual-scheduler.js';

describe('VirtualScheduler', () => {
  it('fires timers in the same order as ManualClock, including nested and cancelled ones', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            delayMs: fc.integer({ min: 0, max: 50 }),
            nestedMs: fc.option(fc.integer({ min: 0, max: 20 })),
            cancel: fc.boolean(),
          }),
          {
            maxLength: 40,
          },
        ),
        async (plan) => {
          const run = (clock: { setTimeout: ManualClock['setTimeout']; nowMs(): number }) => {
            const fired: string[] = [];
            plan.forEach((step, i) => {
              const handle = clock.setTimeout(() => {
                fired.push(`${i}@${clock.nowMs()}`);
                if (step.nestedMs !== null) {
                  clock.setTimeout(() => fired.push(`${i}n@${clock.nowMs()}`), step.nestedMs);
                }
              }, step.delayMs);
              if (step.cancel && i % 3 === 0) handle.cancel();
            });
            return fired;
          };
          const manual = new ManualClock(0);
          const expected = run(manual);
          manual.advance(100);
          const virtual = new VirtualScheduler(0);
          const actual = run(virtual);
          await virtual.runUntil(100);
          assert.deepEqual(actual, expected);
          assert.equal(virtual.nowMs(), 100);
          assert.equal(virtual.pendingTimers, 0);
        },
      ),
      { numRuns: 200 },
    );
  });

  it('runs promise continuations at the virtual instant their promise settled', async () => {
    const scheduler = new VirtualScheduler(0);
    const seen: number[] = [];
    const delay = (ms: number) => new Promise<void>((resolve) => scheduler.setTimeout(resolve, ms));
    void (async () => {
      await delay(10);
      seen.push(scheduler.nowMs());
      await delay(5);
      seen.push(scheduler.nowMs());
    })();
    scheduler.setTimeout(() => seen.push(-scheduler.nowMs()), 12);
    await scheduler.runUntil(30);
    assert.deepEqual(seen, [10, -12, 15]);
  });

  it('never moves time backwards and counts fired timers', async () => {
    const scheduler = new VirtualScheduler(1000);
    scheduler.setTimeout(() => {}, 5);
    scheduler.setTimeout(() => {}, 5).cancel();
    await scheduler.runUntil(500);
    assert.equal(scheduler.nowMs(), 1000);
    await scheduler.advance(10);
    assert.equal(scheduler.nowMs(), 1010);
    assert.equal(scheduler.firedTimers, 1);
  });
});
