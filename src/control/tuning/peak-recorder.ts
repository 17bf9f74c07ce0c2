import { assertKnownOptions, optionNames } from '../../core/validate.js';
import { DAY_MS, dayStartOf, type HistoryStore, minuteStartOf } from './history-store.js';

/** Marker in the history store: the UTC day start of the last minute written. */
export const LAST_WRITTEN_DAY_MARKER = 'peaks.lastWrittenDayStartMs';

export interface PeakRecorderOptions {
  store: HistoryStore;
  /** Most buckets tracked within one minute; past it new keys are not recorded (counted). Default 200,000. */
  maxBuckets?: number;
  /** Per-minute rows older than this are pruned (charts). Default 8 days. */
  minuteRetentionMs?: number;
  /** Daily rows older than this are pruned (tuning reads weeks of them). Default 12 weeks. */
  dailyRetentionMs?: number;
  /** A store write failed: recording goes on (the minute is lost), the controller never notices. */
  onError?: (error: unknown) => void;
}

/** What the recorder reads from a controller snapshot (a `ControllerSnapshot` fits). */
export interface PeakSnapshot {
  nowMs: number;
  buckets: readonly {
    key: string;
    /** The rule that matched; a template's instances (rule !== key) are not recorded. */
    rule?: string;
    offeredRps: number;
    scope: 'global' | 'zone';
    zones?: readonly { offeredRps: number }[];
  }[];
}

export interface PeakRecorderStats {
  /** Minutes written to the store. */
  flushedMinutes: number;
  /** Minute flushes the store refused (their peaks are lost). */
  failedFlushes: number;
  /** Bucket observations ignored because `maxBuckets` distinct keys were tracked this minute. */
  bucketsOverCapacity: number;
  /** Buckets tracked in the current minute. */
  trackedBuckets: number;
}

export interface PeakRecorder {
  /**
   * Feed one controller snapshot (every tick, or every interval). The snapshot's `nowMs` sets the
   * minute; when it moves into a new minute the previous one is flushed to the store first.
   */
  observe(snapshot: PeakSnapshot): void;
  /** Write the current, incomplete minute now (shutdown). Later observations of it upsert the max. */
  flush(): void;
  stats(): PeakRecorderStats;
}

const DEFAULT_MAX_BUCKETS = 200_000;
const DEFAULT_MINUTE_RETENTION_MS = 8 * DAY_MS;
const DEFAULT_DAILY_RETENTION_MS = 84 * DAY_MS;

/**
 * Tracks, per exact-key bucket, the highest offered rate seen in the current minute and writes it to
 * the history store when the minute ends. Memory holds one minute: at most `maxBuckets` numbers.
 *
 * Zone-scoped buckets record their busiest zone's rate: their limit applies in each zone, so that is
 * the rate a limit must be sized for. Global buckets record the fleet-wide offered rate, dropped
 * requests included (demand, not what the current limit let through).
 *
 * Pruning runs on the first flush of a UTC day that follows the day of the last flush (kept in the
 * store, so a controller stopped every night, or restarted, prunes as one that never stops), never
 * after a jump: one reading of a clock gone days ahead (a VM resumed, a controller started before its
 * clock was set) would otherwise delete weeks of history at once. After a gap of more than a day
 * (the controller down, or the jump) the next day prunes. Store failures are reported to `onError`
 * and counted; they never throw into the caller (the controller's loop).
 */
const PEAK_RECORDER_OPTIONS = optionNames<PeakRecorderOptions>({
  store: true,
  maxBuckets: true,
  minuteRetentionMs: true,
  dailyRetentionMs: true,
  onError: true,
});

export function createPeakRecorder(options: PeakRecorderOptions): PeakRecorder {
  assertKnownOptions(options, PEAK_RECORDER_OPTIONS, 'createPeakRecorder');
  const store = options.store;
  const maxBuckets = options.maxBuckets ?? DEFAULT_MAX_BUCKETS;
  const minuteRetentionMs = options.minuteRetentionMs ?? DEFAULT_MINUTE_RETENTION_MS;
  const dailyRetentionMs = options.dailyRetentionMs ?? DEFAULT_DAILY_RETENTION_MS;
  let currentMinuteMs: number | undefined;
  let peaks = new Map<string, number>();
  /** The UTC day of the last write, kept in the store so a restart (or a nightly stop) carries it. */
  let lastWrittenDay: number | undefined;
  const counters = { flushedMinutes: 0, failedFlushes: 0, bucketsOverCapacity: 0 };

  function write(minuteStartMs: number, minutePeaks: Map<string, number>): void {
    if (minutePeaks.size === 0) return;
    try {
      store.recordPeaks(minuteStartMs, minutePeaks);
      counters.flushedMinutes++;
      const day = dayStartOf(minuteStartMs);
      lastWrittenDay ??= store.getMarker(LAST_WRITTEN_DAY_MARKER);
      if (day !== lastWrittenDay) {
        const previousDay = lastWrittenDay;
        lastWrittenDay = day;
        store.setMarker(LAST_WRITTEN_DAY_MARKER, day);
        // The day after the last one written, and only then: one reading of a clock gone days
        // ahead (or behind) moves the marker without pruning, and the next day prunes.
        if (previousDay !== undefined && day === previousDay + DAY_MS) {
          store.prune(minuteStartMs - minuteRetentionMs, minuteStartMs - dailyRetentionMs);
        }
      }
    } catch (error) {
      counters.failedFlushes++;
      options.onError?.(error);
    }
  }

  return {
    observe(snapshot) {
      const minuteMs = minuteStartOf(snapshot.nowMs);
      if (currentMinuteMs !== undefined && minuteMs !== currentMinuteMs) {
        // A clock stepping back is treated like any other minute change: the store keeps the max.
        write(currentMinuteMs, peaks);
        peaks = new Map();
      }
      currentMinuteMs = minuteMs;
      for (const bucket of snapshot.buckets) {
        // Tuning reads exact-key rules only, and a template's instances are keys callers choose:
        // recording them would let a key-rotating client grow the history file without bound.
        if (bucket.rule !== undefined && bucket.rule !== bucket.key) continue;
        let rps = bucket.offeredRps;
        if (bucket.scope === 'zone' && bucket.zones) {
          rps = 0;
          for (const zone of bucket.zones) if (zone.offeredRps > rps) rps = zone.offeredRps;
        }
        if (!Number.isFinite(rps) || rps < 0) continue;
        const previous = peaks.get(bucket.key);
        if (previous === undefined) {
          if (peaks.size >= maxBuckets) {
            counters.bucketsOverCapacity++;
            continue;
          }
          peaks.set(bucket.key, rps);
        } else if (rps > previous) {
          peaks.set(bucket.key, rps);
        }
      }
    },
    flush() {
      if (currentMinuteMs !== undefined) write(currentMinuteMs, peaks);
    },
    stats() {
      return { ...counters, trackedBuckets: peaks.size };
    },
  };
}
