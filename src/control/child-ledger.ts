import type { Scheduler } from '../core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import type { BucketUsage, ReportRequest, Tier } from '../gen/spillway/v1/control_pb.js';
import { trustedHostCount } from '../protocol/trusted-host-count.js';
import { type ReportLimits, validateReport } from '../protocol/validate-report.js';
import type { ReportContext } from '../transport/control-transport.js';
import { sliceToYield } from './fair-slots.js';
import { RecentSequences } from './recent-sequences.js';
import { ExpiredReporterArrivals, isLateReport, type ReportArrivals } from './report-arrivals.js';
import { clipScale, perHostCapRps, type ReporterCap } from './reporter-cap.js';
import { type TierName, tierName } from './tier-name.js';
import { checkTokenZone, reporterKey } from './token-zone.js';

/** A child's latest usage of one bucket, as rates (its counts over its own window). */
export interface UsageRates {
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
}

/** What the ledger needs of a tier's usage record: the rates and the tier's bucket they are for. */
export interface TrackedUsage<B> extends UsageRates {
  readonly bucket: B;
}

/** One child as a receiving tier knows it: a host at an aggregator, a host or aggregator at a controller. */
export interface Child<U> {
  id: string;
  zone: string;
  region: string;
  tier: Tier;
  /** Data-plane hosts the child stands for (`trustedHostCount`). */
  hostCount: number;
  lastSeenMs: number;
  sequences: RecentSequences;
  /** Window end (sender's clock) of the last report applied. */
  lastWindowEndMs: bigint;
  arrivals: ReportArrivals;
  usage: U[];
  /** Left out of the sums until then: the aggregator it came from still counts it. */
  countedElsewhereUntilMs: number;
  /** The share of the table it is counted in (`ChildLedgerOptions.sliceOf`). */
  slice: string;
}

/** What one report did to the ledger; the tier answers it. */
export type Intake<U> =
  /** Late (report-arrivals.ts): left out of the sums; `child` is undefined when not tracked. */
  | { kind: 'late'; nowMs: number; child: Child<U> | undefined }
  /** A retry of a report already counted: nothing changed but `lastSeenMs`. */
  | { kind: 'duplicate'; nowMs: number; child: Child<U>; wasCounted: boolean }
  /** Applied: `child.usage` replaced `previousUsage`. */
  | { kind: 'news'; nowMs: number; child: Child<U>; previousUsage: readonly U[]; wasCounted: boolean };

export interface ChildLedgerCounters {
  /** Reports accepted (late and duplicate ones included, refused ones not). */
  reports: number;
  duplicateReports: number;
  lateReports: number;
  /** Refused reports by error code. */
  rejectedReports: Record<string, number>;
  expiredChildren: number;
  /**
   * Children forgotten to make room for a child of a slice holding fewer (`sliceOf`): the table
   * was full, and one slice (a zone's token, say) held most of it.
   */
  evictedChildren: number;
  /** Children left out of the sums on (re)joining because another aggregator still counts them. */
  countedElsewhere: number;
  /** Usages scaled down by the reporter cap, by the child's tier. */
  clippedUsages: Partial<Record<TierName, number>>;
}

