import { selectBusiest } from '../control/select-busiest.js';
import { TIER_NAMES, type TierName } from '../control/tier-name.js';
import type { Sample, SnapshotMetricDefinition, SpillwayMetrics } from './metrics.js';

/**
 * Series definitions read from a component's snapshot, shared by the metrics of every tier: the
 * data-plane host (limiter-metrics.ts), the aggregator and the controller.
 */

/** One unlabelled series: `value` of the snapshot. */
export function scalarSeries<S>(
  name: string,
  help: string,
  type: SnapshotMetricDefinition<S>['type'],
  value: (snapshot: S) => number,
): SnapshotMetricDefinition<S> {
  return { name, help, type, samples: (snapshot) => [[{}, value(snapshot)]] };
}

/** A definition with one sample per bucket, labelled `bucket`; `value` undefined: no sample. */
export type BucketSeries<S, B> = (
  name: string,
  help: string,
  value: (bucket: B, snapshot: S) => number | undefined,
  type?: SnapshotMetricDefinition<S>['type'],
) => SnapshotMetricDefinition<S>;

/** Makes per-bucket definitions over the buckets `exported` picks from a snapshot (gauges by default). */
export function bucketSeries<S, B extends { readonly key: string }>(
  exported: (snapshot: S) => readonly B[],
): BucketSeries<S, B> {
  return (name, help, value, type = 'gauge') => ({
    name,
    help,
    type,
    labelNames: ['bucket'],
    samples: (snapshot) =>
      exported(snapshot).flatMap((bucket): Sample[] => {
        const v = value(bucket, snapshot);
        return v === undefined ? [] : [[{ bucket: bucket.key }, v]];
      }),
  });
}

/** A receiving tier's snapshot with `buckets` cut to the exported ones (`exportBusiest`). */
export type BusiestExported<S> = S & {
  /** Every bucket tracked, exported or not. */
  bucketCount: number;
  /** Buckets tracked but given no series. */
  omittedBuckets: number;
};

/**
 * `snapshot` with only its busiest `maxBucketSeries` buckets by offered rate (in their order). A
 * receiving tier's bucket keys come from its children, and through them from clients (a proxy
 * renders keys from headers; a template's instances are keys clients choose): the busiest get
 * series, the rest are counted (`bucketSeriesOmitted`).
 */
export function exportBusiest<S extends { buckets: readonly B[] }, B extends { offeredRps: number }>(
  snapshot: S,
  maxBucketSeries: number,
): BusiestExported<S> {
  const buckets = selectBusiest(snapshot.buckets, maxBucketSeries, (bucket) => bucket.offeredRps);
  return {
    ...snapshot,
    buckets,
    bucketCount: snapshot.buckets.length,
    omittedBuckets: snapshot.buckets.length - buckets.length,
  };
}

/** `spillway_<tier>_bucket_series_omitted`: the count `exportBusiest` left out. */
export function bucketSeriesOmitted<S extends { omittedBuckets: number }>(
  tier: ReceivingTier,
): SnapshotMetricDefinition<S> {
  return scalarSeries(
    `spillway_${tier}_bucket_series_omitted`,
    'Buckets tracked but given no per-bucket series (more than maxBucketSeries; the least offered are left out).',
    'gauge',
    (s) => s.omittedBuckets,
  );
}

/** The rates a receiving tier sums per bucket from its children's reports. */
export interface SummedRates {
  readonly key: string;
  readonly offeredRps: number;
  readonly admittedRps: number;
  readonly wouldDropRps: number;
}

/**
 * A receiving tier's summed rates per exported bucket: `spillway_<tier>_offered_rps`,
 * `_admitted_rps` and `_would_drop_rps`, each worded by `help`.
 */
export function summedRateSeries<S extends { buckets: readonly SummedRates[] }>(
  tier: ReceivingTier,
  help: { offered: string; admitted: string; wouldDrop: string },
): SnapshotMetricDefinition<S>[] {
  const perBucket = bucketSeries((s: S) => s.buckets);
  return [
    perBucket(`spillway_${tier}_offered_rps`, help.offered, (b) => b.offeredRps),
    perBucket(`spillway_${tier}_admitted_rps`, help.admitted, (b) => b.admittedRps),
    perBucket(`spillway_${tier}_would_drop_rps`, help.wouldDrop, (b) => b.wouldDropRps),
  ];
}

