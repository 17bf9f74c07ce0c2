import type { AggregatorSnapshot } from '../control/aggregator.js';
import { selectBusiest } from '../control/select-busiest.js';
import { TIER_NAMES } from '../control/tier-name.js';
import { DEFAULT_MAX_BUCKET_SERIES } from './limiter-metrics.js';
import type { Sample, SnapshotMetricDefinition, SpillwayMetrics } from './metrics.js';

/** The snapshot with `buckets` cut to the exported ones (see `addAggregatorMetrics`). */
type Exported = AggregatorSnapshot & { omittedBuckets: number };
type Definition = SnapshotMetricDefinition<Exported>;
type Bucket = AggregatorSnapshot['buckets'][number];

function perBucket(name: string, help: string, value: (b: Bucket) => number | undefined): Definition {
  return {
    name,
    help,
    type: 'gauge',
    labelNames: ['bucket'],
    samples: (s) =>
      s.buckets.flatMap((b): Sample[] => {
        const v = value(b);
        return v === undefined ? [] : [[{ bucket: b.key }, v]];
      }),
  };
}

function single(
  name: string,
  help: string,
  type: Definition['type'],
  value: (s: Exported) => number,
): Definition {
  return { name, help, type, samples: (s) => [[{}, value(s)]] };
}

/**
 * Exports a zone aggregator's view through `metrics`, read from `aggregator.snapshot()` at scrape
 * time: the zone's summed rates per bucket (what its next forward would send), the directive it
 * relays, its hosts, parents and counters.
 */