export interface ChildLedgerOptions<B, U extends TrackedUsage<B>> {
  /** This tier's responder id: a child it acknowledged last is counted nowhere else. */
  selfId: string;
  scheduler: Scheduler;
  maxChildren: number;
  reportLimits: ReportLimits;
  /** The reporting interval in force (an aggregator's follows its parent's replies). */
  intervalMs: () => number;
  /** A child silent longer than this is forgotten. */
  expiryMs: () => number;
  /**
   * A child silent longer than this stays tracked but leaves the sums (an aggregator's host grace).
   * Undefined: a child counts until it expires.
   */
  graceMs?: () => number;
  /**
   * Leave a (re)joining child out of the sums while the aggregator that acknowledged its last
   * report still counts it, for what is left of that one's grace (`graceMs`, which the tier
   * shares). For aggregators, whose hosts move between them; the controller's children do not.
   */
  excludeWhileCountedElsewhere: boolean;
  /** The tier's own checks after validation, before any state: throw SpillwayError to refuse. */
  checkReport?: (request: ReportRequest) => void;
  /** The error that refuses a new child past `maxChildren`. */
  overCapacity: () => SpillwayError;
  /**
   * The share of the table a new child is counted in: the zone of its token at the controller, so
   * that one zone cannot fill the table for all. When the table is full, a new child whose slice
   * holds at least two fewer children than the fullest slice takes the place of that slice's
   * longest-silent child (max-min fair slots). Default: one slice for all.
   */
  sliceOf?: (request: ReportRequest, context: ReportContext) => string;
  /** Most children one slice holds; a new one past it is refused. Default: no bound but `maxChildren`. */
  maxChildrenPerSlice?: number;
  /**
   * The tier's record of one bucket of an applied report, or undefined to leave the bucket out
   * (unknown, over capacity). `rates` is reused for every bucket: copy, do not keep it.
   */
  usageOf: (entry: BucketUsage, rates: Readonly<UsageRates>, nowMs: number) => U | undefined;
}

/**
 * The report intake every receiving tier shares: validation, the reporter's identity (scoped by its
 * token's zone), duplicates and late reports, the bound on children, usage as rates, expiry of
 * silent children, the reporter cap's per-bucket bounds, and the refusal counters. What a tier
 * does with a child's usage (sums, directives) stays with the tier: it builds each usage record
 * (`usageOf`) and reads the result of `intake`.
 *
 * Synchronous; one report is taken whole before the next.
 */
export class ChildLedger<B, U extends TrackedUsage<B>> {
  readonly #options: ChildLedgerOptions<B, U>;
  readonly #children = new Map<string, Child<U>>();
  /** Children tracked per slice (`sliceOf`). */
  readonly #sliceSizes = new Map<string, number>();
  /** Expired children's report timing, for a report of theirs that turns up late. */
  readonly #expiredArrivals: ExpiredReporterArrivals;
  /** Reused for every bucket of a report (see `usageOf`). */
  readonly #rates: UsageRates = { offeredRps: 0, admittedRps: 0, wouldDropRps: 0 };
  readonly counters: ChildLedgerCounters = {
    reports: 0,
    duplicateReports: 0,
    lateReports: 0,
    rejectedReports: {},
    expiredChildren: 0,
    evictedChildren: 0,
    countedElsewhere: 0,
    clippedUsages: {},
  };

  constructor(options: ChildLedgerOptions<B, U>) {
    this.#options = options;
    this.#expiredArrivals = new ExpiredReporterArrivals(options.maxChildren);
  }

  get size(): number {
    return this.#children.size;
  }

  /** Every tracked child, in the order they joined. */
  children(): IterableIterator<Child<U>> {
    return this.#children.values();
  }

