import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DAY_MS, type HistoryStore, MINUTE_MS } from '../../src/control/tuning/history-store.js';
import { createMemoryHistoryStore } from '../../src/control/tuning/memory-history-store.js';
import { createPeakRecorder, type PeakSnapshot } from '../../src/control/tuning/peak-recorder.js';
import { ManualClock } from '../../src/core/clock.js';

const MINUTE0 = Date.UTC(2026, 0, 5, 10, 0);

function snapshot(clock: ManualClock, rates: Record<string, number>): PeakSnapshot {
  return {
    nowMs: clock.nowMs(),
    buckets: Object.entries(rates).map(([key, offeredRps]) => ({
      key,
      offeredRps,
      scope: 'global' as const,
    })),
  };
}

describe('PeakRecorder', () => {
  it('keeps the highest rate per bucket per minute and flushes a minute when the next one starts', () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    const recorder = createPeakRecorder({ store });
    // One tick a second for two minutes and a bit: a ramp in minute 0, a dip in minute 1.
    for (let second = 0; second < 125; second++) {
      const rps = second < 60 ? 100 + second : second < 120 ? 300 - second : 7;
      recorder.observe(snapshot(clock, { a: rps, b: 1 }));
      clock.advance(1000);
    }
    assert.deepEqual(store.peaks('a', 0, MINUTE0 + DAY_MS), [
      { minuteStartMs: MINUTE0, peakOfferedRps: 159 },
      { minuteStartMs: MINUTE0 + MINUTE_MS, peakOfferedRps: 240 },
    ]);
    assert.equal(recorder.stats().flushedMinutes, 2);
    // The third minute is still open: flushed on demand (shutdown).
    recorder.flush();
    assert.deepEqual(store.peaks('a', MINUTE0 + 2 * MINUTE_MS, MINUTE0 + 3 * MINUTE_MS), [
      { minuteStartMs: MINUTE0 + 2 * MINUTE_MS, peakOfferedRps: 7 },
    ]);
    assert.deepEqual(store.dailyPeaks('a', 0, MINUTE0 + DAY_MS)[0]?.peakOfferedRps, 240);
  });

  it('a boundary tick belongs to the minute it falls in, a skipped minute writes nothing', () => {
    const clock = new ManualClock(MINUTE0 + MINUTE_MS - 1);
    const store = createMemoryHistoryStore();
    const recorder = createPeakRecorder({ store });
    recorder.observe(snapshot(clock, { a: 5 }));
    clock.advance(1); // exactly the next minute's start
    recorder.observe(snapshot(clock, { a: 6 }));
    clock.advance(3 * MINUTE_MS); // controller paused
    recorder.observe(snapshot(clock, { a: 7 }));
    recorder.flush();
    assert.deepEqual(store.peaks('a', 0, MINUTE0 + DAY_MS), [
      { minuteStartMs: MINUTE0, peakOfferedRps: 5 },
      { minuteStartMs: MINUTE0 + MINUTE_MS, peakOfferedRps: 6 },
      { minuteStartMs: MINUTE0 + 4 * MINUTE_MS, peakOfferedRps: 7 },
    ]);
  });

  it('zone-scoped buckets record their busiest zone; invalid rates are skipped', () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    const recorder = createPeakRecorder({ store });
    recorder.observe({
      nowMs: clock.nowMs(),
      buckets: [
        { key: 'z', offeredRps: 900, scope: 'zone', zones: [{ offeredRps: 600 }, { offeredRps: 300 }] },
        { key: 'nan', offeredRps: Number.NaN, scope: 'global' },
      ],
    });
    recorder.flush();
    assert.deepEqual(store.peaks('z', 0, MINUTE0 + MINUTE_MS), [
      { minuteStartMs: MINUTE0, peakOfferedRps: 600 },
    ]);
    assert.deepEqual(store.buckets(), ['z']);
  });

  it('bounded memory: at most maxBuckets keys per minute, the rest counted', () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    const recorder = createPeakRecorder({ store, maxBuckets: 2 });
    recorder.observe(snapshot(clock, { a: 1, b: 2, c: 3 }));
    recorder.observe(snapshot(clock, { a: 4, c: 5 }));
    assert.deepEqual(recorder.stats(), {
      flushedMinutes: 0,
      failedFlushes: 0,
      bucketsOverCapacity: 2,
      trackedBuckets: 2,
    });
    clock.advance(MINUTE_MS);
    recorder.observe(snapshot(clock, { c: 9 }));
    assert.equal(recorder.stats().trackedBuckets, 1, 'a new minute starts from an empty table');
    assert.deepEqual(store.buckets(), ['a', 'b']);
  });

  it('a failing store is reported and counted, never thrown', () => {
    const clock = new ManualClock(MINUTE0);
    const failing: HistoryStore = {
      ...createMemoryHistoryStore(),
      recordPeaks() {
        throw new Error('disk full');
      },
    };
    const errors: unknown[] = [];
    const recorder = createPeakRecorder({ store: failing, onError: (e) => errors.push(e) });
    recorder.observe(snapshot(clock, { a: 1 }));
    clock.advance(MINUTE_MS);
    assert.doesNotThrow(() => recorder.observe(snapshot(clock, { a: 2 })));
    assert.equal(errors.length, 1);
    assert.equal(recorder.stats().failedFlushes, 1);
  });

  it('prunes once per UTC day, after a midnight it ran through, with separate retentions', () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    store.recordPeak('old', MINUTE0 - 3 * DAY_MS, 1);
    store.recordPeak('old', MINUTE0 - 20 * DAY_MS, 1);
    const recorder = createPeakRecorder({
      store,
      minuteRetentionMs: 2 * DAY_MS,
      dailyRetentionMs: 10 * DAY_MS,
    });
    recorder.observe(snapshot(clock, { a: 1 }));
    recorder.flush();
    assert.equal(
      store.peaks('old', 0, MINUTE0).length,
      2,
      'a first flush with no day before it never prunes',
    );
    // Through the night (a minute every hour), into the next UTC day.
    for (let hour = 0; hour < 15; hour++) {
      clock.advance(3_600_000);
      recorder.observe(snapshot(clock, { a: 1 }));
    }
    recorder.flush();
    assert.deepEqual(store.peaks('old', 0, MINUTE0), [], 'minutes older than 2 days pruned');
    assert.deepEqual(
      store.dailyPeaks('old', 0, MINUTE0).map((d) => d.dayStartMs),
      [Date.UTC(2026, 0, 2)],
      'the 4-day-old day is kept, the 21-day-old one pruned',
    );
  });

  it('a controller stopped every night prunes as one that never stops (the last day is in the store)', () => {
    const store = createMemoryHistoryStore();
    store.recordPeak('old', MINUTE0 - 100 * DAY_MS, 1);
    // Day 0, 10:00-20:00, then stopped; day 1 from 08:00 by a new process on the same store.
    const day0 = createPeakRecorder({ store });
    const clock = new ManualClock(MINUTE0);
    for (let hour = 0; hour < 10; hour++) {
      day0.observe(snapshot(clock, { a: 1 }));
      clock.advance(3_600_000);
    }
    day0.flush();
    assert.equal(store.dailyPeaks('old', 0, MINUTE0).length, 1, 'no midnight yet');
    clock.advance(12 * 3_600_000);
    const day1 = createPeakRecorder({ store });
    day1.observe(snapshot(clock, { a: 1 }));
    day1.flush();
    assert.deepEqual(store.dailyPeaks('old', 0, MINUTE0), [], 'the 100-day-old day pruned on day 1');
  });

  it('one reading of a clock gone months ahead prunes nothing', () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    for (let day = 1; day <= 28; day++) store.recordPeak('a', MINUTE0 - day * DAY_MS, 1000);
    const recorder = createPeakRecorder({ store });
    recorder.observe(snapshot(clock, { a: 900 }));
    recorder.observe({ ...snapshot(clock, { a: 900 }), nowMs: MINUTE0 + 120 * DAY_MS });
    clock.advance(60_000);
    recorder.observe(snapshot(clock, { a: 900 })); // the clock corrected
    recorder.flush();
    assert.equal(store.dailyPeaks('a', 0, MINUTE0 - 12 * 3_600_000).length, 28, 'all 28 past days kept');
  });

  it("records exact-key buckets only: a template's instances are keys callers choose", () => {
    const clock = new ManualClock(MINUTE0);
    const store = createMemoryHistoryStore();
    const recorder = createPeakRecorder({ store });
    recorder.observe({
      nowMs: clock.nowMs(),
      buckets: [
        { key: 'payments', rule: 'payments', offeredRps: 5, scope: 'global' },
        { key: 'caller:alice', rule: 'caller:*', offeredRps: 7, scope: 'global' },
        { key: 'legacy', offeredRps: 3, scope: 'global' },
      ],
    });
    recorder.flush();
    assert.deepEqual(store.buckets(), ['legacy', 'payments']);
  });
});
