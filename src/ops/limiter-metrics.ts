import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { BucketSnapshot, GlobalLimiterSnapshot } from '../global/global-limiter.js';
import type { SpillwayMetrics } from './metrics.js';
import { bucketSeries, scalarSeries } from './snapshot-series.js';

export interface LimiterMetricsOptions {
  /**
   * Most buckets given per-bucket series (default 1,000): pinned buckets first, then the most
   * offered since they were created. Bucket keys may come from clients (the proxy renders them
   * from headers), and a full table of hostile keys exported whole costs every scrape megabytes of
   * text and a long stall of the event loop (docs/operations.md), plus series churn in Prometheus
   * as keys come and go. Buckets left out still count in the table-wide series;
   * `spillway_bucket_series_omitted` says how many.
   */
  maxBucketSeries?: number;
}

export const DEFAULT_MAX_BUCKET_SERIES = 1_000;

type Exported = GlobalLimiterSnapshot & { exported: readonly BucketSnapshot[]; omitted: number };

const perBucket = bucketSeries((s: Exported) => s.exported);

/** The buckets to export: all when within `max`, else pinned first, then by cumulative offered units. */
function selectBuckets(buckets: readonly BucketSnapshot[], max: number): readonly BucketSnapshot[] {
  if (buckets.length <= max) return buckets;
  // Stable sort: among equals (one-request keys of a flood), the oldest buckets stay, so the
  // exported set does not change from scrape to scrape.
  return [...buckets]
    .sort((a, b) => Number(b.pinned) - Number(a.pinned) || b.offered - a.offered)
    .slice(0, max);
}

/**
 * Exports a data-plane host's GlobalLimiter through `metrics`, read from `limiter.snapshot()` at
 * scrape time. Counters are cumulative since each bucket was created (an expired and re-created
 * bucket restarts from 0, which Prometheus' rate() treats as a counter reset; so does a bucket
 * that leaves and re-enters the `maxBucketSeries` exported).
 */
