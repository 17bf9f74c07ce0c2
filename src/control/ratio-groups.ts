import { create } from '@bufbuild/protobuf';
import type { ResolvedBucket } from '../config/compile-limits.js';
import { type Directive, DirectiveSchema, Mode } from '../gen/spillway/v1/control_pb.js';
import type { Child, ChildLedger } from './child-ledger.js';
import type { BucketState, ChildBucketUsage, ControllerBuckets, Group } from './controller-buckets.js';
import type { RatioInput, RatioPolicy } from './ratio-policy.js';
import type { ReporterCap } from './reporter-cap.js';
import { wouldAdmitMore } from './would-admit-more.js';

export type ControllerLedger = ChildLedger<BucketState, ChildBucketUsage>;

export interface RatioGroupsOptions {
  epoch: bigint;
  policy: RatioPolicy;
  reporterCap: ReporterCap | undefined;
  ledger: ControllerLedger;
  buckets: ControllerBuckets;
  /** A bucket nobody reported this long is forgotten. */
  bucketExpiryMs: () => number;
}

/**
 * The controller's sums and ratios: per bucket (per zone for zone-scoped buckets) the OFFERED rates
 * of its fresh children, and the drop ratio the policy computes from them.
 *
 * `tick()` resums everything from scratch (expiry, cap, float drift) and computes every ratio.
 * With a stateless policy, a report also swaps the child's part of its buckets' sums and
 * recomputes them at once (`recomputeOnReport`), so the reply already reflects it; a stateful
 * policy computes only at ticks, so its memory advances once per interval. A ratio from a sum that
 * may lack children (partial, regathering, or for hosts still on an earlier controller's ratio) is
 * sent only where it would not let a child's hosts admit more (`directivesFor`).
 */
export class RatioGroups {
  readonly #options: RatioGroupsOptions;
  #policy: RatioPolicy;
  /** Computations so far in this epoch (ticks, and reports that recompute); directives carry it. */
  #version = 0;
  /** The reporter cap's per-bucket bounds from the last tick, for sums updated between ticks. */
  #tickCaps: Map<BucketState, number> | undefined;
  /** Reused for every bucket of a tick (policies must not keep it): 100,000 buckets, no garbage. */
  readonly #input: RatioInput = { offeredRps: 0, admittedRps: 0, limitRps: 0 };
  readonly counters = { ticks: 0 };

  constructor(options: RatioGroupsOptions) {
    this.#options = options;
    this.#policy = options.policy;
  }

  get policy(): RatioPolicy {
    return this.#policy;
  }