  /** Takes one report; throws SpillwayError (counted) to refuse it. */
  intake(request: ReportRequest, context: ReportContext): Intake<U> {
    try {
      validateReport(request, this.#options.reportLimits);
      checkTokenZone(request, context);
      this.#options.checkReport?.(request);
    } catch (error) {
      this.#refuse(error);
    }
    const nowMs = this.#options.scheduler.nowMs();
    const key = reporterKey(request, context);
    let child = this.#children.get(key);
    const arrivals = child?.arrivals ?? this.#expiredArrivals.take(key);
    if (isLateReport(child, arrivals, request, nowMs, this.#options.intervalMs(), this.#children.values())) {
      this.counters.reports++;
      this.counters.lateReports++;
      if (!child) this.#expiredArrivals.remember(key, arrivals);
      // The sender has reported since, or gave up on this report long ago.
      return { kind: 'late', nowMs, child };
    }
    // Counted in the sums until now, or (re)joining them.
    const wasCounted = child !== undefined && this.#withinGrace(child, nowMs);
    if (!child) {
      const slice = this.#options.sliceOf?.(request, context) ?? '';
      const refusal = this.#makeRoom(slice, nowMs);
      if (refusal !== undefined) {
        this.#expiredArrivals.remember(key, arrivals);
        this.#refuse(refusal);
      }
      child = {
        id: request.reporterId,
        zone: request.zone,
        region: request.region,
        tier: request.tier,
        hostCount: 0,
        lastSeenMs: nowMs,
        sequences: new RecentSequences(),
        lastWindowEndMs: request.windowEndMs,
        arrivals,
        usage: [],
        countedElsewhereUntilMs: Number.NEGATIVE_INFINITY,
        slice,
      };
      this.#children.set(key, child);
      this.#sliceSizes.set(slice, (this.#sliceSizes.get(slice) ?? 0) + 1);
    }
    this.counters.reports++;
    child.lastSeenMs = nowMs;
    if (child.sequences.has(request.sequence, request.windowEndMs)) {
      this.counters.duplicateReports++;
      return { kind: 'duplicate', nowMs, child, wasCounted };
    }
    const previousUsage = child.usage;
    child.sequences.add(request.sequence, request.windowEndMs);
    child.lastWindowEndMs = request.windowEndMs;
    child.zone = request.zone;
    child.region = request.region;
    child.tier = request.tier;
    child.hostCount = trustedHostCount(request);
    child.usage = this.#usageOf(request, nowMs);
    if (!wasCounted && this.#options.excludeWhileCountedElsewhere) {
      this.#excludeWhileCountedElsewhere(child, request, nowMs);
    }
    return { kind: 'news', nowMs, child, previousUsage, wasCounted };
  }

  /** The report counters, copied, as both tiers' snapshots list them first. */
  reportCounters(): Pick<
    ChildLedgerCounters,
    'reports' | 'duplicateReports' | 'lateReports' | 'rejectedReports'
  > {
    const { reports, duplicateReports, lateReports, rejectedReports } = this.counters;
    return { reports, duplicateReports, lateReports, rejectedReports: { ...rejectedReports } };
  }

  /** Counts a refusal made before `intake` (by the transport) with the ones `intake` makes. */
  countRefusal(code: string): void {
    this.counters.rejectedReports[code] = (this.counters.rejectedReports[code] ?? 0) + 1;
  }

  /** Forgets children silent longer than the expiry. */
  expire(nowMs: number): void {
    const expiryMs = this.#options.expiryMs();
    for (const [key, child] of this.#children) {
      if (nowMs - child.lastSeenMs > expiryMs) {
        this.#forget(key, child);
        this.counters.expiredChildren++;
      }
    }
  }

  /** In the sums: within the grace (if any), and not counted by the aggregator it came from. */
  isCounted(child: Child<U>, nowMs: number): boolean {
    return this.#withinGrace(child, nowMs) && nowMs >= child.countedElsewhereUntilMs;
  }

  /** Per-host bound of each bucket, from every counted child's per-host offered rate. */
  bucketCaps(cap: ReporterCap, nowMs: number): Map<B, number> {
    const rates = new Map<B, number[]>();
    for (const child of this.#children.values()) {
      if (!this.isCounted(child, nowMs)) continue;
      for (const usage of child.usage) {
        let list = rates.get(usage.bucket);
        if (!list) {
          list = [];
          rates.set(usage.bucket, list);
        }
        list.push(usage.offeredRps / Math.max(1, child.hostCount));
      }
    }
    const caps = new Map<B, number>();
    for (const [bucket, list] of rates) caps.set(bucket, perHostCapRps(cap, list));
    return caps;
  }

  /**
   * What to scale `usage` by in a sum so the child stays within its bucket's bound in `caps`
   * (1 without caps or a bound); a clip is counted by the child's tier.
   */
  capScale(child: Child<U>, usage: U, caps: ReadonlyMap<B, number> | undefined): number {
    if (caps === undefined) return 1;
    const scale = clipScale(
      usage.offeredRps,
      child.hostCount,
      caps.get(usage.bucket) ?? Number.POSITIVE_INFINITY,
    );
    if (scale < 1) {
      const name = tierName(child.tier);
      this.counters.clippedUsages[name] = (this.counters.clippedUsages[name] ?? 0) + 1;
    }
    return scale;
  }

  /** Room for a new child of `slice`, or the error that refuses it. */
  #makeRoom(slice: string, nowMs: number): SpillwayError | undefined {
    const perSlice = this.#options.maxChildrenPerSlice;
    const full = () =>
      this.#children.size >= this.#options.maxChildren ||
      (perSlice !== undefined && (this.#sliceSizes.get(slice) ?? 0) >= perSlice);
    if (full()) this.expire(nowMs);
    if (!full()) return undefined;
    const held = this.#sliceSizes.get(slice) ?? 0;
    if (perSlice !== undefined && held >= perSlice) {
      return new SpillwayError(
        ErrorCode.CapacityExceeded,
        `${perSlice} children of ${slice === '' ? 'one slice' : `"${slice.slice(0, 64)}"`} are tracked already`,
        { field: 'reporterId', maxChildrenPerSlice: perSlice },
      );
    }
    const fullest = sliceToYield(this.#sliceSizes, held);
    if (fullest === undefined) return this.#options.overCapacity();
    let victimKey: string | undefined;
    let victim: Child<U> | undefined;
    for (const [key, child] of this.#children) {
      if (child.slice === fullest && (victim === undefined || child.lastSeenMs < victim.lastSeenMs)) {
        victimKey = key;
        victim = child;
      }
    }
    this.#forget(victimKey!, victim!);
    this.counters.evictedChildren++;
    return undefined;
  }

  #forget(key: string, child: Child<U>): void {
    this.#children.delete(key);
    this.#expiredArrivals.remember(key, child.arrivals);
    const left = (this.#sliceSizes.get(child.slice) ?? 1) - 1;
    if (left > 0) this.#sliceSizes.set(child.slice, left);
    else this.#sliceSizes.delete(child.slice);
  }

  #withinGrace(child: Child<U>, nowMs: number): boolean {
    const graceMs = this.#options.graceMs;
    return graceMs === undefined || nowMs - child.lastSeenMs <= graceMs();
  }

  #usageOf(request: ReportRequest, nowMs: number): U[] {
    const perSecond = 1000 / Number(request.windowEndMs - request.windowStartMs);
    const rates = this.#rates;
    const usage: U[] = [];
    for (const entry of request.buckets) {
      rates.offeredRps = entry.offered * perSecond;
      rates.admittedRps = entry.admitted * perSecond;
      rates.wouldDropRps = entry.wouldDrop * perSecond;
      const record = this.#options.usageOf(entry, rates, nowMs);
      if (record !== undefined) usage.push(record);
    }
    return usage;
  }

  /**
   * A child (re)joining the sums that another aggregator acknowledged recently is still counted
   * there: that aggregator keeps its last rate for a grace from its last report, and forwards it.
   * Counted here as well, it would count twice at the parent for that long, so it joins these
   * sums when the other's grace runs out. The time since that acknowledgement is the sender's own
   * (`window_end_ms - acknowledged_window_end_ms`, one clock); the grace is this tier's, which its
   * aggregators share. Not for a child this aggregator acknowledged itself (it restarted, or the
   * child came back), which nobody else counts. Trade-offs: docs/control-plane.md, "Moving to
   * another aggregator".
   */
  #excludeWhileCountedElsewhere(child: Child<U>, request: ReportRequest, nowMs: number): void {
    child.countedElsewhereUntilMs = Number.NEGATIVE_INFINITY;
    const other = request.acknowledgedBy;
    if (other === '' || other === this.#options.selfId) return;
    const sinceMs = Math.max(0, Number(request.windowEndMs - request.acknowledgedWindowEndMs));
    const untilMs = nowMs - sinceMs + (this.#options.graceMs?.() ?? 0);
    if (untilMs <= nowMs) return;
    child.countedElsewhereUntilMs = untilMs;
    this.counters.countedElsewhere++;
  }

  #refuse(error: unknown): never {
    this.countRefusal(isSpillwayError(error) ? error.code : 'ERR_UNKNOWN');
    throw error;
  }
}
