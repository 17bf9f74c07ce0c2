import type { RatioPolicySpec } from '../config/limits-config.js';
import type {
  ControllerBucketSnapshot,
  ControllerCounters,
  ControllerSnapshot,
} from '../control/controller.js';
import { selectBusiest } from '../control/select-busiest.js';
import { Tier } from '../gen/spillway/v1/control_pb.js';
import type { EffectiveRule } from './admin-overrides.js';

/** One bucket as the page shows it: the controller's numbers plus whether an override is in force. */
export interface DashboardBucket extends ControllerBucketSnapshot {
  overridden: boolean;
}

export type ChildFreshness = 'fresh' | 'late';

export interface DashboardChild {
  id: string;
  tier: 'host' | 'aggregator' | 'controller' | 'unspecified';
  zone: string;
  region: string;
  /** Data-plane hosts this child speaks for (1 for a host). */
  hostCount: number;
  buckets: number;
  lastSeenMs: number;
  /** Time since its last report, at the snapshot. */
  ageMs: number;
  /** `late`: silent for more than 1.5 intervals (expired and gone after 3). */
  freshness: ChildFreshness;
}

/** What `/api/snapshot` answers and every `/api/stream` event carries. */
export interface DashboardView {
  controller: {
    id: string;
    epoch: number;
    /** Bumped by every ratio computation (ticks, and reports under a stateless policy); directives carry it. */
    version: number;
    /** Ticks so far in this epoch. */
    ticks: number;
    nowMs: number;
    intervalMs: number;
    ratioPolicy: RatioPolicySpec;
  };
  /** The busiest `maxBuckets` buckets (by offered rate), sorted by key. */
  buckets: DashboardBucket[];
  bucketsTotal: number;
  /** The first `maxChildren` children by id. */
  children: DashboardChild[];
  childrenTotal: number;
  hostsTotal: number;
  rules: EffectiveRule[];
  unknownBucketKeys: string[];
  counters: ControllerCounters;
  admin: { enabled: boolean };
}

export interface ViewLimits {
  /** Default 100: a page of charts, and a bounded SSE event whatever the bucket count. */
  maxBuckets?: number;
  /** Default 200. */
  maxChildren?: number;
}

const TIER_NAMES: Record<number, DashboardChild['tier']> = {
  [Tier.UNSPECIFIED]: 'unspecified',
  [Tier.HOST]: 'host',
  [Tier.AGGREGATOR]: 'aggregator',
  [Tier.CONTROLLER]: 'controller',
};

const byKey = <T extends { key: string }>(a: T, b: T) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);

export function buildDashboardView(
  snapshot: ControllerSnapshot,
  rules: EffectiveRule[],
  adminEnabled: boolean,
  limits: ViewLimits = {},
): DashboardView {
  const maxBuckets = limits.maxBuckets ?? 100;
  const maxChildren = limits.maxChildren ?? 200;
  const overridden = new Set(rules.filter((r) => r.override !== undefined).map((r) => r.rule));
  // The controller bounds its snapshot when asked (the server does); a source that lists every
  // bucket is cut here: one typed sort of the rates, not a sort of the objects.
  const busiest =
    snapshot.buckets.length <= maxBuckets
      ? snapshot.buckets
      : selectBusiest(snapshot.buckets, maxBuckets, (b) => b.offeredRps).sort(byKey);
  const lateAfterMs = 1.5 * snapshot.intervalMs;
  return {
    controller: {
      id: snapshot.id,
      epoch: snapshot.epoch,
      version: snapshot.version,
      ticks: snapshot.counters.ticks,
      nowMs: snapshot.nowMs,
      intervalMs: snapshot.intervalMs,
      ratioPolicy: snapshot.ratioPolicy,
    },
    buckets: busiest.map((b) => ({ ...b, overridden: overridden.has(b.rule) })),
    bucketsTotal: snapshot.bucketsTotal,
    children: snapshot.children.slice(0, maxChildren).map((c) => {
      const ageMs = Math.max(0, snapshot.nowMs - c.lastSeenMs);
      return {
        id: c.id,
        tier: TIER_NAMES[c.tier] ?? 'unspecified',
        zone: c.zone,
        region: c.region,
        hostCount: c.hostCount,
        buckets: c.buckets,
        lastSeenMs: c.lastSeenMs,
        ageMs,
        freshness: ageMs > lateAfterMs ? 'late' : 'fresh',
      };
    }),
    childrenTotal: snapshot.childrenTotal,
    hostsTotal: snapshot.hostsTotal,
    rules,
    unknownBucketKeys: snapshot.unknownBucketKeys,
    counters: snapshot.counters,
    admin: { enabled: adminEnabled },
  };
}
