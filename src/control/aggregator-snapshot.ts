import type { Tier } from '../gen/spillway/v1/control_pb.js';
import type { ChildLedger } from './child-ledger.js';
import type { DirectiveCache } from './directive-cache.js';
import type { ParentForwarder } from './parent-forwarder.js';
import type { TierName } from './tier-name.js';
import type { BucketEntry, HostUsage, ZoneSums } from './zone-sums.js';

export interface AggregatorHostSnapshot {
  id: string;
  zone: string;
  tier: Tier;
  hostCount: number;
  lastSeenMs: number;
  buckets: number;
  /** Within the grace period and not held out, so counted in forwards. */
  counted: boolean;
  /**
   * Held out of the sums until then (this aggregator's clock): the host came from another
   * aggregator that still counts it (`acknowledged_by`). Absent when not held.
   */
  heldOutUntilMs?: number;
}

export interface AggregatorBucketSnapshot {
  key: string;
  /** Sums over counted hosts, as the next forward would send them. */
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  hosts: number;
  directive?: {
    dropRatio: number;
    mode: number;
    limitRps: number;
    epoch: number;
    version: number;
    /** TTL left as a host would receive it now (0 = stale, not sent). */
    remainingTtlMs: number;
  };
}

export interface AggregatorCounters {
  reports: number;
  duplicateReports: number;
  /**
   * Reports left out of the sums as old (report-arrivals.ts): older than one already applied, or
   * arrived more than an interval later than their sender's usual (a report a partition held
   * back, whose host has moved on).
   */
  lateReports: number;
  rejectedReports: Record<string, number>;
  forwards: number;
  /** Forwards every parent refused or timed out. */
  forwardFailures: number;
  /** Single attempts that failed (one forward may fail over several times). */
  parentFailures: number;
  /** Timer firings skipped because the previous forward was still in flight. */
  skippedForwards: number;
  /**
   * Forwards sent at once because a parent's connection came back while no parent answered (the
   * interval restarts from them, so they replace a timer forward rather than add one).
   */
  reconnectForwards: number;
  /**
   * Forwards sent at once because a host reported usage while this aggregator held no fresh
   * directive at all (just started, or every directive ran out): one per such spell.
   */
  coldForwards: number;
  /** Directives ignored as older (epoch, version) than the one cached. */
  staleDirectives: number;
  /**
   * Cached directives left out of a reply (one per reply and bucket) because the host had just
   * (re)joined the bucket's sums, the directive came from a forward without it, and it would let
   * the host admit more than it does now (directive-cache.ts, `relay`).
   */
  withheldDirectives: number;
  bucketsOverCapacity: number;
  /**
   * Buckets left out of forwards because a forward holds at most `maxBucketsPerForward` (one per
   * bucket and forward): the least busy ones, which the parent does not see from this zone.
   */
  bucketsLeftOutOfForwards: number;
  expiredHosts: number;
  /**
   * Reporters held out of the sums on (re)joining because another aggregator acknowledged their
   * last report recently enough that it still counts them (one per joining; child-ledger.ts).
   */
  heldOutReporters: number;
  /** Host usages scaled down by `reporterCap` (one per host, bucket and forward), by the host's tier. */
  clippedUsages: Partial<Record<TierName, number>>;
}

export interface AggregatorSnapshot {
  id: string;
  zone: string;
  nowMs: number;
  intervalMs: number;
  hosts: AggregatorHostSnapshot[];
  buckets: AggregatorBucketSnapshot[];
  parents: { target: string; healthy: boolean }[];
  lastForward?: { sequence: number; atMs: number; buckets: number; hostCount: number; target?: string };
  counters: AggregatorCounters;
}

/** The parts of an aggregator a snapshot reads. */
export interface AggregatorParts {
  id: string;
  zone: string;
  ledger: ChildLedger<BucketEntry, HostUsage>;
  sums: ZoneSums;
  cache: DirectiveCache;
  forwarder: ParentForwarder;
}

/**
 * The aggregator as its operators see it: every host, every bucket summed over the counted hosts as
 * the next forward would send it (without the reporter cap), the parents and the counters. Sums
 * every bucket: a health check reads `Aggregator.health()` instead.
 */
export function aggregatorSnapshot(parts: AggregatorParts, nowMs: number): AggregatorSnapshot {
  const { ledger, forwarder } = parts;
  const sums = new Map<BucketEntry, AggregatorBucketSnapshot>();
  for (const bucket of parts.sums.buckets()) {
    const out: AggregatorBucketSnapshot = {
      key: bucket.key,
      offeredRps: 0,
      admittedRps: 0,
      wouldDropRps: 0,
      hosts: 0,
    };
    const cached = bucket.directive;
    if (cached) {
      out.directive = {
        dropRatio: cached.received.dropRatio,
        mode: cached.received.mode,
        limitRps: cached.received.limitRps,
        epoch: Number(cached.epoch),
        version: Number(cached.version),
        remainingTtlMs: Math.max(0, cached.received.ttlMs - (nowMs - cached.receivedAtMs)),
      };
    }
    sums.set(bucket, out);
  }
  const hostList: AggregatorHostSnapshot[] = [];
  for (const host of ledger.children()) {
    const counted = ledger.isCounted(host, nowMs);
    hostList.push({
      id: host.id,
      zone: host.zone,
      tier: host.tier,
      hostCount: host.hostCount,
      lastSeenMs: host.lastSeenMs,
      buckets: host.usage.length,
      counted,
      ...(host.countedElsewhereUntilMs > nowMs ? { heldOutUntilMs: host.countedElsewhereUntilMs } : {}),
    });
    if (!counted) continue;
    for (const usage of host.usage) {
      const out = sums.get(usage.bucket);
      if (!out) continue;
      out.offeredRps += usage.offeredRps;
      out.admittedRps += usage.admittedRps;
      out.wouldDropRps += usage.wouldDropRps;
      out.hosts++;
    }
  }
  const byKey = <T extends { key?: string; id?: string }>(a: T, b: T) => {
    const x = a.key ?? a.id ?? '';
    const y = b.key ?? b.id ?? '';
    return x < y ? -1 : x > y ? 1 : 0;
  };
  const lastForward = forwarder.lastForward;
  const snap: AggregatorSnapshot = {
    id: parts.id,
    zone: parts.zone,
    nowMs,
    intervalMs: forwarder.intervalMs,
    hosts: hostList.sort(byKey),
    buckets: [...sums.values()].sort(byKey),
    parents: forwarder.parents(nowMs),
    counters: aggregatorCounters(parts),
  };
  if (lastForward) snap.lastForward = { ...lastForward };
  return snap;
}

/** Every part's counters, copied, in the order `AggregatorCounters` lists them. */
function aggregatorCounters({ ledger, sums, cache, forwarder }: AggregatorParts): AggregatorCounters {
  const intake = ledger.counters;
  return {
    ...ledger.reportCounters(),
    ...forwarder.counters,
    ...cache.counters,
    ...sums.counters,
    expiredHosts: intake.expiredChildren,
    heldOutReporters: intake.countedElsewhere,
    clippedUsages: { ...intake.clippedUsages },
  };
}