/** A tier that receives reports, and names its series after itself. */
export type ReceivingTier = 'aggregator' | 'controller';

/** The report-intake counters every receiving tier keeps (control/'s report intake). */
export interface ReportIntakeCounters {
  reports: number;
  duplicateReports: number;
  lateReports: number;
  rejectedReports: Record<string, number>;
  clippedUsages: Partial<Record<TierName, number>>;
}

/** How a tier words the intake series whose meaning differs between tiers. */
export interface ReportIntakeHelp {
  /** Of `spillway_<tier>_interval_seconds`, the interval in use. */
  interval: string;
  reports: string;
  duplicateReports: string;
  reporterCapClipped: string;
}

/**
 * The report-intake series of a receiving tier, `spillway_<tier>_`: the interval in use, reports accepted, duplicates,
 * late reports, rejected reports by error code, and usages the reporter cap clipped by the
 * child's tier (every tier listed, 0 included).
 */
export function reportIntakeSeries<S extends { counters: ReportIntakeCounters; intervalMs: number }>(
  tier: ReceivingTier,
  help: ReportIntakeHelp,
): SnapshotMetricDefinition<S>[] {
  return [
    scalarSeries(`spillway_${tier}_interval_seconds`, help.interval, 'gauge', (s) => s.intervalMs / 1000),
    scalarSeries(`spillway_${tier}_reports_total`, help.reports, 'counter', (s) => s.counters.reports),
    scalarSeries(
      `spillway_${tier}_duplicate_reports_total`,
      help.duplicateReports,
      'counter',
      (s) => s.counters.duplicateReports,
    ),
    scalarSeries(
      `spillway_${tier}_late_reports_total`,
      'Reports left out of the sums as old: older than one already applied, or more than an interval later than their sender usually arrives (held back by a partition).',
      'counter',
      (s) => s.counters.lateReports,
    ),
    {
      name: `spillway_${tier}_rejected_reports_total`,
      help: 'Reports refused, by error code.',
      type: 'counter',
      labelNames: ['code'],
      samples: (s) => Object.entries(s.counters.rejectedReports).map(([code, n]): Sample => [{ code }, n]),
    },
    {
      name: `spillway_${tier}_reporter_cap_clipped_total`,
      help: help.reporterCapClipped,
      type: 'counter',
      labelNames: ['tier'],
      samples: (s) =>
        TIER_NAMES.map((child): Sample => [{ tier: child }, s.counters.clippedUsages[child] ?? 0]),
    },
  ];
}

/** What each tier's summed-rate series say: the zone's sums at an aggregator, the fleet's at a controller. */
const SUMMED_RATE_HELP: Record<ReceivingTier, { offered: string; admitted: string; wouldDrop: string }> = {
  aggregator: {
    offered: "Zone's offered rate: sum over counted hosts.",
    admitted: "Zone's admitted rate: sum over counted hosts.",
    wouldDrop: "Zone's shadow would-drop rate.",
  },
  controller: {
    offered: 'Offered rate summed over fresh children at the last tick.',
    admitted: 'Admitted rate summed over fresh children at the last tick.',
    wouldDrop: 'Shadow would-drop rate summed over fresh children.',
  },
};

/**
 * A receiving tier's series, read from its snapshot at scrape time: first its busiest buckets'
 * summed rates (`summedRateSeries`, worded for the tier), then `series`, all over the snapshot cut
 * to `maxBucketSeries` buckets (`exportBusiest`).
 */
export function addReceivingTierMetrics<S extends { buckets: readonly SummedRates[] }>(
  metrics: SpillwayMetrics,
  tier: ReceivingTier,
  tierState: { snapshot(): S },
  maxBucketSeries: number,
  series: SnapshotMetricDefinition<BusiestExported<S>>[],
): void {
  metrics.addSnapshotMetrics(
    (): BusiestExported<S> => exportBusiest(tierState.snapshot(), maxBucketSeries),
    [...summedRateSeries<BusiestExported<S>>(tier, SUMMED_RATE_HELP[tier]), ...series],
  );
}
