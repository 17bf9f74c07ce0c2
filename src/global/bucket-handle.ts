import type { Clock, Random } from '../core/clock.js';
import type { Decision } from '../core/decision.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { describeValue } from '../core/validate.js';
import { type Directive, Mode } from '../gen/spillway/v1/control_pb.js';
import { BurstGuard, type ResolvedBurstGuard } from './burst-guard.js';
import { isNewerDirective } from './directive-order.js';
import { directiveAllowanceRps, localRescaleRatio } from './local-rescale.js';
import { directiveHeld, type StalePolicy, staleDropRatio } from './stale-policy.js';

export type BucketMode = 'enforce' | 'shadow';

/**
 * One bucket of the global limiter on this host, resolved once and reused. Holding a handle keeps
 * the bucket resident (it is never expired), and its decisions cost no map lookup.
 */
export interface BucketHandle {
  readonly key: string;
  /**
   * The hot path: `true` to admit one call of `cost` units (default 1). Counter increments and at
   * most one random draw against the current ratio; no I/O, no promise, no allocation. Throws only
   * on an invalid cost (ERR_SPILLWAY_INVALID_COST), never because the control plane is down.
   */
  allow(cost?: number): boolean;
  /**
   * The same decision as `allow` (same counters, same draw) as a full `Decision` (allocates).
   * `reason: 'shadow'` when a shadow bucket would have dropped the call.
   */
  decide(cost?: number): Decision;
  /** The drop ratio of the directive held (0 before any). */
  readonly dropRatio: number;
  /** The ratio applied now: `dropRatio` after the stale policy (refreshed every report tick). */
  readonly effectiveRatio: number;
  readonly mode: BucketMode;
}

/** What every bucket of one limiter shares; read off the hot path only. */
export interface BucketContext {
  clock: Clock;
  /**
   * What the burst guard reads, up to once per call: the shared coarse clock by default (a platform
   * clock read allocates a heap number on Node 20; docs/global-data-plane.md, "Cost"), the
   * injected scheduler when there is one (tests, the simulator).
   */
  guardClock: Clock;
  stalePolicy(): StalePolicy;
  burstGuard: ResolvedBurstGuard | undefined;
  /** Scale a fresh directive's ratio by the host's own rate change (src/global/local-rescale.ts). */
  localRescale: boolean;
  intervalMs(): number;
  defaultShadow: boolean;
}

/** Outcomes of one decision; values below DROPPED admit. */
const ADMITTED = 0;
const WOULD_DROP = 1;
const DROPPED = 2;
const DROPPED_BY_GUARD = 3;

/**
 * The bucket's state lives in plain number fields, initialised in a fixed order so every bucket
 * shares one hidden class and the hot path stays monomorphic. Doubles stored in fields are updated
 * in place; nothing on the decision path allocates.
 *
 * Counters move through three stages: `window*` (bumped per call), `pending*` (snapshotted by
 * the reporter, waiting for a successful report; carried over on failure), `total*` (cumulative,
 * for metrics).
 */
export class Bucket implements BucketHandle {
  readonly key: string;
  readonly context: BucketContext;

  // Read per call.
  /**
   * `round(effectiveRatio * 2^29)`: a 29-bit draw below it drops. An integer, so V8 keeps it in the
   * object as a small integer instead of a boxed double one pointer (and often one cache line) away.
   * Kept in step with `effectiveRatio` by `setEffectiveRatio`.
   */
  dropThreshold = 0;
  /** xorshift32 state (int32, never 0). */
  rngState: number;
  shadow: boolean;
  /** The burst guard is armed (it exists, enforce mode, a held directive, a measured allowance). */
  guarded = false;

  // Bumped per call, reset by the reporter every interval.
  windowOffered = 0;
  windowAdmitted = 0;
  windowDropped = 0;
  windowWouldDrop = 0;
  windowDroppedByGuard = 0;

  // Snapshotted, not yet acknowledged by a report.
  pendingOffered = 0;
  pendingAdmitted = 0;
  pendingWouldDrop = 0;
  /** Start of the oldest unreported counts (scheduler clock); meaningful while pending counts exist. */
  pendingSinceMs = 0;
  hasPending = false;

