import { create } from '@bufbuild/protobuf';
import {
  type CompiledLimits,
  compileLimits,
  matchBucket,
  type ResolvedBucket,
} from '../config/compile-limits.js';
import type { LimitsConfig, RatioPolicySpec } from '../config/limits-config.js';
import { type Cancellable, type Random, type Scheduler, systemScheduler } from '../core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import {
  type Directive,
  DirectiveSchema,
  Mode,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
  type Tier,
} from '../gen/spillway/v1/control_pb.js';
import { hostsSpokenFor } from '../protocol/hosts-spoken-for.js';
import { type ReportLimits, validateReport } from '../protocol/validate-report.js';
import type { ReportContext, ReportHandler } from '../transport/control-transport.js';
import { type ControlLogger, silentLogger } from './control-logger.js';
import { assertControllerOptionNames } from './control-options.js';
import { loosens } from './loosens.js';
import { createRatioPolicy, type RatioInput, type RatioPolicy } from './ratio-policy.js';
import { RecentSequences } from './recent-sequences.js';
import { DepartedArrivals, isOldNews, type ReportArrivals } from './report-arrivals.js';
import { clipScale, perHostCapRps, type ReporterCap, validateReporterCap } from './reporter-cap.js';
import { selectBusiest } from './select-busiest.js';
import { type TierName, tierName } from './tier-name.js';
import { checkTokenZone, reporterKey } from './token-zone.js';
import { UnknownBucketLog } from './unknown-bucket-log.js';

export interface ControllerOptions {
  /** Responder identity put in every reply. */
  id: string;
  config: LimitsConfig;
  scheduler?: Scheduler;
  /**
   * This controller generation's identity. Default: `scheduler.nowMs()` at creation, in whole ms,
   * times 1,024, plus 10 random bits (`random`): a restart wins, and two replicas started in the
   * same millisecond still differ (see `startEpoch`).
   */
  epoch?: number;
  /** For the default epoch's random bits. Default Math.random. */
  random?: Random;
  /** A child (host or aggregator) silent this long stops counting. Default 3 intervals. */
  childExpiryMs?: number;
  /** A bucket nobody reported this long is forgotten, smoothing memory included. Default 10 intervals. */
  bucketExpiryMs?: number;
  /** Most buckets tracked; new keys past it get no directive and are counted. Default 200,000. */
  maxBuckets?: number;
  /** Most children tracked; a new child past it is refused (ERR_SPILLWAY_CAPACITY_EXCEEDED). Default 10,000. */
  maxChildren?: number;
  /** How many distinct unknown bucket keys the snapshot lists (the count is exact). Default 64. */
  maxUnknownKeys?: number;
  reportLimits?: ReportLimits;
  logger?: ControlLogger;
  /** Overrides `config.ratioPolicy` (and the default); kept across `updateConfig`. */
  ratioPolicy?: RatioPolicy;
  /** Bounds one child's say in a bucket's offered sum (per host it speaks for). Default: none. */
  reporterCap?: ReporterCap;
}

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

export interface Controller {
  /** Accepts one report, replies with directives for its buckets. Throws SpillwayError to refuse it. */
  handleReport: ReportHandler;
  /**
   * Counts a report its transport refused before `handleReport` saw it (undecodable, over the
   * transport's bounds) with the ones `handleReport` refuses, in `counters.rejectedReports`.
   */
  countRefusal(code: string): void;
  /** Recompute ratios every `config.intervalMs` on the scheduler. */
  start(): void;
  stop(): void;
  /** Recompute every ratio now (the timer calls this). */
  tick(): void;
  /** Swap limits; per-bucket state (smoothing memory) survives for buckets that still match a rule. */
  updateConfig(config: LimitsConfig): void;
  snapshot(options?: ControllerSnapshotOptions): ControllerSnapshot;
  readonly epoch: number;
}

/** Sums of fresh children's rates for a bucket (or one zone of it), and the ratio computed from them. */
interface Group {
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  children: number;
  dropRatio: number;
  policyState: unknown;
  /** Limit and mode the ratio was computed with (a reload between ticks does not mix them). */
  limitRps: number;
  mode: Mode;
  computed: boolean;
  /**
   * Computed from reports alone, no tick since: the sums may lack children that have not reported
   * yet (a controller just started), so the ratio may be too low. See `loosensChild`.
   */
  partial: boolean;
  /** `version` when the ratio was last computed; directives carry it. */
  version: number;
  /** Built on first request after a computation, shared by every reply until the next one. */
  directive: Directive | undefined;
}

