import { ErrorCode, SpillwayError } from '../../core/errors.js';

export const MINUTE_MS = 60_000;
export const DAY_MS = 86_400_000;

/** The highest offered rate the controller saw for a bucket within one minute. */
export interface MinutePeak {
  minuteStartMs: number;
  peakOfferedRps: number;
}

/** The highest per-minute peak of one UTC day. */
export interface DailyPeak {
  dayStartMs: number;
  peakOfferedRps: number;
}

/**
 * Where the controller keeps per-bucket peaks of offered load, the input of tuning.
 *
 * Contract, shared by every implementation (one suite tests them all, test/tuning/history-store.test.ts):
 * - Writes are upserts that keep the maximum: recording a lower peak for a minute already stored
 *   changes nothing, so a flush repeated after a crash or by two controllers is harmless.
 * - Every per-minute write also raises that UTC day's peak. Daily peaks are kept in their own table
 *   so they can outlive the per-minute rows (tuning needs weeks of days, charts need hours of minutes).
 * - Ranges are half-open, `[sinceMs, untilMs)`, on the minute's (or day's) start; results are sorted
 *   by time. Days are UTC days.
 * - Calls are synchronous and never interleave; `close()` is final.
 * - Invalid input (non-finite or negative rate, unaligned or non-finite minute, empty bucket) throws
 *   ERR_SPILLWAY_INVALID_OPTION and writes nothing.
 */
export interface HistoryStore {
  recordPeak(bucket: string, minuteStartMs: number, peakOfferedRps: number): void;
  /** Several buckets' peaks for one minute, in one transaction where the store has them. */
  recordPeaks(
    minuteStartMs: number,
    peaks: Iterable<readonly [bucket: string, peakOfferedRps: number]>,
  ): void;
  peaks(bucket: string, sinceMs: number, untilMs: number): MinutePeak[];
  dailyPeaks(bucket: string, sinceMs: number, untilMs: number): DailyPeak[];
  /** Buckets with any per-minute or daily peak stored, sorted. */
  buckets(): string[];
  /**
   * Deletes per-minute rows of minutes starting before `beforeMs` and daily rows of days starting
   * before `dailyBeforeMs` (default `beforeMs`). Returns the number of rows deleted.
   */
  prune(beforeMs: number, dailyBeforeMs?: number): number;
  /** A named number kept beside the peaks (the auto tuner's last run day); undefined when never set. */
  getMarker(name: string): number | undefined;
  setMarker(name: string, value: number): void;
  close(): void;
}

export function minuteStartOf(ms: number): number {
  return Math.floor(ms / MINUTE_MS) * MINUTE_MS;
}

export function dayStartOf(ms: number): number {
  return Math.floor(ms / DAY_MS) * DAY_MS;
}

/** `2026-03-02` for a UTC day start. */
export function utcDate(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/**
 * `peaks` as a list, each checked by `checkPeak` before any is written: one bad entry refuses the
 * whole minute (`recordPeaks` writes nothing).
 */
export function checkedPeaks(
  minuteStartMs: number,
  peaks: Iterable<readonly [bucket: string, peakOfferedRps: number]>,
): (readonly [string, number])[] {
  const list = [...peaks];
  for (const [bucket, peak] of list) checkPeak(bucket, minuteStartMs, peak);
  return list;
}

/** Shared input checks, so every store refuses the same things with the same messages. */
export function checkPeak(bucket: string, minuteStartMs: number, peakOfferedRps: number): void {
  if (typeof bucket !== 'string' || bucket.length === 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'history: bucket must be a non-empty string', {
      field: 'bucket',
    });
  }
  if (!Number.isSafeInteger(minuteStartMs) || minuteStartMs % MINUTE_MS !== 0) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `history: minuteStartMs must be a whole minute in epoch ms, got ${minuteStartMs}`,
      { field: 'minuteStartMs', bucket },
    );
  }
  if (!Number.isFinite(peakOfferedRps) || peakOfferedRps < 0) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `history: peakOfferedRps must be a finite number >= 0, got ${peakOfferedRps}`,
      { field: 'peakOfferedRps', bucket },
    );
  }
}
