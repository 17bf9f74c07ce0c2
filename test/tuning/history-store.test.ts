import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { DAY_MS, type HistoryStore, MINUTE_MS } from '../../src/control/tuning/history-store.js';
import { createMemoryHistoryStore } from '../../src/control/tuning/memory-history-store.js';
import { createSqliteHistoryStore } from '../../src/control/tuning/sqlite-history-store.js';
import { isSpillwayError } from '../../src/core/errors.js';

const dir = mkdtempSync(join(tmpdir(), 'spillway-history-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

const DAY0 = Date.UTC(2026, 0, 5);

/** One suite, every implementation (the Hono habit): each must keep the HistoryStore contract. */
const implementations: [name: string, open: () => HistoryStore][] = [
  ['memory', () => createMemoryHistoryStore()],
  ['sqlite (temp file)', () => createSqliteHistoryStore({ path: join(dir, `h${files++}.sqlite`) })],
  ['sqlite (:memory:)', () => createSqliteHistoryStore({ path: ':memory:' })],
];

for (const [name, open] of implementations) {
  describe(`HistoryStore contract: ${name}`, () => {
    it('round-trips per-minute peaks in time order, ranges half-open', () => {
      const store = open();
      store.recordPeak('a', DAY0 + 2 * MINUTE_MS, 20);
      store.recordPeak('a', DAY0, 10);
      store.recordPeak('a', DAY0 + MINUTE_MS, 15.5);
      store.recordPeak('b', DAY0, 99);
      assert.deepEqual(store.peaks('a', DAY0, DAY0 + 2 * MINUTE_MS), [
        { minuteStartMs: DAY0, peakOfferedRps: 10 },
        { minuteStartMs: DAY0 + MINUTE_MS, peakOfferedRps: 15.5 },
      ]);
      assert.deepEqual(store.peaks('a', DAY0 + MINUTE_MS, DAY0 + DAY_MS).length, 2);
      assert.deepEqual(store.peaks('missing', 0, Number.MAX_SAFE_INTEGER), []);
      assert.deepEqual(store.buckets(), ['a', 'b']);
      store.close();
    });

    it('upsert keeps the maximum, per minute and per day', () => {
      const store = open();
      store.recordPeak('a', DAY0, 50);
      store.recordPeak('a', DAY0, 30);
      store.recordPeak('a', DAY0, 70);
      store.recordPeaks(DAY0, [['a', 60]]);
      assert.deepEqual(store.peaks('a', DAY0, DAY0 + MINUTE_MS), [
        { minuteStartMs: DAY0, peakOfferedRps: 70 },
      ]);
      assert.deepEqual(store.dailyPeaks('a', DAY0, DAY0 + DAY_MS), [
        { dayStartMs: DAY0, peakOfferedRps: 70 },
      ]);
      store.close();
    });

    it('daily peaks are the highest minute of each UTC day', () => {
      const store = open();
      store.recordPeaks(DAY0 + 10 * MINUTE_MS, [
        ['a', 5],
        ['b', 7],
      ]);
      store.recordPeak('a', DAY0 + DAY_MS - MINUTE_MS, 9); // 23:59, same day
      store.recordPeak('a', DAY0 + DAY_MS, 4); // 00:00 the next day
      store.recordPeak('a', DAY0 + 3 * DAY_MS + 5 * MINUTE_MS, 12);
      assert.deepEqual(store.dailyPeaks('a', DAY0, DAY0 + 10 * DAY_MS), [
        { dayStartMs: DAY0, peakOfferedRps: 9 },
        { dayStartMs: DAY0 + DAY_MS, peakOfferedRps: 4 },
        { dayStartMs: DAY0 + 3 * DAY_MS, peakOfferedRps: 12 },
      ]);
      assert.deepEqual(store.dailyPeaks('a', DAY0 + DAY_MS, DAY0 + 3 * DAY_MS), [
        { dayStartMs: DAY0 + DAY_MS, peakOfferedRps: 4 },
      ]);
      store.close();
    });

    it('prune deletes minutes and days before their bounds, daily rows may outlive minutes', () => {
      const store = open();
      for (let day = 0; day < 5; day++) store.recordPeak('a', DAY0 + day * DAY_MS, 10 + day);
      store.recordPeak('b', DAY0, 1);
      // Minutes before day 3, days before day 1.
      const deleted = store.prune(DAY0 + 3 * DAY_MS, DAY0 + DAY_MS);
      assert.equal(deleted, 3 + 1 + 1 + 1, '3+1 minute rows (a, b) and 1+1 day rows (a, b)');
      assert.deepEqual(
        store.peaks('a', 0, DAY0 + 10 * DAY_MS).map((p) => p.peakOfferedRps),
        [13, 14],
      );
      assert.deepEqual(
        store.dailyPeaks('a', 0, DAY0 + 10 * DAY_MS).map((p) => p.peakOfferedRps),
        [11, 12, 13, 14],
      );
      assert.deepEqual(store.buckets(), ['a']);
      assert.equal(store.prune(DAY0 + 100 * DAY_MS), 6);
      assert.deepEqual(store.buckets(), []);
      store.close();
    });

    it('markers: undefined until set, then the last value', () => {
      const store = open();
      assert.equal(store.getMarker('x'), undefined);
      store.setMarker('x', 1);
      store.setMarker('x', DAY0);
      assert.equal(store.getMarker('x'), DAY0);
      store.close();
    });

    it('refuses invalid input with ERR_SPILLWAY_INVALID_OPTION and writes nothing', () => {
      const store = open();
      const cases: [string, number, number][] = [
        ['', DAY0, 1],
        ['a', DAY0 + 1, 1],
        ['a', Number.NaN, 1],
        ['a', DAY0, -1],
        ['a', DAY0, Number.POSITIVE_INFINITY],
        ['a', DAY0, Number.NaN],
      ];
      for (const [bucket, minute, peak] of cases) {
        assert.throws(
          () => store.recordPeak(bucket, minute, peak),
          (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
          `${bucket} ${minute} ${peak}`,
        );
      }
      // A batch with one bad entry writes none of it.
      assert.throws(() =>
        store.recordPeaks(DAY0, [
          ['ok', 1],
          ['bad', -1],
        ]),
      );
      assert.deepEqual(store.buckets(), []);
      store.close();
    });
  });
}

describe('SQLite history store specifics', () => {
  it('persists across reopen; WAL mode; a reader sees a writer', () => {
    const path = join(dir, 'persist.sqlite');
    const writer = createSqliteHistoryStore({ path });
    writer.recordPeak('a', DAY0, 42);
    assert.ok(existsSync(`${path}-wal`), 'journal_mode=WAL keeps a -wal file beside the database');
    const reader = createSqliteHistoryStore({ path, readonly: true });
    assert.deepEqual(reader.peaks('a', DAY0, DAY0 + MINUTE_MS), [
      { minuteStartMs: DAY0, peakOfferedRps: 42 },
    ]);
    writer.recordPeak('a', DAY0 + MINUTE_MS, 43);
    assert.equal(reader.peaks('a', DAY0, DAY0 + DAY_MS).length, 2, 'the reader sees the new commit');
    assert.throws(
      () => reader.recordPeak('a', DAY0, 1),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_STORE_UNAVAILABLE'),
    );
    reader.close();
    writer.close();
    const again = createSqliteHistoryStore({ path });
    assert.deepEqual(again.dailyPeaks('a', 0, DAY0 + DAY_MS), [{ dayStartMs: DAY0, peakOfferedRps: 43 }]);
    again.close();
  });

  it('ranges are half-open on fractional bounds too, as in the memory store', () => {
    const store = createSqliteHistoryStore({ path: ':memory:' });
    store.recordPeak('a', DAY0, 5);
    assert.equal(store.peaks('a', DAY0 + 0.5, DAY0 + MINUTE_MS).length, 0);
    assert.equal(store.dailyPeaks('a', DAY0 + 0.5, DAY0 + DAY_MS).length, 0);
    assert.equal(store.peaks('a', DAY0 - 0.5, DAY0 + 0.5).length, 1);
    store.close();
  });

  it('rows that are not a rate (a file edited by another tool) are skipped, not read as NaN', async () => {
    const path = join(dir, 'edited.sqlite');
    const store = createSqliteHistoryStore({ path });
    store.recordPeak('a', DAY0, 10);
    store.recordPeak('a', DAY0 + DAY_MS, 20);
    store.recordPeak('a', DAY0 + 2 * DAY_MS, 30);
    store.close();
    const Database = (await import('better-sqlite3')).default;
    const raw = new Database(path);
    raw.prepare('UPDATE daily_peaks SET peak_offered_rps = ? WHERE day_start_ms = ?').run('lots', DAY0);
    raw.prepare('UPDATE daily_peaks SET peak_offered_rps = ? WHERE day_start_ms = ?').run(-5, DAY0 + DAY_MS);
    raw.prepare('UPDATE minute_peaks SET peak_offered_rps = ? WHERE minute_start_ms = ?').run('x', DAY0);
    raw.close();
    const again = createSqliteHistoryStore({ path, readonly: true });
    assert.deepEqual(again.dailyPeaks('a', 0, DAY0 + 3 * DAY_MS), [
      { dayStartMs: DAY0 + 2 * DAY_MS, peakOfferedRps: 30 },
    ]);
    assert.equal(again.peaks('a', 0, DAY0 + 3 * DAY_MS).length, 2);
    again.close();
  });

  it('mustExist: a missing file is an error, and nothing is created', () => {
    const path = join(dir, 'typo', 'history.sqlite');
    assert.throws(
      () => createSqliteHistoryStore({ path, mustExist: true }),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_STORE_UNAVAILABLE') && error.message.includes(path),
    );
    assert.equal(existsSync(join(dir, 'typo')), false);
  });

  it('read-only open of a missing file is ERR_SPILLWAY_STORE_UNAVAILABLE naming it', () => {
    const path = join(dir, 'nope.sqlite');
    assert.throws(
      () => createSqliteHistoryStore({ path, readonly: true }),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_STORE_UNAVAILABLE') && error.message.includes(path),
    );
  });
});
