import { ErrorCode, SpillwayError } from '../../core/errors.js';
import {
  checkedPeaks,
  checkPeak,
  type DailyPeak,
  dayStartOf,
  type HistoryStore,
  type MinutePeak,
} from './history-store.js';

/**
 * A HistoryStore in process memory, for tests and the fleet simulator. Same contract as the SQLite
 * store; memory grows with what is recorded until `prune`.
 */
export function createMemoryHistoryStore(): HistoryStore {
  const minutes = new Map<string, Map<number, number>>();
  const days = new Map<string, Map<number, number>>();
  const markers = new Map<string, number>();
  let closed = false;

  function open(): void {
    if (closed) throw new SpillwayError(ErrorCode.StoreUnavailable, 'history: store is closed');
  }

  function raise(table: Map<string, Map<number, number>>, bucket: string, atMs: number, value: number): void {
    let rows = table.get(bucket);
    if (!rows) {
      rows = new Map();
      table.set(bucket, rows);
    }
    const previous = rows.get(atMs);
    if (previous === undefined || value > previous) rows.set(atMs, value);
  }

  function range(
    table: Map<string, Map<number, number>>,
    bucket: string,
    sinceMs: number,
    untilMs: number,
  ): [number, number][] {
    const rows = table.get(bucket);
    if (!rows) return [];
    return [...rows].filter(([atMs]) => atMs >= sinceMs && atMs < untilMs).sort((a, b) => a[0] - b[0]);
  }

  function prune(table: Map<string, Map<number, number>>, beforeMs: number): number {
    let deleted = 0;
    for (const [bucket, rows] of table) {
      for (const atMs of rows.keys()) {
        if (atMs < beforeMs) {
          rows.delete(atMs);
          deleted++;
        }
      }
      if (rows.size === 0) table.delete(bucket);
    }
    return deleted;
  }

  const store: HistoryStore = {
    recordPeak(bucket, minuteStartMs, peakOfferedRps) {
      open();
      checkPeak(bucket, minuteStartMs, peakOfferedRps);
      raise(minutes, bucket, minuteStartMs, peakOfferedRps);
      raise(days, bucket, dayStartOf(minuteStartMs), peakOfferedRps);
    },
    recordPeaks(minuteStartMs, peaks) {
      open();
      const list = checkedPeaks(minuteStartMs, peaks);
      for (const [bucket, peak] of list) store.recordPeak(bucket, minuteStartMs, peak);
    },
    peaks(bucket, sinceMs, untilMs): MinutePeak[] {
      open();
      return range(minutes, bucket, sinceMs, untilMs).map(([minuteStartMs, peakOfferedRps]) => ({
        minuteStartMs,
        peakOfferedRps,
      }));
    },
    dailyPeaks(bucket, sinceMs, untilMs): DailyPeak[] {
      open();
      return range(days, bucket, sinceMs, untilMs).map(([dayStartMs, peakOfferedRps]) => ({
        dayStartMs,
        peakOfferedRps,
      }));
    },
    buckets() {
      open();
      return [...new Set([...minutes.keys(), ...days.keys()])].sort();
    },
    prune(beforeMs, dailyBeforeMs = beforeMs) {
      open();
      return prune(minutes, beforeMs) + prune(days, dailyBeforeMs);
    },
    getMarker(name) {
      open();
      return markers.get(name);
    },
    setMarker(name, value) {
      open();
      markers.set(name, value);
    },
    close() {
      closed = true;
    },
  };
  return store;
}
