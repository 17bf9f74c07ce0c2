import { mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import type BetterSqlite3 from 'better-sqlite3';
import { ErrorCode, SpillwayError } from '../../core/errors.js';
import { assertKnownOptions, optionNames } from '../../core/validate.js';
import {
  checkedPeaks,
  checkPeak,
  type DailyPeak,
  dayStartOf,
  type HistoryStore,
  type MinutePeak,
} from './history-store.js';

export interface SqliteHistoryStoreOptions {
  /** Database file, created with its directory if missing. `:memory:` for a private in-memory database. */
  path: string;
  /** How long a write waits for another process's lock (a `spillway tune` reading). Default 5000. */
  busyTimeoutMs?: number;
  readonly?: boolean;
  /** Refuse to create the file: it must be a controller's history already (implied by `readonly`). */
  mustExist?: boolean;
}

/** Bumped when the tables change; an unknown newer version is refused rather than misread. */
const SCHEMA_VERSION = 1;

/**
 * The default HistoryStore: an embedded SQLite file (better-sqlite3, synchronous). WAL mode, so
 * `spillway tune` can read the file while the controller writes it; statements are prepared once.
 *
 * Size: one row per bucket per minute (about 50-80 bytes with the key) plus one per bucket per day;
 * 100 buckets kept 8 days of minutes is about 1.2 M rows, tens of MB. Prune per-minute rows early and
 * daily rows late (PeakRecorder does).
 *
 * better-sqlite3 is loaded on first use, so importing this module costs nothing until a store is opened.
 */
const SQLITE_STORE_OPTIONS = optionNames<SqliteHistoryStoreOptions>({
  path: true,
  busyTimeoutMs: true,
  readonly: true,
  mustExist: true,
});

export function createSqliteHistoryStore(options: SqliteHistoryStoreOptions): HistoryStore {
  assertKnownOptions(options, SQLITE_STORE_OPTIONS, 'createSqliteHistoryStore');
  const Database = loadDriver();
  const mustExist = options.readonly === true || options.mustExist === true;
  if (options.path !== ':memory:' && !mustExist) mkdirSync(dirname(options.path), { recursive: true });
  let db: BetterSqlite3.Database;
  try {
    db = new Database(options.path, { readonly: options.readonly ?? false, fileMustExist: mustExist });
  } catch (error) {
    throw unavailable(`cannot open ${options.path}: ${(error as Error).message}`, options.path, error);
  }
  try {
    db.pragma(`busy_timeout = ${Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000))}`);
    const version = db.pragma('user_version', { simple: true }) as number;
    if (version > SCHEMA_VERSION) {
      throw unavailable(
        `${options.path} has history schema version ${version}; this Spillway reads up to ${SCHEMA_VERSION}`,
        options.path,
      );
    }
    if (options.readonly && version === 0) {
      throw unavailable(`${options.path} is not a Spillway history file (no schema)`, options.path);
    }
    if (!options.readonly) {
      db.pragma('journal_mode = WAL');
      // WAL + NORMAL: a power loss may lose the last commits (a minute of peaks), never corrupts.
      db.pragma('synchronous = NORMAL');
      db.exec(`
        CREATE TABLE IF NOT EXISTS minute_peaks (
          bucket TEXT NOT NULL,
          minute_start_ms INTEGER NOT NULL,
          peak_offered_rps REAL NOT NULL,
          PRIMARY KEY (bucket, minute_start_ms)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS minute_peaks_by_time ON minute_peaks (minute_start_ms);
        CREATE TABLE IF NOT EXISTS daily_peaks (
          bucket TEXT NOT NULL,
          day_start_ms INTEGER NOT NULL,
          peak_offered_rps REAL NOT NULL,
          PRIMARY KEY (bucket, day_start_ms)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS daily_peaks_by_time ON daily_peaks (day_start_ms);
        CREATE TABLE IF NOT EXISTS markers (name TEXT PRIMARY KEY, value REAL NOT NULL) WITHOUT ROWID;
      `);
      db.pragma(`user_version = ${SCHEMA_VERSION}`);
    }
  } catch (error) {
    db.close();
    if (error instanceof SpillwayError) throw error;
    throw unavailable(`cannot prepare ${options.path}: ${(error as Error).message}`, options.path, error);
  }

  /** Writes keep the maximum (the HistoryStore contract): `table` and its time column are ours, not input. */
  const prepareRaisePeak = (table: string, startColumn: string) =>
    options.readonly
      ? undefined
      : db.prepare<[string, number, number]>(
          `INSERT INTO ${table} (bucket, ${startColumn}, peak_offered_rps) VALUES (?, ?, ?)
         ON CONFLICT (bucket, ${startColumn})
         DO UPDATE SET peak_offered_rps = max(peak_offered_rps, excluded.peak_offered_rps)`,
        );
  const upsertMinute = prepareRaisePeak('minute_peaks', 'minute_start_ms');
  const upsertDay = prepareRaisePeak('daily_peaks', 'day_start_ms');
  const selectMinutes = db.prepare<
    [string, number, number],
    { minuteStartMs: number; peakOfferedRps: number }
  >(
    `SELECT minute_start_ms AS minuteStartMs, peak_offered_rps AS peakOfferedRps FROM minute_peaks
     WHERE bucket = ? AND minute_start_ms >= ? AND minute_start_ms < ? ORDER BY minute_start_ms`,
  );
  const selectDays = db.prepare<[string, number, number], { dayStartMs: number; peakOfferedRps: number }>(
    `SELECT day_start_ms AS dayStartMs, peak_offered_rps AS peakOfferedRps FROM daily_peaks
     WHERE bucket = ? AND day_start_ms >= ? AND day_start_ms < ? ORDER BY day_start_ms`,
  );
  const selectBuckets = db
    .prepare<[], { bucket: string }>(
      'SELECT bucket FROM minute_peaks UNION SELECT bucket FROM daily_peaks ORDER BY bucket',
    )
    .pluck() as unknown as BetterSqlite3.Statement<[], string>;
  const deleteMinutes = options.readonly
    ? undefined
    : db.prepare<[number]>('DELETE FROM minute_peaks WHERE minute_start_ms < ?');
  const deleteDays = options.readonly
    ? undefined
    : db.prepare<[number]>('DELETE FROM daily_peaks WHERE day_start_ms < ?');
  const selectMarker = db.prepare<[string], { value: number }>('SELECT value FROM markers WHERE name = ?');
  const upsertMarker = options.readonly
    ? undefined
    : db.prepare<[string, number]>(
        'INSERT INTO markers (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value',
      );

  function writable<T>(statement: T | undefined): T {
    if (statement === undefined) {
      throw new SpillwayError(ErrorCode.StoreUnavailable, `history: ${options.path} is open read-only`, {
        file: options.path,
      });
    }
    return statement;
  }

  function writeOne(bucket: string, minuteStartMs: number, peakOfferedRps: number): void {
    writable(upsertMinute).run(bucket, minuteStartMs, peakOfferedRps);
    writable(upsertDay).run(bucket, dayStartOf(minuteStartMs), peakOfferedRps);
  }

  const writeMany = db.transaction((minuteStartMs: number, list: (readonly [string, number])[]) => {
    for (const [bucket, peak] of list) writeOne(bucket, minuteStartMs, peak);
  });
  const pruneBoth = db.transaction((beforeMs: number, dailyBeforeMs: number) => {
    return writable(deleteMinutes).run(beforeMs).changes + writable(deleteDays).run(dailyBeforeMs).changes;
  });

  return {
    recordPeak(bucket, minuteStartMs, peakOfferedRps) {
      checkPeak(bucket, minuteStartMs, peakOfferedRps);
      writeMany(minuteStartMs, [[bucket, peakOfferedRps]]);
    },
    recordPeaks(minuteStartMs, peaks) {
      const list = checkedPeaks(minuteStartMs, peaks);
      if (list.length > 0) writeMany(minuteStartMs, list);
    },
    // Half-open on whole milliseconds: [ceil(since), ceil(until)) holds the same rows as [since, until).
    peaks(bucket, sinceMs, untilMs): MinutePeak[] {
      return selectMinutes.all(bucket, Math.ceil(sinceMs), Math.ceil(untilMs)).filter(isSoundPeak);
    },
    dailyPeaks(bucket, sinceMs, untilMs): DailyPeak[] {
      return selectDays.all(bucket, Math.ceil(sinceMs), Math.ceil(untilMs)).filter(isSoundPeak);
    },
    buckets() {
      return selectBuckets.all();
    },
    prune(beforeMs, dailyBeforeMs = beforeMs) {
      return pruneBoth(Math.floor(beforeMs), Math.floor(dailyBeforeMs));
    },
    getMarker(name) {
      return selectMarker.get(name)?.value;
    },
    setMarker(name, value) {
      writable(upsertMarker).run(name, value);
    },
    close() {
      if (db.open) db.close();
    },
  };
}

function loadDriver(): typeof BetterSqlite3 {
  try {
    return createRequire(import.meta.url)('better-sqlite3') as typeof BetterSqlite3;
  } catch (error) {
    throw unavailable(
      `cannot load better-sqlite3 (a native module; install it or its build tools): ${(error as Error).message}`,
      undefined,
      error,
    );
  }
}

function unavailable(message: string, file: string | undefined, cause?: unknown): SpillwayError {
  return new SpillwayError(
    ErrorCode.StoreUnavailable,
    `history: ${message}`,
    file === undefined ? undefined : { file },
    cause === undefined ? undefined : { cause },
  );
}

/**
 * Rows this store wrote are always sound (writes are checked); a file edited by hand or by another
 * tool may hold text or a negative number in a peak column (SQLite columns are not typed). Such a
 * row is skipped rather than turned into a NaN proposal that would stop every bucket's tuning.
 */
function isSoundPeak(row: { peakOfferedRps: number }): boolean {
  return (
    typeof row.peakOfferedRps === 'number' && Number.isFinite(row.peakOfferedRps) && row.peakOfferedRps >= 0
  );
}
