import type { RatioPolicySpec } from '../config/limits-config.js';
import type { Tier } from '../gen/spillway/v1/control_pb.js';
import type { ControllerBuckets } from './controller-buckets.js';
import type { ControllerLedger, RatioGroups } from './ratio-groups.js';
import { selectBusiest } from './select-busiest.js';
import type { TierName } from './tier-name.js';

export interface ControllerBucketZoneSnapshot {
  zone: string;
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  dropRatio: number;
  children: number;
}

export interface ControllerBucketSnapshot {
  key: string;
  /** The rule that matched: the key itself or a template. */
  rule: string;
  limitRps: number;
  mode: 'enforce' | 'shadow';
  scope: 'global' | 'zone';
  /** Totals over all zones at the last tick. */
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  /** Global scope: the bucket's ratio. Zone scope: the highest zone ratio. */
  dropRatio: number;
  /** Fresh children that reported the bucket at the last tick. */
  children: number;
  /** Zone scope only, sorted by zone. */
  zones?: ControllerBucketZoneSnapshot[];
}

export interface ControllerChildSnapshot {
  id: string;
  tier: Tier;
  zone: string;
  region: string;
  lastSeenMs: number;
  hostCount: number;
  buckets: number;
  /** Last accepted sequence. */
  sequence: number;
}

export interface ControllerCounters {
  /** Reports accepted (duplicates included, rejected ones not). */
  reports: number;
  /** Reports whose (reporterId, sequence) was already counted. */
  duplicateReports: number;
  /**
   * Reports left out of the sums as old (report-arrivals.ts): older than one already applied, or
   * arrived more than an interval later than their sender's usual (a forward a partition held
   * back).
   */
  lateReports: number;
  /** Refused reports by error code. */
  rejectedReports: Record<string, number>;
  /** Bucket entries in reports that matched no rule. */
  unknownBuckets: number;
  /** New bucket keys refused because `maxBuckets` was reached. */
  bucketsOverCapacity: number;
  /** New template instances refused because the template's `maxInstances` was reached. */
  instancesOverCapacity: number;
  expiredChildren: number;
  expiredBuckets: number;
  ticks: number;
  /**
   * Child usages scaled down by `reporterCap`, by the child's tier: one per child and bucket each
   * time a sum counts them (every tick, and every report with a stateless ratio policy).
   */
  clippedUsages: Partial<Record<TierName, number>>;
}

/**
 * Bounds on a snapshot, for readers that show a page of it every tick (the dashboard): the full
 * lists are 100,000s of objects built and sorted on the controller's event loop.
 */
export interface ControllerSnapshotOptions {
  /** Only the busiest this many buckets by offered rate, still sorted by key. Default: every bucket. */
  maxBuckets?: number;
  /** Only the first this many children by id. Default: every child. */
  maxChildren?: number;
}

export interface ControllerSnapshot {
  id: string;
  epoch: number;
  /** Ticks so far in this epoch; directives carry it. */
  version: number;
  nowMs: number;
  intervalMs: number;
  ratioPolicy: RatioPolicySpec;
  /** Sorted by key; the busiest `maxBuckets` only when that option is given. */
  buckets: ControllerBucketSnapshot[];
  /** Every bucket tracked, whether listed or not. */
  bucketsTotal: number;
  /** Sorted by id; the first `maxChildren` only when that option is given. */
  children: ControllerChildSnapshot[];
  /** Every child tracked, whether listed or not. */
  childrenTotal: number;
  /** Data-plane hosts the children speak for, over every child. */
  hostsTotal: number;
  /** Up to `maxUnknownKeys` distinct unknown keys seen (oldest first). */
  unknownBucketKeys: string[];
  counters: ControllerCounters;
}

/** The parts of a controller a snapshot reads. */
export interface ControllerParts {
  id: string;
  epoch: number;
  ledger: ControllerLedger;
  buckets: ControllerBuckets;
  ratios: RatioGroups;
}