  totalOffered = 0;
  totalAdmitted = 0;
  totalDropped = 0;
  totalWouldDrop = 0;
  totalDroppedByGuard = 0;

  /** Offered units per second in the last report that measured it. */
  recentOfferedRps = 0;
  /** The same for the report before. */
  previousOfferedRps = 0;
  /** And the one before that. */
  olderOfferedRps = 0;
  /**
   * This host's rate over the windows the held directive's fleet total covers, which burst guard
   * sizing and local rescale compare with the directive's `offeredRps` (rates of different windows
   * must not mix: in a fleet-wide spike, the host's newest rate over a total from before it would
   * grant every host the spike). The reply to report k carries a ratio computed from the zone's
   * forward that held report k-1 and from the other zones' last forwards, which hold reports about
   * one interval older: the mean of the host's rates in reports k-1 and k-2 (docs/global-data-plane.md
   * compares it with report k-1 alone).
   */
  directiveHostOfferedRps = 0;
  /** How many report windows `directiveHostOfferedRps` is measured over (its noise: see local rescale). */
  directiveHostWindows = 1;
  lastActiveMs: number;
  /** Resolved through `bucket(key)`: the caller holds the handle, so it never expires. */
  pinned = false;

  hasDirective = false;
  /**
   * Replies from a controller generation (epoch above 0) to reports that offered this bucket load,
   * none with a directive for it, while it has never had one: a known bucket gets one in the first
   * reply or two (ratio 0 included), so a few mean no rule matches it (unknown-buckets.ts).
   */
  repliesWithoutDirective = 0;
  directiveRatio = 0;
  limitRps = 0;
  globalOfferedRps = 0;
  /** The fleet offered rate of the directive held before this one (0: none): local rescale's fleet-wide test. */
  previousGlobalOfferedRps = 0;
  epoch = 0n;
  version = 0n;
  receivedAtMs = 0;
  expiresAtMs = 0;

  /** The burst guard's state: only when the limiter has one (src/global/burst-guard.ts). */
  readonly guard: BurstGuard | undefined;

  effectiveRatio = 0;

  constructor(key: string, random: Random, context: BucketContext, nowMs: number) {
    this.key = key;
    this.context = context;
    this.rngState = seedFrom(random);
    this.shadow = context.defaultShadow;
    this.lastActiveMs = nowMs;
    this.guard = context.burstGuard ? new BurstGuard(context.burstGuard, context.guardClock) : undefined;
  }

  get dropRatio(): number {
    return this.directiveRatio;
  }

  get mode(): BucketMode {
    return this.shadow ? 'shadow' : 'enforce';
  }

  allow(cost = 1): boolean {
    return this.take(cost) < DROPPED;
  }

  decide(cost = 1): Decision {
    const outcome = this.take(cost);
    const nowMs = this.context.clock.nowMs();
    if (outcome < DROPPED) {
      const decision: Decision = {
        allowed: true,
        limit: this.limitRps,
        remaining: this.guarded && this.guard!.tripped ? Math.max(0, this.guard!.tokens) : this.headroomRps(),
        resetAtMs: nowMs,
        retryAfterMs: 0,
      };
      if (outcome === WOULD_DROP) decision.reason = 'shadow';
      return decision;
    }
    // A ratio drop can only change with the next directive; a guard drop lasts until tokens refill.
    const retryAfterMs =
      outcome === DROPPED_BY_GUARD ? this.guard!.retryAfterMs(cost) : this.context.intervalMs();
    return {
      allowed: false,
      limit: this.limitRps,
      remaining: 0,
      resetAtMs: nowMs + retryAfterMs,
      retryAfterMs,
    };
  }

  /**
   * What the fleet left unused of the limit in the window the held directive covers, per second:
   * `limitRps - offeredRps * (1 - dropRatio)`, at least 0. No host counts down a global limit; this
   * is the nearest a host knows to "remaining" (RateLimit's `r`): the limit when the fleet is idle, 0
   * once it drops. A shadow bucket says its limit: a figure that falls as load nears the limit would
   * show clients a limit that is not enforced.
   */
  headroomRps(): number {
    if (this.shadow) return this.limitRps;
    return Math.max(0, this.limitRps - this.globalOfferedRps * (1 - this.directiveRatio));
  }

