import { create } from '@bufbuild/protobuf';
import { compileLimits } from '../config/compile-limits.js';
import type { LimitsConfig } from '../config/limits-config.js';
import { type Cancellable, type Random, type Scheduler, systemScheduler } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import {
  type Directive,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
} from '../gen/spillway/v1/control_pb.js';
import type { ReportLimits } from '../protocol/validate-report.js';
import type { ReportContext, ReportHandler } from '../transport/control-transport.js';
import { ChildLedger } from './child-ledger.js';
import { type ControlLogger, silentLogger } from './control-logger.js';
import { assertControllerOptionNames } from './control-options.js';
import { ControllerBuckets } from './controller-buckets.js';
import {
  type ControllerSnapshot,
  type ControllerSnapshotOptions,
  controllerSnapshot,
} from './controller-snapshot.js';
import { type ControllerLedger, RatioGroups } from './ratio-groups.js';
import { createRatioPolicy, type RatioPolicy } from './ratio-policy.js';
import { type ReporterCap, validateReporterCap } from './reporter-cap.js';

export type {
  ControllerBucketSnapshot,
  ControllerBucketZoneSnapshot,
  ControllerChildSnapshot,
  ControllerCounters,
  ControllerSnapshot,
  ControllerSnapshotOptions,
} from './controller-snapshot.js';

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
  /**
   * Most children tracked. Past it, a new child whose zone (its token's zone, else the zone it
   * claims) holds at least two fewer children than the fullest zone takes the place of that zone's
   * longest-silent child, so one zone cannot lock the others out; otherwise it is refused
   * (ERR_SPILLWAY_CAPACITY_EXCEEDED). Default 10,000.
   */
  maxChildren?: number;
  /** Most children one zone holds (a new one past it is refused). Default: no bound but `maxChildren`. */
  maxChildrenPerZone?: number;
  /** How many distinct unknown bucket keys the snapshot lists (the count is exact). Default 64. */
  maxUnknownKeys?: number;
  reportLimits?: ReportLimits;
  logger?: ControlLogger;
  /** Overrides `config.ratioPolicy` (and the default); kept across `updateConfig`. */
  ratioPolicy?: RatioPolicy;
  /** Bounds one child's say in a bucket's offered sum (per host it speaks for). Default: none. */
  reporterCap?: ReporterCap;
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
 * ratio is only sent where it would not let the child's hosts admit more than they do now. So are
 * the ratios of a bucket a tick found no child reporting (every child expired: the controller was
 * cut off from them; or none reports it: their hosts were cut off from them), for childExpiryMs
 * after the first report brings it back: its children come back one at a time, the first one's
 * forward alone is only its hosts' share of the fleet, and a tick may fall between them. Ticks
 * still resum everything from scratch (expiry, cap, float drift). A stateful policy computes only
 * at ticks: its memory advances once per interval.
 *
 * Its parts: the child ledger takes reports (child-ledger.ts), the bucket table matches keys to
 * limits (controller-buckets.ts), the ratio groups hold the sums and ratios and pick the
 * directives (ratio-groups.ts).
 *
 * Concurrency: everything is synchronous; `handleReport` never awaits, so a report and a tick never
 * interleave. Memory: bounded by maxChildren × (buckets per report) plus maxBuckets.
 */