interface BucketState {
  key: string;
  resolved: ResolvedBucket;
  removed: boolean;
  /**
   * A reload gave the bucket fresh groups while children's usage of it is not counted in them: its
   * ratios wait for the next tick, which counts every child (a report alone would be a partial sum).
   */
  awaitingTick: boolean;
  /**
   * A tick counted no child's usage of the bucket while it is kept: every child expired (the
   * controller was cut off from them), or none reports it any more (their hosts were cut off).
   */
  emptied: boolean;
  /**
   * Set by the first report that brings an emptied bucket back, childExpiryMs on (a child not back
   * by then would have expired anyway): until then its sums hold only the children back so far,
   * and its ratios are sent only where they do not loosen what a child's hosts apply (`loosensChild`).
   */
  regatherUntilMs: number;
  /**
   * Set by the first report of a bucket whose hosts apply an earlier controller's ratio (this one
   * has just started), childExpiryMs on: until then a child whose hosts are still on that earlier
   * ratio (`ChildUsage.heldEpoch`) gets no ratio that loosens theirs (`loosensChild`). Once its
   * hosts apply this controller's ratio, it gets every ratio, looser ones included.
   */
  earlierEpochUntilMs: number;
  lastReportedMs: number;
  /** Global scope: the one group. Zone scope: the all-zone totals (never sent). */
  total: Group;
  zones: Map<string, Group> | undefined;
}

interface ChildUsage {
  bucket: BucketState;
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  /** Epoch of the ratio the child's hosts apply (the oldest, from an aggregator); 0n: none. */
  heldEpoch: bigint;
  /** The group this usage is summed into (undefined: not counted yet) and the cap scale it got. */
  countedIn: Group | undefined;
  countedScale: number;
}

interface ChildState {
  id: string;
  tier: Tier;
  zone: string;
  region: string;
  hostCount: number;
  lastSeenMs: number;
  sequences: RecentSequences;
  /** Window end (sender's clock) of the last report applied. */
  lastWindowEndMs: bigint;
  arrivals: ReportArrivals;
  usage: ChildUsage[];
}

const DEFAULT_MAX_BUCKETS = 200_000;
const DEFAULT_MAX_CHILDREN = 10_000;

/**
 * The root of the GRL tree. Children (hosts or aggregators) report usage; each child's latest report
 * is its current rate (count / its own window length, so clocks never need to agree). Every
 * interval, `tick()` sums OFFERED rates over fresh children per bucket (per zone for zone-scoped
 * buckets) and asks the ratio policy for a drop ratio. Replies carry the latest ratios.
 *
 * With a stateless ratio policy (the default, `plain`) a report also replaces the child's part of
 * the sums of its buckets and recomputes their ratios at once, so the reply to that report already
 * reflects it: an aggregator's forward gets a ratio from its own fresh sums instead of the last
 * tick's, which takes one interval out of the loop's lag (docs/accuracy.md). A bucket reported
 * for the first time (every bucket, once a controller restarts) gets its first ratio the same way,
 * from the children that reported it so far; until a tick has counted every child such a partial
 * ratio is only sent where it does not loosen what the child's hosts apply (`loosensChild`). So are
 * the ratios of a bucket a tick found no child reporting (every child expired: the controller was
 * cut off from them; or none reports it: their hosts were cut off from them), for childExpiryMs
 * after the first report brings it back: its children come back one at a time, the first one's
 * forward alone is only its hosts' share of the fleet, and a tick may fall between them. Ticks still resum everything from scratch (expiry, cap, float drift). A stateful policy
 * computes only at ticks: its memory advances once per interval.
 *
 * Concurrency: everything is synchronous; `handleReport` never awaits, so a report and a tick never
 * interleave. Memory: bounded by maxChildren × (buckets per report) plus maxBuckets.
 */
