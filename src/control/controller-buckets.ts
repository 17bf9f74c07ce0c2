import { type CompiledLimits, matchBucket, type ResolvedBucket } from '../config/compile-limits.js';
import type { Clock } from '../core/clock.js';
import type { BucketUsage, Directive, Mode } from '../gen/spillway/v1/control_pb.js';
import type { UsageRates } from './child-ledger.js';
import type { ControlLogger } from './control-logger.js';
import { UnknownBucketLog } from './unknown-bucket-log.js';

/** Sums of fresh children's rates for a bucket (or one zone of it), and the ratio computed from them. */
export interface Group {
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
   * yet (a controller just started), so the ratio may be too low (ratio-groups.ts, `directivesFor`).
   */
  partial: boolean;
  /** `version` when the ratio was last computed; directives carry it. */
  version: number;
  /** Built on first request after a computation, shared by every reply until the next one. */
  directive: Directive | undefined;
}

/** One bucket the controller tracks: the rule it matched and its groups. */
export interface BucketState {
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
  unreportedAtLastTick: boolean;
  /**
   * Set by the first report that brings such a bucket back, childExpiryMs on (a child not back by
   * then would have expired anyway): until then its sums hold only the children back so far, and
   * its ratios are sent only where they would not let a child's hosts admit more.
   */
  regatherUntilMs: number;
  /**
   * Set by the first report of a bucket whose hosts apply an earlier controller's ratio (this one
   * has just started), childExpiryMs on: until then a child whose hosts are still on that earlier
   * ratio gets no ratio that would let them admit more. Once its hosts apply this controller's
   * ratio, it gets every ratio, looser ones included.
   */
  earlierEpochUntilMs: number;
  lastReportedMs: number;
  /** Global scope: the one group. Zone scope: the all-zone totals (never sent). */
  total: Group;
  zones: Map<string, Group> | undefined;
}

/** One child's latest usage of a bucket, as the controller sums it. */
export interface ChildBucketUsage extends UsageRates {
  readonly bucket: BucketState;
  /** Epoch of the ratio the child's hosts apply (the oldest, from an aggregator); 0n: none. */
  heldEpoch: bigint;
  /** The group this usage is summed into (undefined: not counted yet) and the cap scale it got. */
  countedIn: Group | undefined;
  countedScale: number;
}

export interface ControllerBucketsOptions {
  /** The controller's id, for logs. */
  id: string;
  /** The controller's epoch. */
  epoch: bigint;
  limits: CompiledLimits;
  maxBuckets: number;
  maxUnknownKeys: number;
  logger: ControlLogger;
  /** For the unknown-bucket log's rate limit. */
  clock: Clock;
  /** How long a child may be silent before it expires. */
  childExpiryMs: () => number;
  /** A new group for a bucket that matched `resolved`, with fresh ratio-policy memory. */
  newGroup: (resolved: ResolvedBucket) => Group;
}

/**
 * The buckets a controller tracks: each reported key matched against the limits (exact keys, then
 * template instances within `maxInstances`), within `maxBuckets`; unknown keys counted and a few
 * kept for operators. A reload rematches every bucket, keeping its groups (ratio-policy memory)
 * unless its scope or the policy changed.
 */
export class ControllerBuckets {
  readonly counters = {
    unknownBuckets: 0,
    bucketsOverCapacity: 0,
    instancesOverCapacity: 0,
    expiredBuckets: 0,
  };
  readonly #options: ControllerBucketsOptions;
  #limits: CompiledLimits;
  readonly #buckets = new Map<string, BucketState>();
  /** Live instances per template, for `maxInstances`. */
  readonly #instances = new Map<string, number>();
  /** Up to `maxUnknownKeys` distinct unknown keys, oldest first. */
  readonly #unknownKeys = new Set<string>();
  /** Logs unknown keys, a line per key family per minute at most. */
  readonly #unknownLog: UnknownBucketLog;
  /** A bound was logged since the last tick (one line per tick at most). */
  #capacityWarned = false;