export function addAggregatorMetrics(
  metrics: SpillwayMetrics,
  aggregator: { snapshot(): AggregatorSnapshot },
  { maxBucketSeries = DEFAULT_MAX_BUCKET_SERIES }: { maxBucketSeries?: number } = {},
): void {
  metrics.addSnapshotMetrics((): Exported => {
    // Bucket keys come from hosts, and through them from clients (a proxy renders keys from
    // headers): the busiest `maxBucketSeries` get series, the rest are counted.
    const snapshot = aggregator.snapshot();
    const buckets = selectBusiest(snapshot.buckets, maxBucketSeries, (b) => b.offeredRps);
    return { ...snapshot, buckets, omittedBuckets: snapshot.buckets.length - buckets.length };
  }, [
    perBucket(
      'spillway_aggregator_offered_rps',
      "Zone's offered rate: sum over counted hosts.",
      (b) => b.offeredRps,
    ),
    perBucket(
      'spillway_aggregator_admitted_rps',
      "Zone's admitted rate: sum over counted hosts.",
      (b) => b.admittedRps,
    ),
    perBucket('spillway_aggregator_would_drop_rps', "Zone's shadow would-drop rate.", (b) => b.wouldDropRps),
    perBucket('spillway_aggregator_bucket_hosts', 'Counted hosts reporting the bucket.', (b) => b.hosts),
    perBucket(
      'spillway_aggregator_drop_ratio',
      'Drop ratio of the directive relayed to hosts.',
      (b) => b.directive?.dropRatio,
    ),
    perBucket(
      'spillway_aggregator_limit_rps',
      'Limit in the directive relayed to hosts.',
      (b) => b.directive?.limitRps,
    ),
    perBucket(
      'spillway_aggregator_directive_ttl_seconds',
      'TTL left on the relayed directive (0: stale, no longer relayed).',
      (b) => (b.directive ? b.directive.remainingTtlMs / 1000 : undefined),
    ),
    single(
      'spillway_aggregator_hosts',
      'Children tracked (hosts or lower aggregators).',
      'gauge',
      (s) => s.hosts.length,
    ),
    single(
      'spillway_aggregator_counted_hosts',
      'Children within their grace period, counted in forwards.',
      'gauge',
      (s) => s.hosts.reduce((n, h) => n + (h.counted ? 1 : 0), 0),
    ),
    single(
      'spillway_aggregator_represented_hosts',
      'Data-plane hosts the counted children speak for.',
      'gauge',
      (s) => s.hosts.reduce((n, h) => n + (h.counted ? h.hostCount : 0), 0),
    ),
    {
      name: 'spillway_aggregator_parent_healthy',
      help: '1 when the parent answered the last forward sent to it.',
      type: 'gauge',
      labelNames: ['parent'],
      samples: (s) => s.parents.map((p): Sample => [{ parent: p.target }, p.healthy ? 1 : 0]),
    },
    {
      name: 'spillway_aggregator_last_forward_age_seconds',
      help: 'Time since the last forward to a parent (absent before the first).',
      type: 'gauge',
      samples: (s) => (s.lastForward ? [[{}, (s.nowMs - s.lastForward.atMs) / 1000]] : []),
    },
    single(
      'spillway_aggregator_interval_seconds',
      'Forward interval in use.',
      'gauge',
      (s) => s.intervalMs / 1000,
    ),
    single(
      'spillway_aggregator_reports_total',
      'Reports accepted from children (duplicates included).',
      'counter',
      (s) => s.counters.reports,
    ),
    single(
      'spillway_aggregator_duplicate_reports_total',
      'Reports already counted.',
      'counter',
      (s) => s.counters.duplicateReports,
    ),
    single(
      'spillway_aggregator_late_reports_total',
      'Reports left out of the sums as old: older than one already applied, or more than an interval later than their sender usually arrives (held back by a partition).',
      'counter',
      (s) => s.counters.lateReports,
    ),
    {
      name: 'spillway_aggregator_rejected_reports_total',
      help: 'Reports refused, by error code.',
      type: 'counter',
      labelNames: ['code'],
      samples: (s) => Object.entries(s.counters.rejectedReports).map(([code, n]): Sample => [{ code }, n]),
    },
    {
      name: 'spillway_aggregator_reporter_cap_clipped_total',
      help: "Children's bucket usages scaled down by the reporter cap in a forward, by the child's tier.",
      type: 'counter',
      labelNames: ['tier'],
      samples: (s) => TIER_NAMES.map((tier): Sample => [{ tier }, s.counters.clippedUsages[tier] ?? 0]),
    },
    single(
      'spillway_aggregator_forwards_total',
      'Forwards to parents.',
      'counter',
      (s) => s.counters.forwards,
    ),
    single(
      'spillway_aggregator_forward_failures_total',
      'Forwards that every parent refused or timed out.',
      'counter',
      (s) => s.counters.forwardFailures,
    ),
    single(
      'spillway_aggregator_parent_failures_total',
      'Single forward attempts that failed.',
      'counter',
      (s) => s.counters.parentFailures,
    ),
    single(
      'spillway_aggregator_skipped_forwards_total',
      'Forward ticks skipped because the previous forward was in flight.',
      'counter',
      (s) => s.counters.skippedForwards,
    ),
    single(
      'spillway_aggregator_reconnect_forwards_total',
      "Forwards sent at once when a parent's connection came back while no parent answered.",
      'counter',
      (s) => s.counters.reconnectForwards,
    ),
    single(
      'spillway_aggregator_cold_forwards_total',
      'Forwards sent at once because a host reported while no directive was fresh (one per such spell).',
      'counter',
      (s) => s.counters.coldForwards,
    ),
    single(
      'spillway_aggregator_outdated_directives_total',
      'Directives ignored as older than the one cached.',
      'counter',
      (s) => s.counters.staleDirectives,
    ),
    single(
      'spillway_aggregator_withheld_directives_total',
      'Cached directives left out of a reply to a host back in the sums: computed without it, they would loosen its ratio.',
      'counter',
      (s) => s.counters.withheldDirectives,
    ),
    single(
      'spillway_aggregator_buckets_over_capacity_total',
      'New bucket keys refused because the bucket table was full.',
      'counter',
      (s) => s.counters.bucketsOverCapacity,
    ),
    single(
      'spillway_aggregator_buckets_left_out_of_forwards_total',
      'Buckets left out of a forward because it held maxBucketsPerForward busier ones (one per bucket and forward).',
      'counter',
      (s) => s.counters.bucketsLeftOutOfForwards,
    ),
    single(
      'spillway_aggregator_bucket_series_omitted',
      'Buckets tracked but given no per-bucket series (more than maxBucketSeries; the least offered are left out).',
      'gauge',
      (s) => s.omittedBuckets,
    ),
    single(
      'spillway_aggregator_expired_hosts_total',
      'Children forgotten after going silent.',
      'counter',
      (s) => s.counters.expiredHosts,
    ),
    single(
      'spillway_aggregator_held_out_reporters_total',
      'Reporters held out of the sums on joining because the aggregator they came from still counts them.',
      'counter',
      (s) => s.counters.heldOutReporters,
    ),
  ]);
}