export function createController(options: ControllerOptions): Controller {
  assertControllerOptionNames(options);
  const scheduler = options.scheduler ?? systemScheduler;
  const logger = options.logger ?? silentLogger;
  const epoch = Math.floor(options.epoch ?? startEpoch(scheduler.nowMs(), options.random ?? Math.random));
  const epochBig = BigInt(epoch);
  const maxBuckets = options.maxBuckets ?? DEFAULT_MAX_BUCKETS;
  const maxChildren = options.maxChildren ?? DEFAULT_MAX_CHILDREN;
  const maxUnknownKeys = options.maxUnknownKeys ?? 64;
  const reportLimits = options.reportLimits ?? {};
  const reporterCap =
    options.reporterCap === undefined ? undefined : validateReporterCap(options.reporterCap);

  let limits: CompiledLimits = compileLimits(options.config);
  let policy: RatioPolicy = options.ratioPolicy ?? createRatioPolicy(limits.config.ratioPolicy);
  let childExpiryMs = options.childExpiryMs ?? 3 * limits.config.intervalMs;
  let bucketExpiryMs = options.bucketExpiryMs ?? 10 * limits.config.intervalMs;

  const children = new Map<string, ChildState>();
  /** Forgotten children's report timing, for a report of theirs that turns up late. */
  const departed = new DepartedArrivals(maxChildren);
  const buckets = new Map<string, BucketState>();
  /** Live instances per template, for `maxInstances`. */
  const instances = new Map<string, number>();
  const unknownKeys = new Set<string>();
  const unknownLog = new UnknownBucketLog({ logger, clock: scheduler, controllerId: options.id });
  let version = 0;
  /** The reporter cap's per-bucket bounds from the last tick, for sums updated between ticks. */
  let tickCaps: Map<BucketState, number> | undefined;
  let timer: Cancellable | undefined;
  let running = false;
  let capacityWarned = false;

  const counters: ControllerCounters = {
    reports: 0,
    duplicateReports: 0,
    lateReports: 0,
    rejectedReports: {},
    unknownBuckets: 0,
    bucketsOverCapacity: 0,
    instancesOverCapacity: 0,
    expiredChildren: 0,
    expiredBuckets: 0,
    ticks: 0,
    clippedUsages: {},
  };

  function newGroup(resolved: ResolvedBucket): Group {
    return {
      offeredRps: 0,
      admittedRps: 0,
      wouldDropRps: 0,
      children: 0,
      dropRatio: 0,
      policyState: policy.createState(),
      limitRps: resolved.limitRps,
      mode: toMode(resolved.mode),
      computed: false,
      partial: false,
      version: 0,
      directive: undefined,
    };
  }

  function addBucket(key: string): BucketState | undefined {
    const resolved = matchBucket(limits, key);
    if (!resolved) {
      counters.unknownBuckets++;
      if (unknownKeys.size < maxUnknownKeys) unknownKeys.add(key);
      unknownLog.note(key);
      return undefined;
    }
    if (buckets.size >= maxBuckets) {
      counters.bucketsOverCapacity++;
      warnCapacity('maxBuckets', maxBuckets);
      return undefined;
    }
    if (resolved.instance !== undefined) {
      const live = instances.get(resolved.rule) ?? 0;
      if (live >= (resolved.maxInstances ?? 0)) {
        counters.instancesOverCapacity++;
        warnCapacity(`maxInstances of ${resolved.rule}`, resolved.maxInstances ?? 0);
        return undefined;
      }
      instances.set(resolved.rule, live + 1);
    }
    const state: BucketState = {
      key,
      resolved,
      removed: false,
      awaitingTick: false,
      emptied: false,
      regatherUntilMs: Number.NEGATIVE_INFINITY,
      earlierEpochUntilMs: Number.NEGATIVE_INFINITY,
      lastReportedMs: 0,
      total: newGroup(resolved),
      zones: resolved.scope === 'zone' ? new Map() : undefined,
    };
    buckets.set(key, state);
    return state;
  }

  function removeBucket(state: BucketState): void {
    state.removed = true;
    buckets.delete(state.key);
    if (state.resolved.instance !== undefined) {
      const live = (instances.get(state.resolved.rule) ?? 1) - 1;
      if (live > 0) instances.set(state.resolved.rule, live);
      else instances.delete(state.resolved.rule);
    }
  }

  function warnCapacity(bound: string, value: number): void {
    if (capacityWarned) return;
    capacityWarned = true;
    logger.warn({ controller: options.id, bound, value }, 'control: bound reached, new buckets are refused');
  }

  function expireChildren(nowMs: number): void {
    const oldestMs = nowMs - childExpiryMs;
    for (const [id, child] of children) {
      if (child.lastSeenMs < oldestMs) {
        children.delete(id);
        departed.remember(id, child.arrivals);
        counters.expiredChildren++;
      }
    }
  }

  function reject(error: unknown): never {
    const code = isSpillwayError(error) ? error.code : 'ERR_UNKNOWN';
    counters.rejectedReports[code] = (counters.rejectedReports[code] ?? 0) + 1;
    throw error;
  }

  function handleReport(request: ReportRequest, context: ReportContext): ReportResponse {
    try {
      validateReport(request, reportLimits);
      checkTokenZone(request, context);
    } catch (error) {
      reject(error);
    }
    const nowMs = scheduler.nowMs();
    const key = reporterKey(request, context);
    let child = children.get(key);
    const arrivals = child?.arrivals ?? departed.take(key);
    // A retry of a report already counted is a duplicate (below); news is judged by its age.
    if (isOldNews(child, arrivals, request, nowMs, limits.config.intervalMs, children.values())) {
      counters.reports++;
      counters.lateReports++;
      if (!child) departed.remember(key, arrivals);
      // Old news: the sender has reported since, or gave up on this report long ago.
      return create(ReportResponseSchema, {
        directives: [],
        reportIntervalMs: limits.config.intervalMs,
        epoch: epochBig,
        responderId: options.id,
      });
    }
    if (!child) {
      if (children.size >= maxChildren) expireChildren(nowMs);
      if (children.size >= maxChildren) {
        departed.remember(key, arrivals);
        warnCapacity('maxChildren', maxChildren);
        reject(
          new SpillwayError(ErrorCode.CapacityExceeded, `controller tracks ${maxChildren} children already`, {
            field: 'reporterId',
            maxChildren,
          }),
        );
      }
      child = {
        id: request.reporterId,
        tier: request.tier,
        zone: request.zone,
        region: request.region,
        hostCount: 0,
        lastSeenMs: nowMs,
        sequences: new RecentSequences(),
        lastWindowEndMs: request.windowEndMs,
        arrivals,
        usage: [],
      };
      children.set(key, child);
    }
    counters.reports++;
    child.lastSeenMs = nowMs;
    if (child.sequences.has(request.sequence, request.windowEndMs)) {
      counters.duplicateReports++;
    } else {
      const previousUsage = child.usage;
      child.sequences.add(request.sequence, request.windowEndMs);
      child.lastWindowEndMs = request.windowEndMs;
      child.tier = request.tier;
      child.zone = request.zone;
      child.region = request.region;
      child.hostCount = hostsSpokenFor(request);
      const perSecond = 1000 / Number(request.windowEndMs - request.windowStartMs);
      const usage: ChildUsage[] = [];
      for (const entry of request.buckets) {
        let bucket = buckets.get(entry.bucket);
        if (!bucket) {
          bucket = addBucket(entry.bucket);
          if (!bucket) continue;
          // Its hosts apply a ratio from an earlier controller: this one has just started (or
          // forgot the bucket). Its sums hold only the children back so far, and a tick may fall
          // before the rest are back (one zone's aggregator still cut off), so its ratios loosen
          // no child's hosts until every child could have reported. A bucket whose hosts hold no
          // ratio (a cold start, a new bucket) or this controller's is not held back.
          if (entry.heldEpoch !== 0n && entry.heldEpoch < epochBig) {
            bucket.earlierEpochUntilMs = nowMs + childExpiryMs;
          }
        }
        bucket.lastReportedMs = nowMs;
        if (bucket.emptied) {
          bucket.emptied = false;
          bucket.regatherUntilMs = nowMs + childExpiryMs;
        }
        usage.push({
          bucket,
          offeredRps: entry.offered * perSecond,
          admittedRps: entry.admitted * perSecond,
          wouldDropRps: entry.wouldDrop * perSecond,
          heldEpoch: entry.heldEpoch,
          countedIn: undefined,
          countedScale: 1,
        });
      }
      child.usage = usage;
      if (policy.stateless) recomputeOnReport(child, previousUsage);
    }
    return create(ReportResponseSchema, {
      directives: directivesFor(child, nowMs),
      reportIntervalMs: limits.config.intervalMs,
      epoch: epochBig,
      responderId: options.id,
    });
  }

  function directivesFor(child: ChildState, nowMs: number): Directive[] {
    const out: Directive[] = [];
    for (const usage of child.usage) {
      const bucket = usage.bucket;
      if (bucket.removed) continue;
      const group = bucket.zones ? bucket.zones.get(child.zone) : bucket.total;
      if (!group?.computed) continue;
      const onEarlierEpoch =
        nowMs < bucket.earlierEpochUntilMs && usage.heldEpoch !== 0n && usage.heldEpoch < epochBig;
      if ((group.partial || onEarlierEpoch || nowMs < bucket.regatherUntilMs) && loosensChild(group, usage)) {
        continue;
      }
      group.directive ??= create(DirectiveSchema, {
        bucket: bucket.key,
        dropRatio: group.dropRatio,
        mode: group.mode,
        limitRps: group.limitRps,
        offeredRps: group.offeredRps,
        epoch: epochBig,
        version: BigInt(group.version),
        ttlMs: limits.config.ttlMs,
      });
      out.push(group.directive);
    }
    return out;
  }

  /**
   * Whether `group`'s partial ratio would let the child's hosts admit more than they do now
   * (`loosens`): then the reply leaves the bucket out, and the hosts keep the ratio they hold until
   * a tick has counted every child (or the bucket's regathering is over). A partial sum can only
   * under-count the offered rate, so its ratio is a lower bound: sent when it asks at least as much
   * as the hosts already do (after an outage, when their held ratio decayed; a new bucket, which
   * they do not limit yet), withheld when it would undo a ratio still in force (the first zone's
   * forward to a restarted controller, its sum a tenth of the fleet's; the first aggregator's
   * forward after a partition that expired every child, its sum its own hosts' share).
   */
  function loosensChild(group: Group, usage: ChildUsage): boolean {
    // Reports cover about an interval: the calls the share was measured on.
    return loosens(group.dropRatio, usage, (usage.offeredRps * limits.config.intervalMs) / 1000);
  }

  function resetGroup(group: Group): void {
    group.partial = false;
    group.offeredRps = 0;
    group.admittedRps = 0;
    group.wouldDropRps = 0;
    group.children = 0;
  }

  function addTo(group: Group, usage: ChildUsage, scale: number): void {
    group.offeredRps += usage.offeredRps * scale;
    group.admittedRps += usage.admittedRps * scale;
    group.wouldDropRps += usage.wouldDropRps * scale;
    group.children++;
    usage.countedIn = group;
    usage.countedScale = scale;
  }

  function subtractFrom(group: Group, usage: ChildUsage): void {
    const scale = usage.countedScale;
    // max(0, ...): float sums must not go below zero between the ticks that resum them.
    group.offeredRps = Math.max(0, group.offeredRps - usage.offeredRps * scale);
    group.admittedRps = Math.max(0, group.admittedRps - usage.admittedRps * scale);
    group.wouldDropRps = Math.max(0, group.wouldDropRps - usage.wouldDropRps * scale);
    group.children--;
    usage.countedIn = undefined;
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
  function recomputeOnReport(child: ChildState, previousUsage: readonly ChildUsage[]): void {
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
        if (!firstFromReport(bucket)) continue;
        if (group === undefined) {
          group = newGroup(bucket.resolved);
          bucket.zones!.set(child.zone, group);
        }
        group.partial = true;
      }
      const cap = tickCaps?.get(bucket);
      let scale = 1;
      if (cap !== undefined) {
        scale = clipScale(usage.offeredRps, child.hostCount, cap);
        if (scale < 1) countClipped(child.tier);
      }
      addTo(group, usage, scale);
      touched.set(group, bucket);
    }
    if (touched.size === 0) return;
    version++;
    for (const [group, bucket] of touched) compute(group, bucket.resolved);
  }

  /**
   * Whether a bucket's group without a ratio may get its first one from a report alone. Such a
   * group holds no other child's usage unless a reload reset it (`awaitingTick`): every usage of
   * the bucket is counted at each tick, and after it by the report that brings it.
   */
  function firstFromReport(bucket: BucketState): boolean {
    if (bucket.awaitingTick) return false;
    return reporterCap === undefined || tickCaps?.has(bucket) === true;
  }

  function countClipped(tier: Tier): void {
    const name = tierName(tier);
    counters.clippedUsages[name] = (counters.clippedUsages[name] ?? 0) + 1;
  }

  /** Per-host bound of each bucket this tick, from every fresh child's per-host rate. */
  function reporterCaps(cap: ReporterCap): Map<BucketState, number> {
    const rates = new Map<BucketState, number[]>();
    for (const child of children.values()) {
      for (const usage of child.usage) {
        let list = rates.get(usage.bucket);
        if (!list) {
          list = [];
          rates.set(usage.bucket, list);
        }
        list.push(usage.offeredRps / Math.max(1, child.hostCount));
      }
    }
    const caps = new Map<BucketState, number>();
    for (const [bucket, list] of rates) caps.set(bucket, perHostCapRps(cap, list));
    return caps;
  }

  /** Reused for every bucket of a tick (policies must not keep it): 100,000 buckets, no garbage. */
  const input: RatioInput = { offeredRps: 0, admittedRps: 0, limitRps: 0 };

  function compute(group: Group, resolved: ResolvedBucket): void {
    group.limitRps = resolved.limitRps;
    group.mode = toMode(resolved.mode);
    input.offeredRps = group.offeredRps;
    input.admittedRps = group.admittedRps - group.wouldDropRps;
    input.limitRps = resolved.limitRps;
    group.dropRatio = policy.nextDropRatio(group.policyState, input);
    group.computed = true;
    group.version = version;
    group.directive = undefined;
  }

  function tick(): void {
    const nowMs = scheduler.nowMs();
    expireChildren(nowMs);
    for (const bucket of buckets.values()) {
      bucket.awaitingTick = false;
      resetGroup(bucket.total);
      if (bucket.zones) for (const group of bucket.zones.values()) resetGroup(group);
    }
    const caps = reporterCap ? reporterCaps(reporterCap) : undefined;
    tickCaps = caps;
    for (const child of children.values()) {
      for (const usage of child.usage) {
        const bucket = usage.bucket;
        if (bucket.removed) continue;
        let scale = 1;
        if (caps) {
          scale = clipScale(usage.offeredRps, child.hostCount, caps.get(bucket) ?? Number.POSITIVE_INFINITY);
          if (scale < 1) countClipped(child.tier);
        }
        addTo(bucket.total, usage, scale);
        if (bucket.zones) {
          let group = bucket.zones.get(child.zone);
          if (!group) {
            group = newGroup(bucket.resolved);
            bucket.zones.set(child.zone, group);
          }
          addTo(group, usage, scale);
        }
      }
    }
    version++;
    counters.ticks++;
    capacityWarned = false;
    const idleSinceMs = nowMs - bucketExpiryMs;
    for (const bucket of buckets.values()) {
      if (bucket.total.children === 0 && bucket.lastReportedMs < idleSinceMs) {
        removeBucket(bucket);
        counters.expiredBuckets++;
        continue;
      }
      if (bucket.total.children === 0) bucket.emptied = true;
      if (bucket.zones) {
        for (const [zone, group] of bucket.zones) {
          // A zone whose children all expired: its memory goes with them (bounded by zones seen).
          if (group.children === 0) bucket.zones.delete(zone);
          else compute(group, bucket.resolved);
        }
        bucket.total.limitRps = bucket.resolved.limitRps;
        bucket.total.mode = toMode(bucket.resolved.mode);
      } else {
        compute(bucket.total, bucket.resolved);
      }
    }
  }

  function schedule(): void {
    timer = scheduler.setTimeout(() => {
      if (!running) return;
      tick();
      schedule();
    }, limits.config.intervalMs);
  }

  function updateConfig(config: LimitsConfig): void {
    const next = compileLimits(config);
    const previousSpec = JSON.stringify(policy.spec);
    limits = next;
    childExpiryMs = options.childExpiryMs ?? 3 * next.config.intervalMs;
    bucketExpiryMs = options.bucketExpiryMs ?? 10 * next.config.intervalMs;
    let resetMemory = false;
    if (!options.ratioPolicy) {
      const candidate = createRatioPolicy(next.config.ratioPolicy);
      if (JSON.stringify(candidate.spec) !== previousSpec) {
        policy = candidate;
        resetMemory = true;
      }
    }
    instances.clear();
    for (const bucket of [...buckets.values()]) {
      const resolved = matchBucket(next, bucket.key);
      if (!resolved) {
        removeBucket(bucket);
        continue;
      }
      if (resolved.instance !== undefined)
        instances.set(resolved.rule, (instances.get(resolved.rule) ?? 0) + 1);
      const scopeChanged = resolved.scope !== bucket.resolved.scope;
      bucket.resolved = resolved;
      if (scopeChanged || resetMemory) {
        bucket.total = newGroup(resolved);
        bucket.zones = resolved.scope === 'zone' ? new Map() : undefined;
        bucket.awaitingTick = true;
      }
    }
    unknownKeys.clear();
    unknownLog.clear();
    logger.info(
      { controller: options.id, buckets: next.config.buckets.length, policyReset: resetMemory },
      'control: limits updated',
    );
  }

  function snapshot(bounds: ControllerSnapshotOptions = {}): ControllerSnapshot {
    const listBuckets = bounds.maxBuckets ?? Number.POSITIVE_INFINITY;
    const listChildren = bounds.maxChildren ?? Number.POSITIVE_INFINITY;
    // Bounded: one pass over the offered rates (a typed sort, no objects) picks the buckets, and
    // only those are copied and sorted; an idle page costs the same at 10 buckets or 100,000.
    const listed =
      buckets.size <= listBuckets
        ? buckets.values()
        : selectBusiest([...buckets.values()], listBuckets, (b) => b.total.offeredRps);
    const bucketList: ControllerBucketSnapshot[] = [];
    for (const bucket of listed) {
      const total = bucket.total;
      const out: ControllerBucketSnapshot = {
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
        out.zones = [...bucket.zones]
          .map(([zone, group]) => ({
            zone,
            offeredRps: group.offeredRps,
            admittedRps: group.admittedRps,
            wouldDropRps: group.wouldDropRps,
            dropRatio: group.dropRatio,
            children: group.children,
          }))
          .sort((a, b) => (a.zone < b.zone ? -1 : a.zone > b.zone ? 1 : 0));
        out.dropRatio = out.zones.reduce((max, z) => Math.max(max, z.dropRatio), 0);
      }
      bucketList.push(out);
    }
    bucketList.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    let hostsTotal = 0;
    for (const child of children.values()) hostsTotal += child.hostCount;
    // The controller's own `maxChildren` (10,000) bounds this sort: cheap next to a tick.
    const childList: ControllerChildSnapshot[] =
      listChildren <= 0
        ? []
        : [...children.values()]
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
    return {
      id: options.id,
      epoch,
      version,
      nowMs: scheduler.nowMs(),
      intervalMs: limits.config.intervalMs,
      ratioPolicy: policy.spec,
      buckets: bucketList,
      bucketsTotal: buckets.size,
      children: childList,
      childrenTotal: children.size,
      hostsTotal,
      unknownBucketKeys: [...unknownKeys],
      counters: {
        ...counters,
        rejectedReports: { ...counters.rejectedReports },
        clippedUsages: { ...counters.clippedUsages },
      },
    };
  }

  return {
    handleReport,
    countRefusal(code) {
      counters.rejectedReports[code] = (counters.rejectedReports[code] ?? 0) + 1;
    },
    start() {
      if (running) return;
      running = true;
      schedule();
    },
    stop() {
      running = false;
      timer?.cancel();
      timer = undefined;
    },
    tick,
    updateConfig,
    snapshot,
    epoch,
  };
}

/** Random bits below the start time in a default epoch. */
const EPOCH_RANDOM_BITS = 10;

/**
 * A controller's default epoch: its start time, then random bits. Epochs must be unique per
 * process: hosts and aggregators take (epoch, version) for one computation's identity and never go
 * back to a lower version within an epoch, while versions count per process. Two replicas with one
 * epoch (started in the same millisecond) are one identity with two counters: when the one ahead
 * died, hosts refused the survivor's directives until its version caught up, and decayed to
 * admitting everything meanwhile (test/control/replica-epochs.test.ts). The random bits only break
 * that tie: a later millisecond still wins. 2^53 / 2^10 ms is the year 2248.
 */
export function startEpoch(nowMs: number, random: Random): number {
  const scale = 2 ** EPOCH_RANDOM_BITS;
  return Math.floor(nowMs) * scale + Math.floor(random() * scale);
}

function toMode(mode: 'enforce' | 'shadow'): Mode {
  return mode === 'shadow' ? Mode.SHADOW : Mode.ENFORCE;
}