  /** Replaces the policy when its spec differs; returns whether it did (groups then need fresh memory). */
  replacePolicy(candidate: RatioPolicy): boolean {
    if (JSON.stringify(candidate.spec) === JSON.stringify(this.#policy.spec)) return false;
    this.#policy = candidate;
    return true;
  }

  /** Computations so far in this epoch. */
  get version(): number {
    return this.#version;
  }

  newGroup(resolved: ResolvedBucket): Group {
    return {
      offeredRps: 0,
      admittedRps: 0,
      wouldDropRps: 0,
      children: 0,
      dropRatio: 0,
      policyState: this.#policy.createState(),
      limitRps: resolved.limitRps,
      mode: toMode(resolved.mode),
      computed: false,
      partial: false,
      version: 0,
      directive: undefined,
    };
  }

  /** Expires silent children and idle buckets, resums every group and computes every ratio. */
  tick(nowMs: number): void {
    const { ledger, buckets, reporterCap } = this.#options;
    ledger.expire(nowMs);
    for (const bucket of buckets.values()) {
      bucket.awaitingTick = false;
      resetGroup(bucket.total);
      if (bucket.zones) for (const group of bucket.zones.values()) resetGroup(group);
    }
    const caps = reporterCap ? ledger.bucketCaps(reporterCap, nowMs) : undefined;
    this.#tickCaps = caps;
    for (const child of ledger.children()) {
      for (const usage of child.usage) {
        const bucket = usage.bucket;
        if (bucket.removed) continue;
        const scale = ledger.capScale(child, usage, caps);
        addTo(bucket.total, usage, scale);
        if (bucket.zones) {
          let group = bucket.zones.get(child.zone);
          if (!group) {
            group = this.newGroup(bucket.resolved);
            bucket.zones.set(child.zone, group);
          }
          addTo(group, usage, scale);
        }
      }
    }
    this.#version++;
    this.counters.ticks++;
    buckets.resetCapacityWarning();
    const idleSinceMs = nowMs - this.#options.bucketExpiryMs();
    for (const bucket of buckets.values()) {
      if (bucket.total.children === 0 && bucket.lastReportedMs < idleSinceMs) {
        buckets.expire(bucket);
        continue;
      }
      if (bucket.total.children === 0) bucket.unreportedAtLastTick = true;
      if (bucket.zones) {
        for (const [zone, group] of bucket.zones) {
          // A zone whose children all expired: its memory goes with them (bounded by zones seen).
          if (group.children === 0) bucket.zones.delete(zone);
          else this.#compute(group, bucket.resolved);
        }
        bucket.total.limitRps = bucket.resolved.limitRps;
        bucket.total.mode = toMode(bucket.resolved.mode);
      } else {
        this.#compute(bucket.total, bucket.resolved);
      }
    }
  }

  /**
   * Swap a child's previous usage for its new one in the sums of its buckets' groups, and recompute
   * those ratios now, so the reply carries them.
   *
   * A group that has no ratio yet gets its first one from this report when no other child's usage
   * can be missing from its sum: a bucket (or a zone of it) first reported now, as after a
   * controller restart, where waiting for the tick cost the loop an interval. Its sum is the
   * children that reported so far (the first aggregator's forward, at first); each later report
   * adds its own part and recomputes. Groups a reload reset (`awaitingTick`) wait for the tick,
   * which counts every child; so do new buckets when a reporter cap is configured, since the cap
   * comes from a tick.
   */
  recomputeOnReport(child: Child<ChildBucketUsage>, previousUsage: readonly ChildBucketUsage[]): void {
    const touched = new Map<Group, BucketState>();
    for (const usage of previousUsage) {
      const group = usage.countedIn;
      if (group === undefined || usage.bucket.removed || !group.computed) continue;
      subtractFrom(group, usage);
      touched.set(group, usage.bucket);
    }
    for (const usage of child.usage) {
      const bucket = usage.bucket;
      let group = bucket.zones ? bucket.zones.get(child.zone) : bucket.total;
      if (group === undefined || !group.computed) {
        if (!this.#firstFromReport(bucket)) continue;
        if (group === undefined) {
          group = this.newGroup(bucket.resolved);
          bucket.zones!.set(child.zone, group);
        }
        group.partial = true;
      }
      addTo(group, usage, this.#options.ledger.capScale(child, usage, this.#tickCaps));
      touched.set(group, bucket);
    }
    if (touched.size === 0) return;
    this.#version++;
    for (const [group, bucket] of touched) this.#compute(group, bucket.resolved);
  }

  /**
   * The directives for a child's buckets: each bucket's ratio (its zone's, when zone-scoped), left
   * out while the bucket has none, and left out where a ratio from a sum that may lack children
   * would let the child's hosts admit more than they do now (`wouldAdmitMore`): the hosts keep the
   * ratio they hold until a tick has counted every child (or the bucket's regathering, or its
   * earlier-epoch spell, is over). Such a sum can only under-count the offered rate, so its ratio
   * is a lower bound: sent when it asks at least as much as the hosts already do (after an outage,
   * when their held ratio decayed; a new bucket, which they do not limit yet), withheld when it
   * would undo a ratio still in force (the first zone's forward to a restarted controller, its sum
   * a tenth of the fleet's; the first aggregator's forward after a partition that expired every
   * child, its sum its own hosts' share).
   */
  directivesFor(child: Child<ChildBucketUsage>, nowMs: number): Directive[] {
    const { epoch } = this.#options;
    const { intervalMs, ttlMs } = this.#options.buckets.limits.config;
    const out: Directive[] = [];
    for (const usage of child.usage) {
      const bucket = usage.bucket;
      if (bucket.removed) continue;
      const group = bucket.zones ? bucket.zones.get(child.zone) : bucket.total;
      if (!group?.computed) continue;
      const onEarlierEpoch =
        nowMs < bucket.earlierEpochUntilMs && usage.heldEpoch !== 0n && usage.heldEpoch < epoch;
      if (
        (group.partial || onEarlierEpoch || nowMs < bucket.regatherUntilMs) &&
        // Reports cover about an interval: the calls the share was measured on.
        wouldAdmitMore(group.dropRatio, usage, (usage.offeredRps * intervalMs) / 1000)
      ) {
        continue;
      }
      group.directive ??= create(DirectiveSchema, {
        bucket: bucket.key,
        dropRatio: group.dropRatio,
        mode: group.mode,
        limitRps: group.limitRps,
        offeredRps: group.offeredRps,
        epoch,
        version: BigInt(group.version),
        ttlMs,
      });
      out.push(group.directive);
    }
    return out;
  }

  /**
   * Whether a bucket's group without a ratio may get its first one from a report alone. Such a
   * group holds no other child's usage unless a reload reset it (`awaitingTick`): every usage of
   * the bucket is counted at each tick, and after it by the report that brings it.
   */
  #firstFromReport(bucket: BucketState): boolean {
    if (bucket.awaitingTick) return false;
    return this.#options.reporterCap === undefined || this.#tickCaps?.has(bucket) === true;
  }

  #compute(group: Group, resolved: ResolvedBucket): void {
    const input = this.#input;
    group.limitRps = resolved.limitRps;
    group.mode = toMode(resolved.mode);
    input.offeredRps = group.offeredRps;
    input.admittedRps = group.admittedRps - group.wouldDropRps;
    input.limitRps = resolved.limitRps;
    group.dropRatio = this.#policy.nextDropRatio(group.policyState, input);
    group.computed = true;
    group.version = this.#version;
    group.directive = undefined;
  }
}

function resetGroup(group: Group): void {
  group.partial = false;
  group.offeredRps = 0;
  group.admittedRps = 0;
  group.wouldDropRps = 0;
  group.children = 0;
}

function addTo(group: Group, usage: ChildBucketUsage, scale: number): void {
  group.offeredRps += usage.offeredRps * scale;
  group.admittedRps += usage.admittedRps * scale;
  group.wouldDropRps += usage.wouldDropRps * scale;
  group.children++;
  usage.countedIn = group;
  usage.countedScale = scale;
}

function subtractFrom(group: Group, usage: ChildBucketUsage): void {
  const scale = usage.countedScale;
  // max(0, ...): float sums must not go below zero between the ticks that resum them.
  group.offeredRps = Math.max(0, group.offeredRps - usage.offeredRps * scale);
  group.admittedRps = Math.max(0, group.admittedRps - usage.admittedRps * scale);
  group.wouldDropRps = Math.max(0, group.wouldDropRps - usage.wouldDropRps * scale);
  group.children--;
  usage.countedIn = undefined;
}

function toMode(mode: 'enforce' | 'shadow'): Mode {
  return mode === 'shadow' ? Mode.SHADOW : Mode.ENFORCE;
}
