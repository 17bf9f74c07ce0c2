import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { BucketSnapshot, GlobalLimiterSnapshot } from '../global/global-limiter.js';
import type { Sample, SnapshotMetricDefinition, SpillwayMetrics } from './metrics.js';

export interface LimiterMetricsOptions {
  /**
   * Most buckets given per-bucket series (default 1,000): pinned buckets first, then the most
   * offered since they were created. Bucket keys may come from clients (the proxy renders them
   * from headers), and a full table of 10,000 hostile keys exported whole is ~19 MB of text per
   * scrape, ~0.4 s of event loop and a few hundred MB of transient heap each time (measured in
   * bench/results/cardinality.md), plus series churn in Prometheus as keys come and go. Buckets
   * left out still count in the table-wide series; `spillway_bucket_series_omitted` says how many.
   */
  maxBucketSeries?: number;
}

export const DEFAULT_MAX_BUCKET_SERIES = 1_000;

type Exported = GlobalLimiterSnapshot & { exported: readonly BucketSnapshot[]; omitted: number };
type Definition = SnapshotMetricDefinition<Exported>;

/** Per-bucket series from a limiter snapshot: one sample per exported bucket, labelled `bucket`. */
function perBucket(
  name: string,
  help: string,
  type: Definition['type'],
  value: (bucket: BucketSnapshot, snapshot: GlobalLimiterSnapshot) => number,
): Definition {
  return {
    name,
    help,
    type,
    labelNames: ['bucket'],
    samples: (snapshot) => snapshot.exported.map((b): Sample => [{ bucket: b.key }, value(b, snapshot)]),
  };
}

/** The buckets to export: all when within `max`, else pinned first, then by cumulative offered units. */
function selectBuckets(buckets: readonly BucketSnapshot[], max: number): readonly BucketSnapshot[] {
  if (buckets.length <= max) return buckets;
  // Stable sort: among equals (one-request keys of a flood), the oldest buckets stay, so the
  // exported set does not change from scrape to scrape.
  return [...buckets]
    .sort((a, b) => Number(b.pinned) - Number(a.pinned) || b.offered - a.offered)
    .slice(0, max);
}

function single(name: string, help: string, type: Definition['type'], value: (s: Exported) => number) {
  return {
    name,
    help,
    type,
    samples: (s: Exported): Sample[] => [[{}, value(s)]],
  } satisfies Definition;
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
      'counter',
      (b) => b.offered,
    ),
    perBucket('spillway_admitted_total', 'Units this host let through.', 'counter', (b) => b.admitted),
    perBucket(
      'spillway_dropped_total',
      'Units this host dropped (by the drop ratio or the burst guard).',
      'counter',
      (b) => b.dropped + b.droppedByGuard,
    ),
    perBucket(
      'spillway_burst_guard_dropped_total',
      'Units dropped by the local burst guard.',
      'counter',
      (b) => b.droppedByGuard,
    ),
    perBucket(
      'spillway_burst_guard_tripped',
      "1 while the burst guard's detector has tripped and its token bucket holds this host to its allowance.",
      'gauge',
      (b) => (b.guardTripped ? 1 : 0),
    ),
    perBucket(
      'spillway_would_drop_total',
      'Units a shadow-mode bucket would have dropped (admitted anyway).',
      'counter',
      (b) => b.wouldDrop,
    ),
    perBucket('spillway_drop_ratio', "The held directive's drop ratio.", 'gauge', (b) => b.dropRatio),
    perBucket(
      'spillway_effective_drop_ratio',
      'The drop ratio applied now, after the stale policy.',
      'gauge',
      (b) => b.effectiveRatio,
    ),
    perBucket(
      'spillway_limit_rps',
      "The bucket's global limit from the last directive (0 before any).",
      'gauge',
      (b) => b.limitRps,
    ),
    perBucket(
      'spillway_global_offered_rps',
      'The fleet-wide offered rate the controller last saw for the bucket.',
      'gauge',
      (b) => b.globalOfferedRps,
    ),
    perBucket(
      'spillway_host_offered_rps',
      "This host's offered rate in its last reported window.",
      'gauge',
      (b) => b.hostOfferedRps,
    ),
    perBucket(
      'spillway_bucket_shadow',
      '1 when the bucket is in shadow mode, 0 when enforcing.',
      'gauge',
      (b) => (b.mode === 'shadow' ? 1 : 0),
    ),
    {
      name: 'spillway_directive_age_seconds',
      help: 'Time since the held directive arrived (absent before the first).',
      type: 'gauge',
      labelNames: ['bucket'],
      samples: (s) =>
        s.exported
          .filter((b) => b.directiveAgeMs !== undefined)
          .map((b): Sample => [{ bucket: b.key }, b.directiveAgeMs! / 1000]),
    },
    single(
      'spillway_stale_directives',
      'Buckets whose directive is past its TTL (the stale policy applies).',
      'gauge',
      (s) => s.buckets.reduce((n, b) => n + (b.stale ? 1 : 0), 0),
    ),
    single('spillway_buckets', 'Buckets held by this host.', 'gauge', (s) => s.bucketCount),
    single('spillway_buckets_max', 'Bound on buckets held by this host.', 'gauge', (s) => s.maxBuckets),
    single(
      'spillway_bucket_series_omitted',
      'Buckets held but given no per-bucket series (more than maxBucketSeries; the least offered are left out).',
      'gauge',
      (s) => s.omitted,
    ),
    single(
      'spillway_buckets_expired_total',
      'Buckets expired for idleness.',
      'counter',
      (s) => s.bucketsExpired,
    ),
    single(
      'spillway_overflow_offered_total',
      'Units decided by the overflow bucket (new keys while the bucket table was full).',
      'counter',
      (s) => s.overflowOffered,
    ),
    single(
      'spillway_reporter_consecutive_failures',
      'Reports failed in a row (0 when the last succeeded).',
      'gauge',
      (s) => s.reporter.consecutiveFailures,
    ),
    single(
      'spillway_reporter_failovers_total',
      'Times a failed report moved reporting to the next parent.',
      'counter',
      (s) => s.reporter.failovers,
    ),
    single(
      'spillway_reports_skipped_in_flight_total',
      'Report ticks skipped because the previous report was still in flight.',
      'counter',
      (s) => s.reporter.reportsSkippedInFlight,
    ),
    single(
      'spillway_reports_on_reconnect_total',
      "Reports sent at once when a parent's connection came back after reports failed.",
      'counter',
      (s) => s.reporter.reportsOnReconnect,
    ),
    single(
      'spillway_directives_applied_total',
      'Directives applied from replies.',
      'counter',
      (s) => s.reporter.directivesApplied,
    ),
    single(
      'spillway_buckets_without_rule_total',
      'Buckets that offered load in several replies from the control plane and never got a directive: no rule of the controller matches them, so they are not limited.',
      'counter',
      (s) => s.reporter.bucketsWithoutRule,
    ),
    single(
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
    single(
      'spillway_directive_epoch',
      'Controller epoch of the last reply (0 before any).',
      'gauge',
      (s) => s.reporter.lastEpoch,
    ),
  ]);
}