export function addLimiterMetrics(
  metrics: SpillwayMetrics,
  limiter: { snapshot(): GlobalLimiterSnapshot },
  options: LimiterMetricsOptions = {},
): void {
  const maxBucketSeries = options.maxBucketSeries ?? DEFAULT_MAX_BUCKET_SERIES;
  if (!Number.isInteger(maxBucketSeries) || maxBucketSeries < 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'maxBucketSeries must be a non-negative integer', {
      field: 'maxBucketSeries',
    });
  }
  metrics.addSnapshotMetrics((): Exported => {
    const snapshot = limiter.snapshot();
    const exported = selectBuckets(snapshot.buckets, maxBucketSeries);
    return { ...snapshot, exported, omitted: snapshot.buckets.length - exported.length };
  }, [
    perBucket(
      'spillway_offered_total',
      'Units that reached this host for the bucket, dropped ones included.',
      (b) => b.offered,
      'counter',
    ),
    perBucket('spillway_admitted_total', 'Units this host let through.', (b) => b.admitted, 'counter'),
    perBucket(
      'spillway_dropped_total',
      'Units this host dropped (by the drop ratio or the burst guard).',
      (b) => b.dropped + b.droppedByGuard,
      'counter',
    ),
    perBucket(
      'spillway_burst_guard_dropped_total',
      'Units dropped by the local burst guard.',
      (b) => b.droppedByGuard,
      'counter',
    ),
    perBucket(
      'spillway_burst_guard_tripped',
      "1 while the burst guard's detector has tripped and its token bucket holds this host to its allowance.",
      (b) => (b.guardTripped ? 1 : 0),
    ),
    perBucket(
      'spillway_would_drop_total',
      'Units a shadow-mode bucket would have dropped (admitted anyway).',
      (b) => b.wouldDrop,
      'counter',
    ),
    perBucket('spillway_drop_ratio', "The held directive's drop ratio.", (b) => b.dropRatio),
    perBucket(
      'spillway_effective_drop_ratio',
      'The drop ratio applied now, after the stale policy.',
      (b) => b.effectiveRatio,
    ),
    perBucket(
      'spillway_limit_rps',
      "The bucket's global limit from the last directive (0 before any).",
      (b) => b.limitRps,
    ),
    perBucket(
      'spillway_global_offered_rps',
      'The fleet-wide offered rate the controller last saw for the bucket.',
      (b) => b.globalOfferedRps,
    ),
    perBucket(
      'spillway_host_offered_rps',
      "This host's offered rate in its last reported window.",
      (b) => b.hostOfferedRps,
    ),
    perBucket('spillway_bucket_shadow', '1 when the bucket is in shadow mode, 0 when enforcing.', (b) =>
      b.mode === 'shadow' ? 1 : 0,
    ),
    perBucket(
      'spillway_directive_age_seconds',
      'Time since the held directive arrived (absent before the first).',
      (b) => (b.directiveAgeMs === undefined ? undefined : b.directiveAgeMs / 1000),
    ),
    scalarSeries(
      'spillway_stale_directives',
      'Buckets whose directive is past its TTL (the stale policy applies).',
      'gauge',
      (s) => s.buckets.reduce((n, b) => n + (b.stale ? 1 : 0), 0),
    ),
    scalarSeries('spillway_buckets', 'Buckets held by this host.', 'gauge', (s) => s.bucketCount),
    scalarSeries('spillway_buckets_max', 'Bound on buckets held by this host.', 'gauge', (s) => s.maxBuckets),
    scalarSeries(
      'spillway_bucket_series_omitted',
      'Buckets held but given no per-bucket series (more than maxBucketSeries; the least offered are left out).',
      'gauge',
      (s) => s.omitted,
    ),
    scalarSeries(
      'spillway_buckets_expired_total',
      'Buckets expired for idleness.',
      'counter',
      (s) => s.bucketsExpired,
    ),
    scalarSeries(
      'spillway_overflow_offered_total',
      'Units decided by the overflow bucket (new keys while the bucket table was full).',
      'counter',
      (s) => s.overflowOffered,
    ),
    scalarSeries(
      'spillway_reporter_consecutive_failures',
      'Reports failed in a row (0 when the last succeeded).',
      'gauge',
      (s) => s.reporter.consecutiveFailures,
    ),
    scalarSeries(
      'spillway_reporter_failovers_total',
      'Times a failed report moved reporting to the next parent.',
      'counter',
      (s) => s.reporter.failovers,
    ),
    scalarSeries(
      'spillway_reports_skipped_in_flight_total',
      'Report ticks skipped because the previous report was still in flight.',
      'counter',
      (s) => s.reporter.reportsSkippedInFlight,
    ),
    scalarSeries(
      'spillway_reports_on_reconnect_total',
      "Reports sent at once when a parent's connection came back after reports failed.",
      'counter',
      (s) => s.reporter.reportsOnReconnect,
    ),
    scalarSeries(
      'spillway_directives_applied_total',
      'Directives applied from replies.',
      'counter',
      (s) => s.reporter.directivesApplied,
    ),
    scalarSeries(
      'spillway_buckets_without_rule_total',
      'Buckets that offered load in several replies from the control plane and never got a directive: no rule of the controller matches them, so they are not limited.',
      'counter',
      (s) => s.reporter.bucketsWithoutRule,
    ),
    scalarSeries(
      'spillway_report_interval_seconds',
      'The reporting interval in use.',
      'gauge',
      (s) => s.reporter.intervalMs / 1000,
    ),
    {
      name: 'spillway_last_report_success_age_seconds',
      help: 'Time since the last successful report (absent before the first).',
      type: 'gauge',
      samples: (s) =>
        s.reporter.lastSuccessAtMs === undefined
          ? []
          : [[{}, (s.takenAtMs - s.reporter.lastSuccessAtMs) / 1000]],
    },
    scalarSeries(
      'spillway_directive_epoch',
      'Controller epoch of the last reply (0 before any).',
      'gauge',
      (s) => s.reporter.lastEpoch,
    ),
  ]);
}
