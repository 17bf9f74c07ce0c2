import { DAY_MS, dayStartOf, type HistoryStore, MINUTE_MS } from '../../src/control/tuning/history-store.js';

/** 2026-03-02T12:00Z, a Monday: tests run "now" here so weekdays are known. */
export const NOW_MS = Date.UTC(2026, 2, 2, 12, 0, 0);
export const TODAY_MS = dayStartOf(NOW_MS);

/** The UTC day start `daysAgo` complete days before today (1 = yesterday). */
export function dayAgo(daysAgo: number, todayMs = TODAY_MS): number {
  return todayMs - daysAgo * DAY_MS;
}

/**
 * Writes `days` days of history ending yesterday: each day gets a quiet morning and an afternoon
 * ramp whose highest minute is `peakFor(dayStartMs)`, so the daily peak is known exactly while the
 * store still sees many per-minute rows.
 */
export function recordDays(
  store: HistoryStore,
  bucket: string,
  days: number,
  peakFor: (dayStartMs: number, daysAgo: number) => number,
  todayMs = TODAY_MS,
): void {
  for (let ago = days; ago >= 1; ago--) {
    const dayStartMs = dayAgo(ago, todayMs);
    const peak = peakFor(dayStartMs, ago);
    for (let minute = 0; minute < 24 * 60; minute += 97) {
      store.recordPeak(bucket, dayStartMs + minute * MINUTE_MS, peak * 0.3);
    }
    for (let step = 0; step <= 10; step++) {
      store.recordPeak(bucket, dayStartMs + (14 * 60 + step) * MINUTE_MS, (peak * step) / 10);
    }
  }
}

/** Saturday or Sunday (UTC). */
export function isWeekend(dayStartMs: number): boolean {
  const day = new Date(dayStartMs).getUTCDay();
  return day === 0 || day === 6;
}
