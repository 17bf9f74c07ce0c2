import { create } from '@bufbuild/protobuf';
import { type Cancellable, type Random, type Scheduler, systemScheduler } from '../core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import {
  type BucketUsage,
  BucketUsageSchema,
  type Directive,
  DirectiveSchema,
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
  Tier,
} from '../gen/spillway/v1/control_pb.js';
import { acknowledgingId } from '../protocol/acknowledging-id.js';
import { hostsSpokenFor } from '../protocol/hosts-spoken-for.js';
import { MAX_REPORT_WINDOW_MS, RECEIVER_MAX_BUCKETS_PER_REPORT } from '../protocol/report-bounds.js';
import { type ReportLimits, validateReport } from '../protocol/validate-report.js';
import type { ControlClient, ReportContext, ReportHandler } from '../transport/control-transport.js';
import { type ControlLogger, silentLogger } from './control-logger.js';
import { assertAggregatorOptionNames } from './control-options.js';
import { loosens } from './loosens.js';
import { ParentEpoch } from './parent-epoch.js';
import { RecentSequences } from './recent-sequences.js';
import { DepartedArrivals, isOldNews, type ReportArrivals } from './report-arrivals.js';
import { clipScale, perHostCapRps, type ReporterCap, validateReporterCap } from './reporter-cap.js';
import { selectBusiest } from './select-busiest.js';
import { type TierName, tierName } from './tier-name.js';
import { checkTokenZone, reporterKey } from './token-zone.js';

export interface AggregatorOptions {
  /** Reporter id upward and responder id downward. */
  id: string;
  /** Put in every forwarded report; the controller applies zone-scoped limits by it. */
  zone: string;
  region?: string;
  /** Parents in failover order; the first healthy one gets each forward. The caller owns (closes) them. */
  parents: ControlClient[];
  /**
   * `failover` (default): each forward goes to the first healthy parent. `fanout`: each forward goes
   * to every parent at once (controller replicas side by side); every reply's directives are applied
   * and per bucket the newest (epoch, version) wins while fresh, so the replica started last leads
   * and the other takes over when the leader's directives reach their TTL.
   */
  parentMode?: 'failover' | 'fanout';
  /**
   * Zones this aggregator takes reports from; a report claiming another zone is refused
   * (ERR_SPILLWAY_INVALID_REPORT, field `zone`) before it touches any state. Default: any zone.
   */
  acceptZones?: readonly string[];
  /**
   * Tiers this aggregator takes reports from; a report of another tier is refused
   * (ERR_SPILLWAY_INVALID_REPORT, field `tier`) before it touches any state. Default `['host']`: a
   * zone aggregator's children are hosts, and a host that claimed the aggregator tier would have its
   * `host_count` believed (lifting its reporter cap). A regional aggregator over zone aggregators
   * sets `['aggregator']`. A report without a tier counts as a host's.
   */
  childTiers?: readonly ChildTier[];
  /** Bounds one host's say in a bucket's zone sum (see reporter-cap.ts). Default: none. */
  reporterCap?: ReporterCap;
  /** Forward period until a parent's reply sets another. Default 1000 ms. */
  intervalMs?: number;
  /** Per attempt. Default half the interval. */
  reportTimeoutMs?: number;
  scheduler?: Scheduler;
  /** For forward jitter. Default Math.random. */
  random?: Random;
  /** Forward delay is the interval times 1 ± jitterRatio. Default 0.1. */
  jitterRatio?: number;
  /** A host that missed reports keeps counting at its last rate this long. Default 2.5 intervals. */
  hostGraceMs?: number;
  /** A host silent this long is forgotten. Default 10 intervals. */
  hostExpiryMs?: number;
  /** A parent that failed is tried after healthy ones for this long. Default 5 intervals. */
  parentBackoffMs?: number;
  /** Most hosts tracked; a new host past it is refused (ERR_SPILLWAY_CAPACITY_EXCEEDED). Default 10,000. */
  maxHosts?: number;
  /** Most bucket keys tracked; new keys past it are neither forwarded nor answered. Default 100,000. */
  maxBuckets?: number;
  /**
   * Most buckets in one forward: the parent refuses a larger report whole (its `maxBucketsPerReport`),
   * which would leave the zone's every bucket unreported. Past it the busiest buckets are forwarded
   * and the rest left out (counted). Default 10,000, the receivers' default bound.
   */
  maxBucketsPerForward?: number;
  reportLimits?: ReportLimits;
  /** Sent upward in `auth_token`. */
  authToken?: string;
  logger?: ControlLogger;
}

export type ChildTier = 'host' | 'aggregator';

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
   * the host admit more than it does now (see `relay`).
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
   * last report recently enough that it still counts them (one per joining; see `holdOut`).
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

