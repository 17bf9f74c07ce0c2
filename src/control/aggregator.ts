import { create } from '@bufbuild/protobuf';
import { type Random, type Scheduler, systemScheduler } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import {
  type Directive,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
  Tier,
} from '../gen/spillway/v1/control_pb.js';
import { RECEIVER_MAX_BUCKETS_PER_REPORT } from '../protocol/report-bounds.js';
import type { ReportLimits } from '../protocol/validate-report.js';
import type { ControlClient, ReportContext, ReportHandler } from '../transport/control-transport.js';
import { type AggregatorSnapshot, aggregatorSnapshot } from './aggregator-snapshot.js';
import { ChildLedger } from './child-ledger.js';
import { type ControlLogger, silentLogger } from './control-logger.js';
import { assertAggregatorOptionNames } from './control-options.js';
import { DirectiveCache } from './directive-cache.js';
import { ParentEpoch } from './parent-epoch.js';
import { ParentForwarder } from './parent-forwarder.js';
import { type ReporterCap, validateReporterCap } from './reporter-cap.js';
import { tierName } from './tier-name.js';
import { type BucketEntry, type HostUsage, ZoneSums } from './zone-sums.js';

export type {
  AggregatorBucketSnapshot,
  AggregatorCounters,
  AggregatorHostSnapshot,
  AggregatorSnapshot,
} from './aggregator-snapshot.js';

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
  /**
   * Most hosts tracked. Past it, a new host whose address holds at least two fewer hosts than the
   * fullest address takes the place of that address's longest-silent host (one machine inventing
   * ids cannot lock the others out); otherwise it is refused (ERR_SPILLWAY_CAPACITY_EXCEEDED).
   * Default 10,000.
   */
  maxHosts?: number;
  /** Most hosts one network address holds (a new one past it is refused). Default: no bound but `maxHosts`. */
  maxHostsPerAddress?: number;
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
   * What a health check reads, without a snapshot: a snapshot sums every bucket, too much for a
   * probe that runs every few seconds (docs/operations.md, "Health").
   */
  health(): { hosts: number; parentsHealthy: number; lastForwardAtMs: number | undefined };
}

/**
 * A zone aggregator: sums the latest rate of every host (or lower aggregator), forwards the zone's
 * usage to a parent as one report per interval, and relays the parent's directives down.
 *
 * Its parts: the child ledger takes host reports (child-ledger.ts); the zone sums build each
 * forward (zone-sums.ts); the parent forwarder sends it, with failover or fan-out, backoff, and the
 * reconnect and cold-start triggers (parent-forwarder.ts); the directive cache answers hosts
 * (directive-cache.ts). Host reports are answered from the cache synchronously, so a slow or dead
 * parent never delays or fails a host. A host that (re)joins the sums is not sent a directive
 * computed without it where that would let it admit more (`DirectiveCache.relay`): it keeps its
 * own until a forward counts it.
 *
 * Sums are associative: several aggregators may share a zone's hosts, and an aggregator's parent
 * may be another aggregator (zone -> region -> controller).
 */
export function createAggregator(options: AggregatorOptions): Aggregator {
  assertAggregatorOptionNames(options);
  const settings = aggregatorSettings(options);
  const scheduler = options.scheduler ?? systemScheduler;
  const logger = options.logger ?? silentLogger;
  const maxHosts = options.maxHosts ?? 10_000;
  const hostGraceMs = (): number => options.hostGraceMs ?? 2.5 * forwarder.intervalMs;
  const hostExpiryMs = (): number => options.hostExpiryMs ?? 10 * forwarder.intervalMs;

  const ledger: ChildLedger<BucketEntry, HostUsage> = new ChildLedger({
    selfId: options.id,
    scheduler,
    maxChildren: maxHosts,
    reportLimits: options.reportLimits ?? {},
    intervalMs: () => forwarder.intervalMs,
    expiryMs: hostExpiryMs,
    graceMs: hostGraceMs,
    excludeWhileCountedElsewhere: true,
    checkReport: (request) => checkTierAndZone(request, options, settings),
    overCapacity: () =>
      new SpillwayError(ErrorCode.CapacityExceeded, `aggregator tracks ${maxHosts} hosts already`, {
        field: 'reporterId',
        maxHosts,
      }),
    usageOf: (entry, rates, nowMs) => sums.usageOf(entry, rates, nowMs),
    sliceOf: (_request, context) => peerAddress(context.peer),
    ...(options.maxHostsPerAddress !== undefined ? { maxChildrenPerSlice: options.maxHostsPerAddress } : {}),
  });
  const sums: ZoneSums = new ZoneSums(
    {
      id: options.id,
      zone: options.zone,
      region: options.region ?? '',
      authToken: options.authToken ?? '',
      maxBuckets: options.maxBuckets ?? 100_000,
      maxBucketsPerForward: settings.maxBucketsPerForward,
      reporterCap: settings.reporterCap,
      bucketExpiryMs: hostExpiryMs,
      ledger,
      logger,
    },
    scheduler.nowMs(),
  );
  const cache = new DirectiveCache();
  const parentEpoch = new ParentEpoch();
  const forwarder: ParentForwarder = new ParentForwarder({
    id: options.id,
    parents: options.parents,
    fanout: settings.fanout,
    scheduler,
    random: options.random ?? Math.random,
    jitterRatio: options.jitterRatio ?? 0.1,
    intervalMs: options.intervalMs ?? 1000,
    reportTimeoutMs: options.reportTimeoutMs,
    parentBackoffMs: options.parentBackoffMs,
    logger,
    buildReport: (nowMs, acknowledgement) => sums.buildReport(nowMs, acknowledgement),
    applyDirectives: (directives, sequence) =>
      cache.apply(directives, sequence, scheduler.nowMs(), (key) => sums.get(key)),
    heardEpoch: (epoch) => parentEpoch.heard(epoch, scheduler.nowMs()),
  });

  function handleReport(request: ReportRequest, context: ReportContext): ReportResponse {
    const intake = ledger.intake(request, context);
    if (intake.kind === 'late') return reply(intake.child?.usage ?? [], []);
    const { nowMs, child: host } = intake;
    // A host (re)joining the sums joins them at the next forward: directives cached from earlier
    // forwards were computed without it. One counted all along keeps the forward it joined.
    if (!intake.wasCounted) {
      for (const usage of host.usage) usage.joinedForward = sums.nextSequence;
    } else if (intake.kind === 'news') {
      keepJoinedForward(intake.previousUsage, host.usage);
    }
    const directives: Directive[] = [];
    for (const usage of host.usage) {
      const directive = cache.relay(usage, nowMs);
      if (directive) directives.push(directive);
    }
    if (host.usage.length > 0 && cache.isCold(nowMs)) forwarder.maybeColdForward();
    return reply(host.usage, directives);
  }

  function reply(usage: readonly HostUsage[], directives: Directive[]): ReportResponse {
    return create(ReportResponseSchema, {
      directives,
      reportIntervalMs: forwarder.intervalMs,
      epoch: parentEpoch.replyEpoch(cache.newestEpoch(usage), scheduler.nowMs(), forwarder.intervalMs),
      responderId: options.id,
    });
  }

  const parts = { id: options.id, zone: options.zone, ledger, sums, cache, forwarder };
  return {
    handleReport,
    countRefusal: (code) => ledger.countRefusal(code),
    health() {
      const nowMs = scheduler.nowMs();
      return {
        hosts: ledger.size,
        parentsHealthy: forwarder.healthyParents(nowMs),
        lastForwardAtMs: forwarder.lastForward?.atMs,
      };
    },
    start() {
      if (forwarder.running) return;
      sums.restartWindow(scheduler.nowMs());
      forwarder.start();
    },
    stop: () => forwarder.stop(),
    flush: () => forwarder.flush(),
    snapshot: () => aggregatorSnapshot(parts, scheduler.nowMs()),
  };
}