  constructor(options: ControllerBucketsOptions) {
    this.#options = options;
    this.#limits = options.limits;
    this.#unknownLog = new UnknownBucketLog({
      logger: options.logger,
      clock: options.clock,
      controllerId: options.id,
    });
  }

  get limits(): CompiledLimits {
    return this.#limits;
  }

  get size(): number {
    return this.#buckets.size;
  }

  values(): IterableIterator<BucketState> {
    return this.#buckets.values();
  }

  get(key: string): BucketState | undefined {
    return this.#buckets.get(key);
  }

  unknownKeys(): string[] {
    return [...this.#unknownKeys];
  }

  /**
   * A child's usage of the bucket `entry` names (`rates`: its rates), the bucket added if new;
   * undefined when the bucket is refused (unknown, or a bound reached).
   */
  usageOf(entry: BucketUsage, rates: Readonly<UsageRates>, nowMs: number): ChildBucketUsage | undefined {
    let bucket = this.#buckets.get(entry.bucket);
    if (!bucket) {
      bucket = this.add(entry.bucket);
      if (!bucket) return undefined;
      // Its hosts apply a ratio from an earlier controller: this one has just started (or forgot
      // the bucket). Its sums hold only the children back so far, and a tick may fall before the
      // rest are back (one zone's aggregator still cut off), so its ratios let no child's hosts
      // admit more until every child could have reported. A bucket whose hosts hold no ratio (a
      // cold start, a new bucket) or this controller's is not held back.
      if (entry.heldEpoch !== 0n && entry.heldEpoch < this.#options.epoch) {
        bucket.earlierEpochUntilMs = nowMs + this.#options.childExpiryMs();
      }
    }
    bucket.lastReportedMs = nowMs;
    if (bucket.unreportedAtLastTick) {
      bucket.unreportedAtLastTick = false;
      bucket.regatherUntilMs = nowMs + this.#options.childExpiryMs();
    }
    return {
      bucket,
      offeredRps: rates.offeredRps,
      admittedRps: rates.admittedRps,
      wouldDropRps: rates.wouldDropRps,
      heldEpoch: entry.heldEpoch,
      countedIn: undefined,
      countedScale: 1,
    };
  }

  /** A new bucket for `key`, or undefined (counted) when no rule matches or a bound is reached. */
  add(key: string): BucketState | undefined {
    const resolved = matchBucket(this.#limits, key);
    if (!resolved) {
      this.counters.unknownBuckets++;
      if (this.#unknownKeys.size < this.#options.maxUnknownKeys) this.#unknownKeys.add(key);
      this.#unknownLog.note(key);
      return undefined;
    }
    if (this.#buckets.size >= this.#options.maxBuckets) {
      this.counters.bucketsOverCapacity++;
      this.warnCapacity('maxBuckets', this.#options.maxBuckets);
      return undefined;
    }
    if (resolved.instance !== undefined) {
      const live = this.#instances.get(resolved.rule) ?? 0;
      if (live >= (resolved.maxInstances ?? 0)) {
        this.counters.instancesOverCapacity++;
        this.warnCapacity(`maxInstances of ${resolved.rule}`, resolved.maxInstances ?? 0);
        return undefined;
      }
      this.#instances.set(resolved.rule, live + 1);
    }
    const state: BucketState = {
      key,
      resolved,
      removed: false,
      awaitingTick: false,
      unreportedAtLastTick: false,
      regatherUntilMs: Number.NEGATIVE_INFINITY,
      earlierEpochUntilMs: Number.NEGATIVE_INFINITY,
      lastReportedMs: 0,
      total: this.#options.newGroup(resolved),
      zones: resolved.scope === 'zone' ? new Map() : undefined,
    };
    this.#buckets.set(key, state);
    return state;
  }

  /** Forgets a bucket nobody reported for the bucket expiry. */
  expire(state: BucketState): void {
    this.#remove(state);
    this.counters.expiredBuckets++;
  }

  /**
   * Swaps the limits: every bucket is matched again (one that no rule matches is forgotten). A
   * bucket whose scope changed, or every bucket when `resetMemory` (the ratio policy changed), gets
   * fresh groups that wait for the next tick.
   */
  rematch(next: CompiledLimits, resetMemory: boolean): void {
    this.#limits = next;
    this.#instances.clear();
    for (const bucket of [...this.#buckets.values()]) {
      const resolved = matchBucket(next, bucket.key);
      if (!resolved) {
        this.#remove(bucket);
        continue;
      }
      if (resolved.instance !== undefined)
        this.#instances.set(resolved.rule, (this.#instances.get(resolved.rule) ?? 0) + 1);
      const scopeChanged = resolved.scope !== bucket.resolved.scope;
      bucket.resolved = resolved;
      if (scopeChanged || resetMemory) {
        bucket.total = this.#options.newGroup(resolved);
        bucket.zones = resolved.scope === 'zone' ? new Map() : undefined;
        bucket.awaitingTick = true;
      }
    }
    this.#unknownKeys.clear();
    this.#unknownLog.clear();
  }

  /** Logs a bound reached, once until `resetCapacityWarning` (each tick). */
  warnCapacity(bound: string, value: number): void {
    if (this.#capacityWarned) return;
    this.#capacityWarned = true;
    this.#options.logger.warn(
      { controller: this.#options.id, bound, value },
      'control: bound reached, new buckets are refused',
    );
  }

  /** The next bound reached is logged again. */
  resetCapacityWarning(): void {
    this.#capacityWarned = false;
  }

  #remove(state: BucketState): void {
    state.removed = true;
    this.#buckets.delete(state.key);
    if (state.resolved.instance !== undefined) {
      const live = (this.#instances.get(state.resolved.rule) ?? 1) - 1;
      if (live > 0) this.#instances.set(state.resolved.rule, live);
      else this.#instances.delete(state.resolved.rule);
    }
  }
}
