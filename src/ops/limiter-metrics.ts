import type { GlobalLimiterSnapshot } from '../global/global-limiter.js';
import type { Sample, SnapshotMetricDefinition, SpillwayMetrics } from './metrics.js';

type Definition = SnapshotMetricDefinition<GlobalLimiterSnapshot>;

/** Per-bucket series from a limiter snapshot: one sample per bucket, labelled `bucket`. */
function perBucket(
  name: string,
  help: string,
  type: Definition['type'],
  value: (bucket: GlobalLimiterSnapshot['buckets'][number], snapshot: GlobalLimiterSnapshot) => number,
): Definition {
  return {
    name,
    help,
    type,
    labelNames: ['bucket'],
    samples: (snapshot) => snapshot.buckets.map((b): Sample => [{ bucket: b.key }, value(b, snapshot)]),
  };
}

function single(
  name: string,
  help: string,
  type: Definition['type'],
  value: (s: GlobalLimiterSnapshot) => number,
) {
  return {
    name,
    help,
    type,
    samples: (s: GlobalLimiterSnapshot): Sample[] => [[{}, value(s)]],
  } satisfies Definition;
}

/**
 * Exports a data-plane host's GlobalLimiter through `metrics`, read from `limiter.snapshot()` at
 * scrape time. Counters are cumulative since each bucket was created (an expired and re-created
 * bucket restarts from 0, which Prometheus' rate() treats as a counter reset).
 */
export function addLimiterMetrics(
  metrics: SpillwayMetrics,
  limiter: { snapshot(): GlobalLimiterSnapshot },
): void {
  metrics.addSnapshotMetrics(
    () => limiter.snapshot(),
    [
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
          s.buckets
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
        'spillway_directives_applied_total',
        'Directives applied from replies.',
        'counter',
        (s) => s.reporter.directivesApplied,
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
    ],
  );
}