/** The controller as its operators see it, bounded by `bounds` for readers that page it every tick. */
export function controllerSnapshot(
  parts: ControllerParts,
  nowMs: number,
  bounds: ControllerSnapshotOptions = {},
): ControllerSnapshot {
  const { ledger, buckets, ratios } = parts;
  let hostsTotal = 0;
  for (const child of ledger.children()) hostsTotal += child.hostCount;
  return {
    id: parts.id,
    epoch: parts.epoch,
    version: ratios.version,
    nowMs,
    intervalMs: buckets.limits.config.intervalMs,
    ratioPolicy: ratios.policy.spec,
    buckets: bucketList(buckets, bounds.maxBuckets ?? Number.POSITIVE_INFINITY),
    bucketsTotal: buckets.size,
    children: childList(ledger, bounds.maxChildren ?? Number.POSITIVE_INFINITY),
    childrenTotal: ledger.size,
    hostsTotal,
    unknownBucketKeys: buckets.unknownKeys(),
    counters: controllerCounters(parts),
  };
}

/** The busiest `listBuckets` buckets, sorted by key. */
function bucketList(buckets: ControllerBuckets, listBuckets: number): ControllerBucketSnapshot[] {
  // Bounded: one pass over the offered rates (a typed sort, no objects) picks the buckets, and
  // only those are copied and sorted; an idle page costs the same at 10 buckets or 100,000.
  const listed =
    buckets.size <= listBuckets
      ? buckets.values()
      : selectBusiest([...buckets.values()], listBuckets, (b) => b.total.offeredRps);
  const out: ControllerBucketSnapshot[] = [];
  for (const bucket of listed) {
    const total = bucket.total;
    const entry: ControllerBucketSnapshot = {
      key: bucket.key,
      rule: bucket.resolved.rule,
      limitRps: bucket.resolved.limitRps,
      mode: bucket.resolved.mode,
      scope: bucket.resolved.scope,
      offeredRps: total.offeredRps,
      admittedRps: total.admittedRps,
      wouldDropRps: total.wouldDropRps,
      dropRatio: total.dropRatio,
      children: total.children,
    };
    if (bucket.zones) {
      entry.zones = [...bucket.zones]
        .map(([zone, group]) => ({
          zone,
          offeredRps: group.offeredRps,
          admittedRps: group.admittedRps,
          wouldDropRps: group.wouldDropRps,
          dropRatio: group.dropRatio,
          children: group.children,
        }))
        .sort((a, b) => (a.zone < b.zone ? -1 : a.zone > b.zone ? 1 : 0));
      entry.dropRatio = entry.zones.reduce((max, z) => Math.max(max, z.dropRatio), 0);
    }
    out.push(entry);
  }
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** The first `listChildren` children by id. */
function childList(ledger: ControllerLedger, listChildren: number): ControllerChildSnapshot[] {
  if (listChildren <= 0) return [];
  // The controller's own `maxChildren` (10,000) bounds this sort: cheap next to a tick.
  return [...ledger.children()]
    .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
    .slice(0, listChildren)
    .map((child) => ({
      id: child.id,
      tier: child.tier,
      zone: child.zone,
      region: child.region,
      lastSeenMs: child.lastSeenMs,
      hostCount: child.hostCount,
      buckets: child.usage.length,
      sequence: Number(child.sequences.last),
    }));
}

/** Every part's counters, copied, in the order `ControllerCounters` lists them. */
function controllerCounters({ ledger, buckets, ratios }: ControllerParts): ControllerCounters {
  const intake = ledger.counters;
  return {
    ...ledger.reportCounters(),
    unknownBuckets: buckets.counters.unknownBuckets,
    bucketsOverCapacity: buckets.counters.bucketsOverCapacity,
    instancesOverCapacity: buckets.counters.instancesOverCapacity,
    expiredChildren: intake.expiredChildren,
    expiredBuckets: buckets.counters.expiredBuckets,
    ticks: ratios.counters.ticks,
    clippedUsages: { ...intake.clippedUsages },
  };
}
