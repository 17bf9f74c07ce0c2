import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock, systemClock } from '../../src/core/clock.js';
import { ErrorCode, isSpillwayError } from '../../src/core/errors.js';
import { coarseClock, createCoarseClock } from '../../src/local/coarse-clock.js';

const T0 = 1_700_000_000_000;

describe('createCoarseClock', () => {
  it('caches the source time and refreshes it every resolutionMs', () => {
    const source = new ManualClock(T0);
    const clock = createCoarseClock({ resolutionMs: 1, scheduler: source });
    assert.equal(clock.running, false, 'nothing runs before the first read');
    assert.equal(clock.nowMs(), T0);
    assert.equal(clock.running, true);
    source.advance(0.5);
    assert.equal(clock.nowMs(), T0, 'stale by less than the resolution');
    source.advance(0.5);
    assert.equal(clock.nowMs(), T0 + 1);
    source.advance(10);
    assert.equal(clock.nowMs(), T0 + 11);
    clock.stop();
  });

  it('stops after idleStopMs without reads and restarts fresh on the next read', () => {
    const source = new ManualClock(T0);
    const clock = createCoarseClock({ resolutionMs: 1, idleStopMs: 100, scheduler: source });
    clock.nowMs();
    source.advance(101);
    assert.equal(clock.running, false);
    assert.equal(source.pendingTimers, 0, 'no timer left behind');
    source.advance(5_000);
    assert.equal(clock.nowMs(), T0 + 5_101, 'a restart reads the source at once');
    assert.equal(clock.running, true);
    clock.stop();
    assert.equal(source.pendingTimers, 0);
  });

  it('keeps running while it is read', () => {
    const source = new ManualClock(T0);
    const clock = createCoarseClock({ resolutionMs: 1, idleStopMs: 10, scheduler: source });
    for (let ms = 0; ms < 1_000; ms++) {
      assert.equal(clock.nowMs(), T0 + ms);
      source.advance(1);
    }
    assert.equal(clock.running, true);
    clock.stop();
  });

  it('never goes backwards when the source does', () => {
    const source = new ManualClock(T0);
    const clock = createCoarseClock({ resolutionMs: 1, scheduler: source });
    clock.nowMs();
    source.advance(10);
    assert.equal(clock.nowMs(), T0 + 10);
    source.set(T0 - 1_000);
    source.advance(5);
    assert.equal(clock.nowMs(), T0 + 10);
    clock.stop();
  });

  it('rejects a non-positive resolution or idle time', () => {
    for (const options of [{ resolutionMs: 0 }, { idleStopMs: Number.NaN }]) {
      assert.throws(
        () => createCoarseClock(options),
        (error) => isSpillwayError(error, ErrorCode.InvalidLimit),
      );
    }
  });
});

describe('coarseClock (shared, real time)', () => {
  it('follows the system clock within its resolution once the event loop is free', async () => {
    const first = coarseClock.nowMs();
    assert.ok(Math.abs(first - systemClock.nowMs()) < 1_000);
    const deadlineMs = Date.now() + 5_000;
    while (coarseClock.nowMs() === first) {
      assert.ok(Date.now() < deadlineMs, 'the coarse clock never advanced');
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    // Right after a tick the cache is fresh; allow for a loaded machine delaying the timer.
    const lagMs = systemClock.nowMs() - coarseClock.nowMs();
    assert.ok(lagMs >= 0 && lagMs < 1_000, `lag ${lagMs} ms`);
  });
});