  /** One decision; every path counts `cost` into exactly one of admitted or dropped. */
  take(cost: number): number {
    if (typeof cost !== 'number' || !(cost >= 0 && cost < Number.POSITIVE_INFINITY)) throwInvalidCost(cost);
    this.windowOffered += cost;
    const threshold = this.dropThreshold;
    if (threshold > 0) {
      let x = this.rngState;
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      this.rngState = x;
      if (x >>> 3 < threshold) {
        if (!this.shadow) {
          this.windowDropped += cost;
          return DROPPED;
        }
        this.windowWouldDrop += cost;
        this.windowAdmitted += cost;
        return WOULD_DROP;
      }
    }
    if (this.guarded && !this.guard!.pass(cost)) {
      this.windowDroppedByGuard += cost;
      return DROPPED_BY_GUARD;
    }
    this.windowAdmitted += cost;
    return ADMITTED;
  }

  /** Usage a data plane elsewhere decided (see GlobalLimiter.record): counted, never decided here. */
  record(offered: number, admitted: number): void {
    if (!(offered >= 0 && offered < Number.POSITIVE_INFINITY)) throwInvalidCost(offered);
    const letThrough = Math.min(offered, Math.max(0, admitted || 0));
    this.windowOffered += offered;
    this.windowAdmitted += letThrough;
    this.windowDropped += offered - letThrough;
  }

  /** Record the host's offered rate measured by a report. */
  measuredOfferedRps(offeredRps: number): void {
    this.olderOfferedRps = this.previousOfferedRps;
    this.previousOfferedRps = this.recentOfferedRps;
    this.recentOfferedRps = offeredRps;
  }

  /** Move the window's counts to pending and totals. Called by the reporter once per tick. */
  snapshotWindow(windowStartMs: number, nowMs: number): void {
    const offered = this.windowOffered;
    if (offered > 0 || this.windowAdmitted > 0) {
      if (!this.hasPending) {
        this.hasPending = true;
        this.pendingSinceMs = windowStartMs;
      }
      this.lastActiveMs = nowMs;
    }
    this.pendingOffered += offered;
    this.pendingAdmitted += this.windowAdmitted;
    this.pendingWouldDrop += this.windowWouldDrop;
    this.totalOffered += offered;
    this.totalAdmitted += this.windowAdmitted;
    this.totalDropped += this.windowDropped;
    this.totalWouldDrop += this.windowWouldDrop;
    this.totalDroppedByGuard += this.windowDroppedByGuard;
    this.windowOffered = 0;
    this.windowAdmitted = 0;
    this.windowDropped = 0;
    this.windowWouldDrop = 0;
    this.windowDroppedByGuard = 0;
  }

  /** Scale pending counts by `factor` (rate-preserving when their span is shortened). */
  scalePending(factor: number, sinceMs: number): void {
    this.pendingOffered *= factor;
    this.pendingAdmitted *= factor;
    this.pendingWouldDrop *= factor;
    this.pendingSinceMs = sinceMs;
  }

  clearPending(): void {
    this.pendingOffered = 0;
    this.pendingAdmitted = 0;
    this.pendingWouldDrop = 0;
    this.hasPending = false;
  }

  /** The directive's freshness window has not passed (the stale policy is not in play). */
  directiveFresh(nowMs: number): boolean {
    return this.hasDirective && nowMs < this.expiresAtMs;
  }