export interface Aggregator {
  /** Accepts one report, replies with the cached directives for its buckets. Never waits on a parent. */
  handleReport: ReportHandler;
  /**
   * Counts a report its transport refused before `handleReport` saw it (undecodable, over the
   * transport's bounds) with the ones `handleReport` refuses, in `counters.rejectedReports`.
   */
  countRefusal(code: string): void;
  start(): void;
  /** Stops the timer and waits for an in-flight forward to settle. */
  stop(): Promise<void>;
  /** Forward now (after the one in flight, if any). */
  flush(): Promise<void>;
  snapshot(): AggregatorSnapshot;
  /**
   * What a health check reads, without a snapshot: a snapshot sums every bucket (423 ms at
   * 100,000 buckets, measured 2026-12-02), too much for a probe that runs every few seconds.
   */
  health(): { hosts: number; parentsHealthy: number; lastForwardAtMs: number | undefined };
}

interface CachedDirective {
  received: Directive;
  receivedAtMs: number;
  /** Sequence of the forward whose reply carried it: its ratio counts the hosts that forward summed. */
  forwardSequence: bigint;
  epoch: bigint;
  version: bigint;
  /** A copy with the TTL left at `relayedAtMs`, shared by replies until refreshed. */
  relayed: Directive;
  relayedAtMs: number;
}

interface BucketEntry {
  key: string;
  removed: boolean;
  lastReportedMs: number;
  directive: CachedDirective | undefined;
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  hosts: number;
  /** The oldest held epoch its counted hosts report (0n: none): forwarded as `held_epoch`. */
  heldEpoch: bigint;
}

interface HostUsage {
  bucket: BucketEntry;
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  /** Calls offered in the report's window: the sample the admitted share was measured on. */
  offeredCalls: number;
  /** Epoch of the ratio the reporter's hosts apply (0n: none). */
  heldEpoch: bigint;
  /**
   * The first forward whose sum counts this usage since the host (re)joined the bucket's sums (new
   * to this aggregator, new to the bucket, or back after the host grace). A directive from an
   * earlier forward was computed without it.
   */
  joinedForward: bigint;
}

interface HostState {
  id: string;
  zone: string;
  tier: Tier;
  hostCount: number;
  lastSeenMs: number;
  sequences: RecentSequences;
  /** Window end (sender's clock) of the last report applied. */
  lastWindowEndMs: bigint;
  arrivals: ReportArrivals;
  usage: HostUsage[];
  /** Left out of the sums until then: the aggregator it came from still counts it (`holdOut`). */
  heldOutUntilMs: number;
}

/**
 * Relayed TTLs are refreshed at most this often: replies share one directive object per bucket, and
 * a host may see a TTL up to this much longer than exact. Small next to any sane TTL (seconds).
 */
const RELAY_REFRESH_MS = 50;
const MIN_INTERVAL_MS = 100;
const MAX_INTERVAL_MS = 60_000;

/**
 * A zone aggregator: sums the latest rate of every host (or lower aggregator), forwards the zone's
 * usage to a parent as one report per interval, and relays the parent's directives down.
 *
 * Flush triggers: the jittered interval timer, `flush()`, and two that only fire after an outage
 * or a start, each at most once per occasion: a failed parent's connection coming back
 * (`whenConnected`) while no parent answers, and a host report while no directive is fresh. At
 * most one forward is in flight; a timer firing while one is in flight is skipped (counted). Host
 * reports are answered from the directive cache synchronously, so a slow or dead parent never
 * delays or fails a host; the relayed TTL shrinks with the directive's age, so hosts' stale
 * policies see the truth. A host that (re)joins the sums is not sent a directive computed without
 * it where that would loosen what it applies (`relay`): it keeps its own until a forward counts it.
 *
 * Sums are associative: several aggregators may share a zone's hosts, and an aggregator's parent
 * may be another aggregator (zone -> region -> controller).
 */
