import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock, seededRandom } from '../../src/core/clock.js';

describe('ManualClock', () => {
  it('fires timers in due order as time advances, including timers they schedule', () => {
    const clock = new ManualClock(0);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push('b@20'), 20);
    clock.setTimeout(() => {
      fired.push('a@10');
      clock.setTimeout(() => fired.push('c@15'), 5);
    }, 10);
    const cancelled = clock.setTimeout(() => fired.push('never'), 12);
    cancelled.cancel();
    clock.advance(25);
    assert.deepEqual(fired, ['a@10', 'c@15', 'b@20']);
    assert.equal(clock.nowMs(), 25);
    assert.equal(clock.pendingTimers, 0);
  });
});

describe('seededRandom', () => {
  it('is deterministic per seed and stays in [0, 1)', () => {
    const a = seededRandom(42);
    const b = seededRandom(42);
    for (let i = 0; i < 1000; i++) {
      const x = a();
      assert.equal(x, b());
      assert.ok(x >= 0 && x < 1);
    }
    assert.notEqual(seededRandom(1)(), seededRandom(2)());
  });
});
