import type { ControllerSnapshot } from '../control/controller.js';
import { tierName } from '../control/tier-name.js';
import { DEFAULT_MAX_BUCKET_SERIES } from './limiter-metrics.js';
import type { Sample, SnapshotMetricDefinition, SpillwayMetrics } from './metrics.js';
import {
  addReceivingTierMetrics,
  type BusiestExported,
  bucketSeries,
  bucketSeriesOmitted,
  reportIntakeSeries,
  scalarSeries,
} from './snapshot-series.js';

type Exported = BusiestExported<ControllerSnapshot>;
type Definition = SnapshotMetricDefinition<Exported>;
type Bucket = ControllerSnapshot['buckets'][number];

const perBucket = bucketSeries((s: Exported) => s.buckets);

function perZone(
  name: string,
  help: string,
  value: (z: NonNullable<Bucket['zones']>[number]) => number,
): Definition {
  return {
    name,
    help,
    type: 'gauge',
    labelNames: ['bucket', 'zone'],
    samples: (s) =>
      s.buckets.flatMap((b) =>
        (b.zones ?? []).map((z): Sample => [{ bucket: b.key, zone: z.zone }, value(z)]),
      ),
  };
}

/**
 * Exports a controller's view through `metrics`, read from `controller.snapshot()` at scrape time:
 * per bucket the fleet-wide rates it computed ratios from (as of its last tick), the ratio, the
 * limit and the mode; per zone the same for zone-scoped buckets; its children and counters.
 */
export function addControllerMetrics(
  metrics: SpillwayMetrics,
  controller: { snapshot(): ControllerSnapshot },
  { maxBucketSeries = DEFAULT_MAX_BUCKET_SERIES }: { maxBucketSeries?: number } = {},
): void {
  addReceivingTierMetrics(metrics, 'controller', controller, maxBucketSeries, [
    perBucket(
      'spillway_controller_drop_ratio',
      'Drop ratio sent in directives (zone scope: the highest zone ratio).',
      (b) => b.dropRatio,
    ),
    perBucket('spillway_controller_limit_rps', 'Configured limit of the bucket.', (b) => b.limitRps),
    perBucket(
      'spillway_controller_bucket_shadow',
      '1 when the bucket is in shadow mode, 0 when enforcing.',
      (b) => (b.mode === 'shadow' ? 1 : 0),
    ),
    perBucket(
      'spillway_controller_bucket_children',
      'Fresh children that reported the bucket at the last tick.',
      (b) => b.children,
    ),
    perZone(
      'spillway_controller_zone_offered_rps',
      'Zone-scoped buckets: offered rate in the zone.',
      (z) => z.offeredRps,
    ),
    perZone(
      'spillway_controller_zone_admitted_rps',
      'Zone-scoped buckets: admitted rate in the zone.',
      (z) => z.admittedRps,
    ),
    perZone(
      'spillway_controller_zone_drop_ratio',
      "Zone-scoped buckets: the zone's drop ratio.",
      (z) => z.dropRatio,
    ),
    {
      name: 'spillway_controller_children',
      help: 'Children (hosts or aggregators) tracked, by tier.',
      type: 'gauge',
      labelNames: ['tier'],
      samples: (s) => {
        const byTier = new Map<string, number>();
        for (const c of s.children) {
          const tier = tierName(c.tier);
          byTier.set(tier, (byTier.get(tier) ?? 0) + 1);
        }
        return [...byTier].map(([tier, n]): Sample => [{ tier }, n]);
      },
    },
    scalarSeries(
      'spillway_controller_hosts',
      'Data-plane hosts the children speak for (sum of host_count).',
      'gauge',
      (s) => s.children.reduce((n, c) => n + c.hostCount, 0),
    ),
    scalarSeries('spillway_controller_buckets', 'Buckets tracked.', 'gauge', (s) => s.bucketCount),
    bucketSeriesOmitted('controller'),
    scalarSeries(
      'spillway_controller_epoch',
      "This controller generation's epoch (its start time in ms times 1024, plus 10 random bits).",
      'gauge',
      (s) => s.epoch,
    ),
    scalarSeries(
      'spillway_controller_version',
      'Ratio computations so far in this epoch.',
      'gauge',
      (s) => s.version,
    ),
    ...reportIntakeSeries<Exported>('controller', {
      interval: 'Reporting and computing interval from the limits file.',
      reports: 'Reports accepted (duplicates included).',
      duplicateReports: 'Reports already counted (same reporter and sequence).',
      reporterCapClipped:
        "Children's bucket usages scaled down by the reporter cap, by the child's tier " +
        '(counted each time a sum uses them: every tick, and every report with a stateless policy).',
    }),
    scalarSeries(
      'spillway_controller_unknown_buckets_total',
      'Reported bucket entries that matched no rule.',
      'counter',
      (s) => s.counters.unknownBuckets,
    ),
    scalarSeries(
      'spillway_controller_buckets_over_capacity_total',
      'New bucket keys refused because the bucket table was full.',
      'counter',
      (s) => s.counters.bucketsOverCapacity,
    ),
    scalarSeries(
      'spillway_controller_instances_over_capacity_total',
      "New template instances refused by the template's maxInstances.",
      'counter',
      (s) => s.counters.instancesOverCapacity,
    ),
    scalarSeries(
      'spillway_controller_expired_children_total',
      'Children forgotten after going silent.',
      'counter',
      (s) => s.counters.expiredChildren,
    ),
    scalarSeries(
      'spillway_controller_expired_buckets_total',
      'Buckets forgotten after nobody reported them.',
      'counter',
      (s) => s.counters.expiredBuckets,
    ),
    scalarSeries(
      'spillway_controller_ticks_total',
      'Ratio computations.',
      'counter',
      (s) => s.counters.ticks,
    ),
  ]);
}