/** Each usage of a bucket the host reported before keeps the forward it joined the sums at. */
function keepJoinedForward(previousUsage: readonly HostUsage[], usage: HostUsage[]): void {
  let previousByBucket: Map<BucketEntry, HostUsage> | undefined;
  for (const [index, current] of usage.entries()) {
    // Hosts list their buckets in a stable order: the same index almost always matches.
    let previous = previousUsage[index];
    if (previous?.bucket !== current.bucket) {
      previousByBucket ??= new Map(previousUsage.map((u) => [u.bucket, u]));
      previous = previousByBucket.get(current.bucket);
    }
    if (previous) current.joinedForward = previous.joinedForward;
  }
}

interface AggregatorSettings {
  maxBucketsPerForward: number;
  fanout: boolean;
  acceptZones: ReadonlySet<string> | undefined;
  childTiers: ReadonlySet<ChildTier>;
  reporterCap: ReporterCap | undefined;
}

/** The options that need checking, checked (ERR_SPILLWAY_INVALID_OPTION). */
function aggregatorSettings(options: AggregatorOptions): AggregatorSettings {
  const maxBucketsPerForward = options.maxBucketsPerForward ?? RECEIVER_MAX_BUCKETS_PER_REPORT;
  if (!Number.isInteger(maxBucketsPerForward) || maxBucketsPerForward < 1) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'maxBucketsPerForward must be an integer >= 1', {
      field: 'maxBucketsPerForward',
    });
  }
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
  return { maxBucketsPerForward, fanout, acceptZones, childTiers, reporterCap };
}

/** Refuses a report from a tier or zone this aggregator does not take. */
function checkTierAndZone(
  request: ReportRequest,
  options: AggregatorOptions,
  { childTiers, acceptZones }: AggregatorSettings,
): void {
  const childTier: ChildTier | undefined =
    request.tier === Tier.HOST || request.tier === Tier.UNSPECIFIED
      ? 'host'
      : request.tier === Tier.AGGREGATOR
        ? 'aggregator'
        : undefined;
  if (childTier === undefined || !childTiers.has(childTier)) {
    throw new SpillwayError(
      ErrorCode.InvalidReport,
      `aggregator ${options.id} takes reports from ${[...childTiers].join(' and ')} tier children, not ${tierName(request.tier)}`,
      { field: 'tier', tier: tierName(request.tier) },
    );
  }
  if (acceptZones && !acceptZones.has(request.zone)) {
    throw new SpillwayError(
      ErrorCode.InvalidReport,
      `aggregator of zone ${options.zone} refuses reports from zone "${request.zone.slice(0, 64)}"`,
      { field: 'zone', zone: request.zone.slice(0, 64) },
    );
  }
}

/** A transport's peer (`ipv4:10.0.0.7:51234`, `ipv6:[::1]:51234`, an in-memory name) without its port. */
export function peerAddress(peer: string): string {
  const bracket = peer.lastIndexOf(']');
  if (bracket >= 0) return peer.slice(0, bracket + 1);
  const colon = peer.lastIndexOf(':');
  const port = peer.slice(colon + 1);
  return colon > 0 && /^\d+$/.test(port) ? peer.slice(0, colon) : peer;
}