export function createAggregator(options: AggregatorOptions): Aggregator {
  assertAggregatorOptionNames(options);
  const scheduler = options.scheduler ?? systemScheduler;
  const random = options.random ?? Math.random;
  const logger = options.logger ?? silentLogger;
  const jitterRatio = options.jitterRatio ?? 0.1;
  const maxHosts = options.maxHosts ?? 10_000;
  const maxBuckets = options.maxBuckets ?? 100_000;
  const maxBucketsPerForward = options.maxBucketsPerForward ?? RECEIVER_MAX_BUCKETS_PER_REPORT;
  if (!Number.isInteger(maxBucketsPerForward) || maxBucketsPerForward < 1) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'maxBucketsPerForward must be an integer >= 1', {
      field: 'maxBucketsPerForward',
    });
  }
  const reportLimits = options.reportLimits ?? {};
  const configuredIntervalMs = options.intervalMs ?? 1000;
  const fanout = options.parentMode === 'fanout';
  if (options.parentMode !== undefined && options.parentMode !== 'failover' && !fanout) {
    throw new SpillwayError(ErrorCode.InvalidOption, "parentMode must be 'failover' or 'fanout'", {
      field: 'parentMode',
    });
  }
  const acceptZones = options.acceptZones ? new Set(options.acceptZones) : undefined;
  const childTiers = new Set<ChildTier>(options.childTiers ?? ['host']);
  if (childTiers.size === 0 || [...childTiers].some((t) => t !== 'host' && t !== 'aggregator')) {
    throw new SpillwayError(ErrorCode.InvalidOption, "childTiers must list 'host' and/or 'aggregator'", {
      field: 'childTiers',
    });
  }
  const reporterCap =
    options.reporterCap === undefined ? undefined : validateReporterCap(options.reporterCap);
  if (options.parents.length === 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'aggregator needs at least one parent', {
      field: 'parents',
    });
  }

  let intervalMs = configuredIntervalMs;
  const parentEpoch = new ParentEpoch();
  const hosts = new Map<string, HostState>();
  /** Forgotten hosts' report timing, for a report of theirs that turns up late. */
  const departed = new DepartedArrivals(maxHosts);
  const buckets = new Map<string, BucketEntry>();
  const parentDownUntilMs = options.parents.map(() => Number.NEGATIVE_INFINITY);
  let sequence = 0n;
  let lastForwardEndMs = Math.floor(scheduler.nowMs());
  let lastForward: AggregatorSnapshot['lastForward'];
  let inFlight: Promise<void> | undefined;
  let timer: Cancellable | undefined;
  let running = false;
  let capacityWarned = false;
  let forwardCapWarned = false;
  /** Whether the last forward got no answer from any parent. */
  let lastForwardFailed = false;
  /** Until when some cached directive is fresh (the latest receipt plus its TTL). */
  let freshUntilMs = Number.NEGATIVE_INFINITY;
  /** A cold forward (see `maybeColdForward`) may go; re-armed when a parent's directive arrives. */
  let coldForwardArmed = true;
  /** Who acknowledged this aggregator's last acknowledged forward, and its window end (failover mode). */
  let acknowledgedBy = '';
  let acknowledgedWindowEndMs = 0n;
  /** Per parent: waiting for its connection to come back after a failure (`whenConnected`). */
  const reconnectWatches: (Cancellable | undefined)[] = options.parents.map(() => undefined);

  const counters: AggregatorCounters = {
    reports: 0,
    duplicateReports: 0,
    lateReports: 0,
    rejectedReports: {},
    forwards: 0,
    forwardFailures: 0,
    parentFailures: 0,
    skippedForwards: 0,
    reconnectForwards: 0,
    coldForwards: 0,
    staleDirectives: 0,
    withheldDirectives: 0,
    bucketsOverCapacity: 0,
    bucketsLeftOutOfForwards: 0,
    expiredHosts: 0,
    heldOutReporters: 0,
    clippedUsages: {},
  };

  const hostGraceMs = () => options.hostGraceMs ?? 2.5 * intervalMs;
  const hostExpiryMs = () => options.hostExpiryMs ?? 10 * intervalMs;
  const timeoutMs = () => options.reportTimeoutMs ?? Math.max(1, intervalMs / 2);
  /** In the sums: reported within the grace, and not held out (`holdOut`). */
  const isCounted = (host: HostState, nowMs: number, grace: number) =>
    nowMs - host.lastSeenMs <= grace && nowMs >= host.heldOutUntilMs;

  function reject(error: unknown): never {
    const code = isSpillwayError(error) ? error.code : 'ERR_UNKNOWN';
    counters.rejectedReports[code] = (counters.rejectedReports[code] ?? 0) + 1;
    throw error;
  }

  function expire(nowMs: number): void {
    const expiry = hostExpiryMs();
    for (const [id, host] of hosts) {
      if (nowMs - host.lastSeenMs > expiry) {
        hosts.delete(id);
        departed.remember(id, host.arrivals);
        counters.expiredHosts++;
      }
    }
  }

  function handleReport(request: ReportRequest, context: ReportContext): ReportResponse {
    try {
      validateReport(request, reportLimits);
      checkTokenZone(request, context);
    } catch (error) {
      reject(error);
    }
    const childTier: ChildTier | undefined =
      request.tier === Tier.HOST || request.tier === Tier.UNSPECIFIED
        ? 'host'
        : request.tier === Tier.AGGREGATOR
          ? 'aggregator'
          : undefined;
    if (childTier === undefined || !childTiers.has(childTier)) {
      reject(
        new SpillwayError(
          ErrorCode.InvalidReport,
          `aggregator ${options.id} takes reports from ${[...childTiers].join(' and ')} tier children, not ${tierName(request.tier)}`,
          { field: 'tier', tier: tierName(request.tier) },
        ),
      );
    }
    if (acceptZones && !acceptZones.has(request.zone)) {
      reject(
        new SpillwayError(
          ErrorCode.InvalidReport,
          `aggregator of zone ${options.zone} refuses reports from zone "${request.zone.slice(0, 64)}"`,
          { field: 'zone', zone: request.zone.slice(0, 64) },
        ),
      );
    }
    const nowMs = scheduler.nowMs();
    const key = reporterKey(request, context);
    let host = hosts.get(key);
    const arrivals = host?.arrivals ?? departed.take(key);
    // A retry of a report already counted is a duplicate (below); news is judged by its age.
    if (isOldNews(host, arrivals, request, nowMs, intervalMs, hosts.values())) {
      counters.reports++;
      counters.lateReports++;
      if (!host) departed.remember(key, arrivals);
      // Old news: the sender has reported since, or gave up on this report long ago.
      return create(ReportResponseSchema, {
        directives: [],
        reportIntervalMs: intervalMs,
        epoch: host ? newestEpoch(host) : 0n,
        responderId: options.id,
      });
    }
    // Counted in the sums until now: its usage is in the next forward either way. Otherwise it
    // (re)joins them, and directives cached from earlier forwards were computed without it.
    const wasCounted = host !== undefined && nowMs - host.lastSeenMs <= hostGraceMs();
    const nextForward = sequence + 1n;
    if (!host) {
      if (hosts.size >= maxHosts) expire(nowMs);
      if (hosts.size >= maxHosts) {
        departed.remember(key, arrivals);
        reject(
          new SpillwayError(ErrorCode.CapacityExceeded, `aggregator tracks ${maxHosts} hosts already`, {
            field: 'reporterId',
            maxHosts,
          }),
        );
      }
      host = {
        id: request.reporterId,
        zone: request.zone,
        tier: request.tier,
        hostCount: 0,
        lastSeenMs: nowMs,
        sequences: new RecentSequences(),
        lastWindowEndMs: request.windowEndMs,
        arrivals,
        usage: [],
        heldOutUntilMs: Number.NEGATIVE_INFINITY,
      };
      hosts.set(key, host);
    }
    counters.reports++;
    host.lastSeenMs = nowMs;
    if (host.sequences.has(request.sequence, request.windowEndMs)) {
      counters.duplicateReports++;
      if (!wasCounted) for (const usage of host.usage) usage.joinedForward = nextForward;
    } else {
      const previousUsage = host.usage;
      let previousByBucket: Map<BucketEntry, HostUsage> | undefined;
      host.sequences.add(request.sequence, request.windowEndMs);
      host.lastWindowEndMs = request.windowEndMs;
      host.zone = request.zone;
      host.tier = request.tier;
      host.hostCount = hostsSpokenFor(request);
      const perSecond = 1000 / Number(request.windowEndMs - request.windowStartMs);
      const usage: HostUsage[] = [];
      for (const [index, entry] of request.buckets.entries()) {
        let bucket = buckets.get(entry.bucket);
        if (!bucket) {
          if (buckets.size >= maxBuckets) {
            counters.bucketsOverCapacity++;
            if (!capacityWarned) {
              capacityWarned = true;
              logger.warn(
                { aggregator: options.id, maxBuckets },
                'control: bucket bound reached, new keys ignored',
              );
            }
            continue;
          }
          bucket = {
            key: entry.bucket,
            removed: false,
            lastReportedMs: nowMs,
            directive: undefined,
            offeredRps: 0,
            admittedRps: 0,
            wouldDropRps: 0,
            hosts: 0,
            heldEpoch: 0n,
          };
          buckets.set(bucket.key, bucket);
        }
        bucket.lastReportedMs = nowMs;
        let joinedForward = nextForward;
        if (wasCounted) {
          // Hosts list their buckets in a stable order: the same index almost always matches.
          let previous = previousUsage[index];
          if (previous?.bucket !== bucket) {
            previousByBucket ??= new Map(previousUsage.map((u) => [u.bucket, u]));
            previous = previousByBucket.get(bucket);
          }
          if (previous) joinedForward = previous.joinedForward;
        }
        usage.push({
          bucket,
          offeredRps: entry.offered * perSecond,
          admittedRps: entry.admitted * perSecond,
          wouldDropRps: entry.wouldDrop * perSecond,
          offeredCalls: entry.offered,
          heldEpoch: entry.heldEpoch,
          joinedForward,
        });
      }
      host.usage = usage;
      if (!wasCounted) holdOut(host, request, nowMs);
    }
    const directives: Directive[] = [];
    for (const usage of host.usage) {
      const directive = relay(usage, nowMs);
      if (directive) directives.push(directive);
    }
    if (host.usage.length > 0 && nowMs >= freshUntilMs) maybeColdForward();
    return create(ReportResponseSchema, {
      directives,
      reportIntervalMs: intervalMs,
      epoch: parentEpoch.replyEpoch(newestEpoch(host), nowMs, intervalMs),
      responderId: options.id,
    });
  }

  /**
   * A reporter (re)joining the sums that another aggregator acknowledged recently is still counted
   * there: that aggregator keeps its last rate for a grace from its last report, and forwards it.
   * Counting it here as well would double it at the parent for that long. So it joins the sums
   * when the other aggregator's grace runs out: the time since that acknowledgement is the sender's
   * own (`window_end_ms - acknowledged_window_end_ms`, one clock), the grace is this aggregator's
   * (the tier shares one configuration). Not for a reporter this aggregator acknowledged itself
   * (it restarted, or the reporter came back), which nobody else counts. The parent sees either
   * side change only at that side's next forward, so whichever forwards first after the grace
   * leaves the reporter briefly counted twice or nowhere; and a dead aggregator's last sum stays
   * at its parent until the child expiry. Measured, with what it cuts and what it costs:
   * docs/control-plane.md, "Moving to another aggregator".
   */
  function holdOut(host: HostState, request: ReportRequest, nowMs: number): void {
    host.heldOutUntilMs = Number.NEGATIVE_INFINITY;
    const other = request.acknowledgedBy;
    if (other === '' || other === options.id) return;
    const sinceMs = Math.max(0, Number(request.windowEndMs - request.acknowledgedWindowEndMs));
    const untilMs = nowMs - sinceMs + hostGraceMs();
    if (untilMs <= nowMs) return;
    host.heldOutUntilMs = untilMs;
    counters.heldOutReporters++;
  }

  function newestEpoch(host: HostState): bigint {
    let epoch = 0n;
    for (const usage of host.usage) {
      const cached = usage.bucket.directive;
      if (cached && cached.epoch > epoch) epoch = cached.epoch;
    }
    return epoch;
  }

  /**
   * The cached directive with the TTL it has left, or undefined when stale or absent, or withheld.
   *
   * Withheld: the host (re)joined the bucket's sums after the forward that brought the directive,
   * and its ratio would let the host admit more than it does now (`loosens`). Such a directive
   * was computed without the host: when its hosts were cut off one after another, this
   * aggregator's last forwards before losing its own carried only part of the fleet (the other
   * aggregators' hosts already past their grace), and the ratio that came back was near 0. A
   * host back from the cut would apply it as the newest version and admit everything until the
   * loop caught up (test/control/control-plane-partition.test.ts: 449 rps against a limit of 300
   * for 1.9 s; in network namespaces a ratio near 0 for ~0.9 s). Withheld, the host
   * keeps the ratio it holds until the reply to a forward that counts it. A host that drops
   * nothing (new, no directive yet) is never withheld from: any ratio tightens it, so a cold start
   * gets the cache at its first report.
   */
  function relay(usage: HostUsage, nowMs: number): Directive | undefined {
    const cached = usage.bucket.directive;
    if (!cached) return undefined;
    const remainingMs = cached.received.ttlMs - (nowMs - cached.receivedAtMs);
    if (remainingMs <= 0) return undefined;
    if (
      cached.forwardSequence < usage.joinedForward &&
      loosens(cached.received.dropRatio, usage, usage.offeredCalls)
    ) {
      counters.withheldDirectives++;
      return undefined;
    }
    if (nowMs - cached.relayedAtMs >= RELAY_REFRESH_MS) {
      cached.relayed = create(DirectiveSchema, {
        bucket: cached.received.bucket,
        dropRatio: cached.received.dropRatio,
        mode: cached.received.mode,
        limitRps: cached.received.limitRps,
        offeredRps: cached.received.offeredRps,
        epoch: cached.received.epoch,
        version: cached.received.version,
        ttlMs: Math.floor(remainingMs),
      });
      cached.relayedAtMs = nowMs;
    }
    return cached.relayed;
  }

  /** Sum counted hosts into bucket entries; drop expired hosts and idle buckets. */
  function sum(nowMs: number): { hostCount: number } {
    expire(nowMs);
    for (const bucket of buckets.values()) {
      bucket.offeredRps = 0;
      bucket.admittedRps = 0;
      bucket.wouldDropRps = 0;
      bucket.hosts = 0;
      bucket.heldEpoch = 0n;
    }
    const grace = hostGraceMs();
    const caps = reporterCap ? reporterCaps(reporterCap, nowMs) : undefined;
    let hostCount = 0;
    for (const host of hosts.values()) {
      if (!isCounted(host, nowMs, grace)) continue;
      hostCount += host.hostCount;
      for (const usage of host.usage) {
        const bucket = usage.bucket;
        if (bucket.removed) continue;
        let scale = 1;
        if (caps) {
          scale = clipScale(usage.offeredRps, host.hostCount, caps.get(bucket) ?? Number.POSITIVE_INFINITY);
          if (scale < 1) {
            const tier = tierName(host.tier);
            counters.clippedUsages[tier] = (counters.clippedUsages[tier] ?? 0) + 1;
          }
        }
        bucket.offeredRps += usage.offeredRps * scale;
        bucket.admittedRps += usage.admittedRps * scale;
        bucket.wouldDropRps += usage.wouldDropRps * scale;
        bucket.hosts++;
        // The oldest: one host still on an earlier controller's ratio is enough to guard it.
        if (usage.heldEpoch !== 0n && (bucket.heldEpoch === 0n || usage.heldEpoch < bucket.heldEpoch)) {
          bucket.heldEpoch = usage.heldEpoch;
        }
      }
    }
    const idleSinceMs = nowMs - hostExpiryMs();
    for (const bucket of buckets.values()) {
      if (bucket.hosts === 0 && bucket.lastReportedMs < idleSinceMs) {
        bucket.removed = true;
        buckets.delete(bucket.key);
      }
    }
    return { hostCount };
  }

  /** Per-host bound of each bucket from the counted hosts' per-host rates. */
  function reporterCaps(cap: ReporterCap, nowMs: number): Map<BucketEntry, number> {
    const grace = hostGraceMs();
    const rates = new Map<BucketEntry, number[]>();
    for (const host of hosts.values()) {
      if (!isCounted(host, nowMs, grace)) continue;
      for (const usage of host.usage) {
        let list = rates.get(usage.bucket);
        if (!list) {
          list = [];
          rates.set(usage.bucket, list);
        }
        list.push(usage.offeredRps / Math.max(1, host.hostCount));
      }
    }
    const caps = new Map<BucketEntry, number>();
    for (const [bucket, list] of rates) caps.set(bucket, perHostCapRps(cap, list));
    return caps;
  }

  /**
   * The `maxBucketsPerForward` busiest buckets (by offered rate; ties to the oldest, so the choice
   * is stable). A zone flooded with keys (a caller rotating them over a template) keeps its busy
   * buckets limited; the quiet tail goes unreported from this zone, and its directives run out.
   */
  function busiest(candidates: BucketEntry[]): BucketEntry[] {
    counters.bucketsLeftOutOfForwards += candidates.length - maxBucketsPerForward;
    if (!forwardCapWarned) {
      forwardCapWarned = true;
      logger.warn(
        { aggregator: options.id, buckets: candidates.length, maxBucketsPerForward },
        'control: more buckets than one forward holds; the least busy are left out',
      );
    }
    return selectBusiest(candidates, maxBucketsPerForward, (bucket) => bucket.offeredRps);
  }

  function buildReport(nowMs: number): ReportRequest {
    const { hostCount } = sum(nowMs);
    // Counts are rates times this aggregator's own window, so the receiver gets the rates back
    // whatever the window; whole milliseconds keep counts and the wire's window consistent, and
    // the clamp keeps the window valid after a long pause.
    const endMs = Math.floor(nowMs);
    const windowMs = Math.min(Math.max(endMs - lastForwardEndMs, 1), MAX_REPORT_WINDOW_MS);
    const windowSec = windowMs / 1000;
    lastForwardEndMs = endMs;
    let forwarded: BucketEntry[] = [];
    for (const bucket of buckets.values()) if (bucket.hosts > 0) forwarded.push(bucket);
    if (forwarded.length > maxBucketsPerForward) forwarded = busiest(forwarded);
    const usage: BucketUsage[] = [];
    for (const bucket of forwarded) {
      const offered = bucket.offeredRps * windowSec;
      const admitted = Math.min(bucket.admittedRps * windowSec, offered);
      usage.push(
        create(BucketUsageSchema, {
          bucket: bucket.key,
          offered,
          admitted,
          wouldDrop: Math.min(bucket.wouldDropRps * windowSec, admitted),
          heldEpoch: bucket.heldEpoch,
        }),
      );
    }
    sequence++;
    return create(ReportRequestSchema, {
      reporterId: options.id,
      tier: Tier.AGGREGATOR,
      zone: options.zone,
      region: options.region ?? '',
      sequence,
      windowStartMs: BigInt(endMs - windowMs),
      windowEndMs: BigInt(endMs),
      buckets: usage,
      hostCount,
      authToken: options.authToken ?? '',
      // Fan-out is counted at every parent by design: nothing for a parent to hold out.
      acknowledgedBy: fanout ? '' : acknowledgedBy,
      acknowledgedWindowEndMs: fanout ? 0n : acknowledgedWindowEndMs,
    });
  }

  /** `forwardSequence`: the forward `response` answers. */
  function applyResponse(response: ReportResponse, forwardSequence: bigint): void {
    const nowMs = scheduler.nowMs();
    if (response.reportIntervalMs > 0) {
      intervalMs = Math.min(Math.max(response.reportIntervalMs, MIN_INTERVAL_MS), MAX_INTERVAL_MS);
    }
    parentEpoch.heard(response.epoch, nowMs);
    for (const directive of response.directives) {
      const bucket = buckets.get(directive.bucket);
      if (!bucket) continue;
      const cached = bucket.directive;
      const cachedFresh = cached !== undefined && nowMs - cached.receivedAtMs < cached.received.ttlMs;
      if (
        cached &&
        cachedFresh &&
        (directive.epoch < cached.epoch ||
          (directive.epoch === cached.epoch && directive.version < cached.version))
      ) {
        counters.staleDirectives++;
        continue;
      }
      freshUntilMs = Math.max(freshUntilMs, nowMs + directive.ttlMs);
      coldForwardArmed = true;
      // The same (epoch, version) again is the same computation, from the sums it was computed
      // from: a controller between ticks (stateful ratio policy), a parent aggregator relaying
      // its cache. It counts no forward sent since it first came.
      const sameComputation =
        cached !== undefined && directive.epoch === cached.epoch && directive.version === cached.version;
      bucket.directive = {
        received: directive,
        receivedAtMs: nowMs,
        forwardSequence: sameComputation ? cached.forwardSequence : forwardSequence,
        epoch: directive.epoch,
        version: directive.version,
        relayed: directive,
        relayedAtMs: nowMs,
      };
    }
  }

  /** Healthy parents in configured order, then the ones backing off (a last resort beats no report). */
  function parentOrder(nowMs: number): number[] {
    const healthy: number[] = [];
    const backingOff: number[] = [];
    for (let i = 0; i < options.parents.length; i++) {
      (parentDownUntilMs[i]! <= nowMs ? healthy : backingOff).push(i);
    }
    return [...healthy, ...backingOff];
  }

  /** Marks a parent down after a failed attempt; logs when it was healthy. */
  function parentFailed(index: number, error: unknown, what: string): void {
    counters.parentFailures++;
    watchReconnect(index);
    const wasHealthy = parentDownUntilMs[index]! <= scheduler.nowMs();
    parentDownUntilMs[index] = scheduler.nowMs() + (options.parentBackoffMs ?? 5 * intervalMs);
    if (wasHealthy) {
      logger.warn(
        { aggregator: options.id, parent: options.parents[index]!.target, error: (error as Error).message },
        what,
      );
    }
  }

  /**
   * After a parent failed, waits for its connection to come back (transports that tell: gRPC). If
   * by then no parent answers forwards, this one is tried first and a forward goes at once, with the
   * interval restarting from it: after an outage (a restarted controller) the zone's usage reaches
   * the parent, and its directives come back, without waiting out the rest of the interval. One
   * forward per reconnect, never more than the timer would have sent.
   */
  function watchReconnect(index: number): void {
    const parent = options.parents[index]!;
    if (!parent.whenConnected || reconnectWatches[index] !== undefined || !running) return;
    reconnectWatches[index] = parent.whenConnected(() => {
      reconnectWatches[index] = undefined;
      if (!running || !lastForwardFailed) return;
      parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
      if (inFlight) return;
      counters.reconnectForwards++;
      timer?.cancel();
      void startForward();
      schedule();
    });
  }

  /**
   * A host reported usage and this aggregator holds no fresh directive at all: it just started (a
   * restart, or its hosts failed over to it), or every directive ran out. Its hosts get nothing
   * until its next forward comes back, so that forward goes now instead of at the end of the
   * interval, and they find the directives at their next report. Not while the last forward
   * failed (the reconnect watch covers a parent that is down), nor while one is in flight; one per
   * cold spell (re-armed only by a directive arriving), so a parent that has nothing to give (its
   * own parent down) sees no more forwards than the interval's. Deferred to a timer of its own: the
   * host's reply does not wait for the sums.
   */
  function maybeColdForward(): void {
    if (!running || !coldForwardArmed || lastForwardFailed || inFlight) return;
    coldForwardArmed = false;
    scheduler.setTimeout(() => {
      if (!running || inFlight) return;
      counters.coldForwards++;
      void startForward();
    }, 0);
  }

  /** One report to every parent at once; directives from each reply are applied as it arrives. */
  async function forwardToAll(request: ReportRequest): Promise<void> {
    const answered = await Promise.all(
      options.parents.map(async (parent, index) => {
        try {
          const response = await parent.report(request, { timeoutMs: timeoutMs() });
          parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
          applyResponse(response, request.sequence);
          return parent.target;
        } catch (error) {
          parentFailed(index, error, 'control: parent failed (fan-out: the other parents still count)');
          return undefined;
        }
      }),
    );
    const target = answered.find((t) => t !== undefined);
    lastForwardFailed = target === undefined;
    if (target === undefined) counters.forwardFailures++;
    lastForward = {
      sequence: Number(request.sequence),
      atMs: scheduler.nowMs(),
      buckets: request.buckets.length,
      hostCount: request.hostCount,
      ...(target !== undefined ? { target } : {}),
    };
  }

  /**
   * `request` as sent now, `builtAtMs` having built it. A receiver reads how long ago the last
   * acknowledgement was from `window_end_ms - acknowledged_window_end_ms`, as if the report went
   * out at its window's end. A retry to the next parent goes out up to a report timeout later: by
   * then the parent that acknowledged is that much further into its grace, and a receiver reading
   * the stale age would hold this aggregator out past that grace, its zone counted nowhere for
   * about the timeout (0 rps at the controller for 860 ms in a review's test of a parent that
   * hung). So the acknowledgement moves back by the delay.
   */
  function asSentNow(request: ReportRequest, builtAtMs: number): ReportRequest {
    const lateMs = Math.floor(scheduler.nowMs() - builtAtMs);
    if (lateMs <= 0 || request.acknowledgedBy === '') return request;
    return { ...request, acknowledgedWindowEndMs: request.acknowledgedWindowEndMs - BigInt(lateMs) };
  }

  async function forward(): Promise<void> {
    const builtAtMs = scheduler.nowMs();
    const request = buildReport(builtAtMs);
    counters.forwards++;
    if (fanout) return forwardToAll(request);
    for (const index of parentOrder(scheduler.nowMs())) {
      const parent = options.parents[index]!;
      try {
        const response = await parent.report(asSentNow(request, builtAtMs), { timeoutMs: timeoutMs() });
        parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
        lastForwardFailed = false;
        acknowledgedBy = acknowledgingId(response.responderId);
        acknowledgedWindowEndMs = request.windowEndMs;
        applyResponse(response, request.sequence);
        lastForward = {
          sequence: Number(request.sequence),
          atMs: scheduler.nowMs(),
          buckets: request.buckets.length,
          hostCount: request.hostCount,
          target: parent.target,
        };
        return;
      } catch (error) {
        parentFailed(index, error, 'control: parent failed, failing over');
      }
    }
    lastForwardFailed = true;
    counters.forwardFailures++;
    lastForward = {
      sequence: Number(request.sequence),
      atMs: scheduler.nowMs(),
      buckets: request.buckets.length,
      hostCount: request.hostCount,
    };
  }

  function startForward(): Promise<void> {
    const run = forward().finally(() => {
      if (inFlight === run) inFlight = undefined;
    });
    inFlight = run;
    return run;
  }

  function schedule(): void {
    const delayMs = intervalMs * (1 + jitterRatio * (2 * random() - 1));
    timer = scheduler.setTimeout(() => {
      if (!running) return;
      if (inFlight) counters.skippedForwards++;
      else void startForward();
      schedule();
    }, delayMs);
  }

  async function flush(): Promise<void> {
    while (inFlight) await inFlight;
    await startForward();
  }

  function snapshot(): AggregatorSnapshot {
    const nowMs = scheduler.nowMs();
    const grace = hostGraceMs();
    const sums = new Map<BucketEntry, AggregatorBucketSnapshot>();
    for (const bucket of buckets.values()) {
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
    for (const host of hosts.values()) {
      const counted = isCounted(host, nowMs, grace);
      hostList.push({
        id: host.id,
        zone: host.zone,
        tier: host.tier,
        hostCount: host.hostCount,
        lastSeenMs: host.lastSeenMs,
        buckets: host.usage.length,
        counted,
        ...(host.heldOutUntilMs > nowMs ? { heldOutUntilMs: host.heldOutUntilMs } : {}),
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
    const snap: AggregatorSnapshot = {
      id: options.id,
      zone: options.zone,
      nowMs,
      intervalMs,
      hosts: hostList.sort(byKey),
      buckets: [...sums.values()].sort(byKey),
      parents: options.parents.map((p, i) => ({ target: p.target, healthy: parentDownUntilMs[i]! <= nowMs })),
      counters: {
        ...counters,
        rejectedReports: { ...counters.rejectedReports },
        clippedUsages: { ...counters.clippedUsages },
      },
    };
    if (lastForward) snap.lastForward = { ...lastForward };
    return snap;
  }

  return {
    handleReport,
    countRefusal(code) {
      counters.rejectedReports[code] = (counters.rejectedReports[code] ?? 0) + 1;
    },
    health() {
      const nowMs = scheduler.nowMs();
      let parentsHealthy = 0;
      for (const downUntilMs of parentDownUntilMs) if (downUntilMs <= nowMs) parentsHealthy++;
      return { hosts: hosts.size, parentsHealthy, lastForwardAtMs: lastForward?.atMs };
    },
    start() {
      if (running) return;
      running = true;
      lastForwardEndMs = Math.floor(scheduler.nowMs());
      schedule();
    },
    async stop() {
      running = false;
      timer?.cancel();
      timer = undefined;
      for (const [index, watch] of reconnectWatches.entries()) {
        watch?.cancel();
        reconnectWatches[index] = undefined;
      }
      while (inFlight) await inFlight.catch(() => {});
    },
    flush,
    snapshot,
  };
}