export function createController(options: ControllerOptions): Controller {
  assertControllerOptionNames(options);
  assertControllerOptionNames(options);
  const scheduler = options.scheduler ?? systemScheduler;
  const logger = options.logger ?? silentLogger;
  const epoch = Math.floor(options.epoch ?? startEpoch(scheduler.nowMs(), options.random ?? Math.random));
  const epochBig = BigInt(epoch);
  const maxChildren = options.maxChildren ?? DEFAULT_MAX_CHILDREN;
  const reporterCap =
    options.reporterCap === undefined ? undefined : validateReporterCap(options.reporterCap);
  const initialLimits = compileLimits(options.config);
  let childExpiryMs = options.childExpiryMs ?? 3 * initialLimits.config.intervalMs;
  let bucketExpiryMs = options.bucketExpiryMs ?? 10 * initialLimits.config.intervalMs;
  let timer: Cancellable | undefined;
  let running = false;

  const buckets: ControllerBuckets = new ControllerBuckets({
    id: options.id,
    epoch: epochBig,
    limits: initialLimits,
    maxBuckets: options.maxBuckets ?? DEFAULT_MAX_BUCKETS,
    maxUnknownKeys: options.maxUnknownKeys ?? 64,
    logger,
    clock: scheduler,
    childExpiryMs: () => childExpiryMs,
    newGroup: (resolved) => ratios.newGroup(resolved),
  });
  const ledger: ControllerLedger = new ChildLedger({
    selfId: options.id,
    scheduler,
    maxChildren,
    reportLimits: options.reportLimits ?? {},
    intervalMs: () => buckets.limits.config.intervalMs,
    expiryMs: () => childExpiryMs,
    excludeWhileCountedElsewhere: false,
    overCapacity() {
      buckets.warnCapacity('maxChildren', maxChildren);
      return new SpillwayError(
        ErrorCode.CapacityExceeded,
        `controller tracks ${maxChildren} children already`,
        {
          field: 'reporterId',
          maxChildren,
        },
      );
    },
    usageOf: (entry, rates, nowMs) => buckets.usageOf(entry, rates, nowMs),
    sliceOf: (request, context) => context.tokenZone ?? request.zone,
    ...(options.maxChildrenPerZone !== undefined ? { maxChildrenPerSlice: options.maxChildrenPerZone } : {}),
  });
  const ratios: RatioGroups = new RatioGroups({
    epoch: epochBig,
    policy: options.ratioPolicy ?? createRatioPolicy(initialLimits.config.ratioPolicy),
    reporterCap,
    ledger,
    buckets,
    bucketExpiryMs: () => bucketExpiryMs,
  });

  function handleReport(request: ReportRequest, context: ReportContext): ReportResponse {
    const intake = ledger.intake(request, context);
    if (intake.kind === 'late') return reply([]);
    if (intake.kind === 'news' && ratios.policy.stateless) {
      ratios.recomputeOnReport(intake.child, intake.previousUsage);
    }
    return reply(ratios.directivesFor(intake.child, intake.nowMs));
  }

  function reply(directives: Directive[]): ReportResponse {
    return create(ReportResponseSchema, {
      directives,
      reportIntervalMs: buckets.limits.config.intervalMs,
      epoch: epochBig,
      responderId: options.id,
    });
  }

  const tick = () => ratios.tick(scheduler.nowMs());

  function schedule(): void {
    timer = scheduler.setTimeout(() => {
      if (!running) return;
      tick();
      schedule();
    }, buckets.limits.config.intervalMs);
  }

  function updateConfig(config: LimitsConfig): void {
    const next = compileLimits(config);
    childExpiryMs = options.childExpiryMs ?? 3 * next.config.intervalMs;
    bucketExpiryMs = options.bucketExpiryMs ?? 10 * next.config.intervalMs;
    const resetMemory =
      !options.ratioPolicy && ratios.replacePolicy(createRatioPolicy(next.config.ratioPolicy));
    buckets.rematch(next, resetMemory);
    logger.info(
      { controller: options.id, buckets: next.config.buckets.length, policyReset: resetMemory },
      'control: limits updated',
    );
  }

  const parts = { id: options.id, epoch, ledger, buckets, ratios };
  return {
    handleReport,
    countRefusal: (code) => ledger.countRefusal(code),
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
    snapshot: (bounds) => controllerSnapshot(parts, scheduler.nowMs(), bounds),
    epoch,
  };
}

/** Random bits below the start time in a default epoch. */
const EPOCH_RANDOM_BITS = 10;

/**
 * A controller's default epoch: its start time, then random bits. Epochs must be unique per
 * process: hosts and aggregators take (epoch, version) for one computation's identity and never go
 * back to a lower version within an epoch, while versions count per process. Two replicas with one
 * epoch (started in the same millisecond) would be one identity with two counters: when the one
 * ahead died, hosts would refuse the survivor's directives until its version caught up
 * (docs/reliability.md, "Controller replicas"). The random bits only break that tie: a later
 * millisecond still wins. 2^53 / 2^10 ms is the year 2248.
 */
export function startEpoch(nowMs: number, random: Random): number {
  const scale = 2 ** EPOCH_RANDOM_BITS;
  return Math.floor(nowMs) * scale + Math.floor(random() * scale);
}