  /** Apply a directive if it is newer than the one held (see `isNewerDirective`). Returns whether it applied. */
  applyDirective(directive: Directive, fallbackEpoch: bigint, nowMs: number): boolean {
    const dropRatio = directive.dropRatio;
    if (typeof dropRatio !== 'number' || Number.isNaN(dropRatio)) return false;
    const epoch = directive.epoch !== 0n ? directive.epoch : fallbackEpoch;
    const version = directive.version;
    if (this.hasDirective && !isNewerDirective(epoch, version, this.epoch, this.version)) {
      // An older epoch is accepted once the held directive is stale: a controller restarted with
      // a clock behind its predecessor's must not be locked out. Within an epoch, never go back.
      if (epoch === this.epoch || this.directiveFresh(nowMs)) return false;
    }
    this.hasDirective = true;
    this.directiveRatio = Math.min(1, Math.max(0, dropRatio));
    this.limitRps = finiteNonNegative(directive.limitRps);
    this.previousGlobalOfferedRps = this.globalOfferedRps;
    this.globalOfferedRps = finiteNonNegative(directive.offeredRps);
    this.epoch = epoch;
    this.version = version;
    this.receivedAtMs = nowMs;
    this.expiresAtMs = nowMs + directive.ttlMs;
    if (this.olderOfferedRps > 0) {
      this.directiveHostOfferedRps = (this.previousOfferedRps + this.olderOfferedRps) / 2;
      this.directiveHostWindows = 2;
    } else {
      this.directiveHostOfferedRps =
        this.previousOfferedRps > 0 ? this.previousOfferedRps : this.recentOfferedRps;
      this.directiveHostWindows = 1;
    }
    if (directive.mode === Mode.SHADOW) this.shadow = true;
    else if (directive.mode === Mode.ENFORCE) this.shadow = false;
    else this.shadow = this.context.defaultShadow;
    this.sizeGuard();
    this.refresh(nowMs);
    return true;
  }

  /** From the host's rate over the same windows as the directive's fleet total (see `directiveHostOfferedRps`). */
  sizeGuard(): void {
    this.guard?.size(directiveAllowanceRps(this.directiveRatio, this));
  }

  setEffectiveRatio(ratio: number): void {
    this.effectiveRatio = ratio;
    this.dropThreshold = Math.round(ratio * DRAW_RANGE);
  }

  /** Re-evaluate the stale policy and guard arming at `nowMs` (reporter tick and directive arrival). */
  refresh(nowMs: number): void {
    if (!this.hasDirective) {
      this.setEffectiveRatio(0);
      this.guarded = false;
      return;
    }
    const policy = this.context.stalePolicy();
    let ratio = staleDropRatio(policy, this.directiveRatio, this.expiresAtMs, nowMs);
    if (this.context.localRescale && nowMs < this.expiresAtMs) {
      ratio = localRescaleRatio(ratio, this, this.context.intervalMs());
    }
    this.setEffectiveRatio(ratio);
    const guard = this.guard;
    const arm =
      guard !== undefined &&
      !this.shadow &&
      guard.capacity > 0 &&
      directiveHeld(policy, this.expiresAtMs, nowMs);
    if (arm) {
      if (this.guarded) guard.tick();
      else guard.arm();
    }
    this.guarded = arm;
  }
}

const UINT32_RANGE = 4294967296;
/** Draws compare on 29 bits (`x >>> 3`): thresholds up to 2^29 stay small integers even with 31-bit Smis. */
const DRAW_RANGE = 536870912;

/**
 * Each bucket draws from its own xorshift32 generator, seeded from the injected `Random` when the
 * bucket is created (so a seeded limiter is deterministic). Not `Math.random()` per call: on
 * Node 20 (V8 11.3) every `Math.random()` result is a fresh 16-byte heap number, which alone
 * causes ~20-80 young-generation GCs per 10M decisions (bench/global.bench.ts); xorshift32 in an
 * int32 field allocates nothing. Its 2^32 - 1 period, and its top 29 bits compared against
 * `ratio * 2^29` (steps of 2e-9), are ample for random load shedding.
 */
function seedFrom(random: Random): number {
  const seed = (random() * UINT32_RANGE) | 0;
  return seed === 0 ? 0x6d2b79f5 : seed;
}

function throwInvalidCost(cost: unknown): never {
  throw new SpillwayError(
    ErrorCode.InvalidCost,
    `cost must be a finite number >= 0, got ${describeValue(cost)}`,
    {
      field: 'cost',
    },
  );
}

function finiteNonNegative(value: number): number {
  return typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : 0;
}
