import type { AggregatorSnapshot } from '../control/aggregator.js';
import { DEFAULT_MAX_BUCKET_SERIES } from './limiter-metrics.js';
import type { Sample, SpillwayMetrics } from './metrics.js';
import {
  addReceivingTierMetrics,
  type BusiestExported,
  bucketSeries,
  bucketSeriesOmitted,
  reportIntakeSeries,
  scalarSeries,
} from './snapshot-series.js';

type Exported = BusiestExported<AggregatorSnapshot>;

const perBucket = bucketSeries((s: Exported) => s.buckets);

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
  addReceivingTierMetrics(metrics, 'aggregator', aggregator, maxBucketSeries, [
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
    scalarSeries(
      'spillway_aggregator_hosts',
      'Children tracked (hosts or lower aggregators).',
      'gauge',
      (s) => s.hosts.length,
    ),
    scalarSeries(
      'spillway_aggregator_counted_hosts',
      'Children within their grace period, counted in forwards.',
      'gauge',
      (s) => s.hosts.reduce((n, h) => n + (h.counted ? 1 : 0), 0),
    ),
    scalarSeries(
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
    ...reportIntakeSeries<Exported>('aggregator', {
      interval: 'Forward interval in use.',
      reports: 'Reports accepted from children (duplicates included).',
      duplicateReports: 'Reports already counted.',
      reporterCapClipped:
        "Children's bucket usages scaled down by the reporter cap in a forward, by the child's tier.",
    }),
    scalarSeries(
      'spillway_aggregator_forwards_total',
      'Forwards to parents.',
      'counter',
      (s) => s.counters.forwards,
    ),
    scalarSeries(
      'spillway_aggregator_forward_failures_total',
      'Forwards that every parent refused or timed out.',
      'counter',
      (s) => s.counters.forwardFailures,
    ),
    scalarSeries(
      'spillway_aggregator_parent_failures_total',
      'Single forward attempts that failed.',
      'counter',
      (s) => s.counters.parentFailures,
    ),
    scalarSeries(
      'spillway_aggregator_skipped_forwards_total',
      'Forward ticks skipped because the previous forward was in flight.',
      'counter',
      (s) => s.counters.skippedForwards,
    ),
    scalarSeries(
      'spillway_aggregator_reconnect_forwards_total',
      "Forwards sent at once when a parent's connection came back while no parent answered.",
      'counter',
      (s) => s.counters.reconnectForwards,
    ),
    scalarSeries(
      'spillway_aggregator_cold_forwards_total',
      'Forwards sent at once because a host reported while no directive was fresh (one per such spell).',
      'counter',
      (s) => s.counters.coldForwards,
    ),
    scalarSeries(
      'spillway_aggregator_outdated_directives_total',
      'Directives ignored as older than the one cached.',
      'counter',
      (s) => s.counters.staleDirectives,
    ),
    scalarSeries(
      'spillway_aggregator_withheld_directives_total',
      'Cached directives left out of a reply to a host back in the sums: computed without it, they would loosen its ratio.',
      'counter',
      (s) => s.counters.withheldDirectives,
    ),
    scalarSeries(
      'spillway_aggregator_buckets_over_capacity_total',
      'New bucket keys refused because the bucket table was full.',
      'counter',
      (s) => s.counters.bucketsOverCapacity,
    ),
    scalarSeries(
      'spillway_aggregator_buckets_left_out_of_forwards_total',
      'Buckets left out of a forward because it held maxBucketsPerForward busier ones (one per bucket and forward).',
      'counter',
      (s) => s.counters.bucketsLeftOutOfForwards,
    ),
    bucketSeriesOmitted('aggregator'),
    scalarSeries(
      'spillway_aggregator_expired_hosts_total',
      'Children forgotten after going silent.',
      'counter',
      (s) => s.counters.expiredHosts,
    ),
    scalarSeries(
      'spillway_aggregator_held_out_reporters_total',
      'Reporters held out of the sums on joining because the aggregator they came from still counts them.',
      'counter',
      (s) => s.counters.heldOutReporters,
    ),
  ]);
}
