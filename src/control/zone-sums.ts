import { create } from '@bufbuild/protobuf';
import {
  type BucketUsage,
  BucketUsageSchema,
  type ReportRequest,
  ReportRequestSchema,
  Tier,
} from '../gen/spillway/v1/control_pb.js';
import { MAX_REPORT_WINDOW_MS } from '../protocol/report-bounds.js';
import type { ChildLedger, UsageRates } from './child-ledger.js';
import type { ControlLogger } from './control-logger.js';
import type { DirectiveSlot, RelayedUsage } from './directive-cache.js';
import type { ReporterCap } from './reporter-cap.js';
import { selectBusiest } from './select-busiest.js';

/** One bucket of the zone: its sums at the last forward and its cached directive. */
export interface BucketEntry extends DirectiveSlot {
  key: string;
  removed: boolean;
  lastReportedMs: number;
  offeredRps: number;
  admittedRps: number;
  wouldDropRps: number;
  hosts: number;
  /** The oldest held epoch its counted hosts report (0n: none): forwarded as `held_epoch`. */
  heldEpoch: bigint;
}

/** One host's latest usage of a bucket. */
export interface HostUsage extends RelayedUsage {
  readonly bucket: BucketEntry;
  /** Epoch of the ratio the reporter's hosts apply (0n: none). */
  heldEpoch: bigint;
  /**
   * The first forward whose sum counts this usage since the host (re)joined the bucket's sums (new
   * to this aggregator, new to the bucket, or back after the host grace). A directive from an
   * earlier forward was computed without it.
   */
  joinedForward: bigint;
}

/** Who acknowledged the aggregator's last acknowledged forward, and that forward's window end. */
export interface Acknowledgement {
  by: string;
  windowEndMs: bigint;
}

export interface ZoneSumsOptions {
  /** The aggregator's id, zone, region and token, as its forwards carry them. */
  id: string;
  zone: string;
  region: string;
  authToken: string;
  maxBuckets: number;
  maxBucketsPerForward: number;
  reporterCap: ReporterCap | undefined;
  /** A bucket no counted host reports, and none reported this long, is forgotten. */
  bucketExpiryMs: () => number;
  ledger: ChildLedger<BucketEntry, HostUsage>;
  logger: ControlLogger;
}

/**
 * A zone's buckets, and the report an aggregator forwards of them: the sums of every counted host's
 * latest rates (reporter cap applied), turned back into counts over the aggregator's own window.
 * Sums are associative, so a parent may sum several aggregators of one zone, or another aggregator's.
 */
export class ZoneSums {
  readonly #options: ZoneSumsOptions;
  readonly #buckets = new Map<string, BucketEntry>();
  #sequence = 0n;
  /** End of the last forward's window: the next one starts there. */
  #lastForwardEndMs: number;
  #capacityWarned = false;
  #forwardCapWarned = false;
  readonly counters = {
    /** New bucket keys refused because `maxBuckets` was reached. */
    bucketsOverCapacity: 0,
    /** Buckets left out of forwards by `maxBucketsPerForward` (one per bucket and forward). */
    bucketsLeftOutOfForwards: 0,
  };

  constructor(options: ZoneSumsOptions, nowMs: number) {
    this.#options = options;
    this.#lastForwardEndMs = Math.floor(nowMs);
  }

  get size(): number {
    return this.#buckets.size;
  }

  /** The sequence the next forward will carry. */
  get nextSequence(): bigint {
    return this.#sequence + 1n;
  }

  buckets(): IterableIterator<BucketEntry> {
    return this.#buckets.values();
  }

  get(key: string): BucketEntry | undefined {
    return this.#buckets.get(key);
  }

  /** The next forward's window starts now. */
  restartWindow(nowMs: number): void {
    this.#lastForwardEndMs = Math.floor(nowMs);
  }

  /**
   * A host's usage of the bucket `entry` names (`rates`: its rates), joining the sums at the next
   * forward; undefined when the bucket is over `maxBuckets`.
   */
  usageOf(entry: BucketUsage, rates: Readonly<UsageRates>, nowMs: number): HostUsage | undefined {
    const bucket = this.#entryFor(entry.bucket, nowMs);
    if (!bucket) return undefined;
    return {
      bucket,
      offeredRps: rates.offeredRps,
      admittedRps: rates.admittedRps,
      wouldDropRps: rates.wouldDropRps,
      offeredCalls: entry.offered,
      heldEpoch: entry.heldEpoch,
      joinedForward: this.nextSequence,
    };
  }

  /** The bucket's entry, added if new and within `maxBuckets`; marks it reported now. */
  #entryFor(key: string, nowMs: number): BucketEntry | undefined {
    let bucket = this.#buckets.get(key);
    if (!bucket) {
      if (this.#buckets.size >= this.#options.maxBuckets) {
        this.counters.bucketsOverCapacity++;
        if (!this.#capacityWarned) {
          this.#capacityWarned = true;
          this.#options.logger.warn(
            { aggregator: this.#options.id, maxBuckets: this.#options.maxBuckets },
            'control: bucket bound reached, new keys ignored',
          );
        }
        return undefined;
      }
      bucket = {
        key,
        removed: false,
        lastReportedMs: nowMs,
        directive: undefined,
        offeredRps: 0,
        admittedRps: 0,
        wouldDropRps: 0,
        hosts: 0,
        heldEpoch: 0n,
      };
      this.#buckets.set(key, bucket);
    }
    bucket.lastReportedMs = nowMs;
    return bucket;
  }

  /** The next forward: sums every counted host now, over the window since the last forward. */
  buildReport(nowMs: number, acknowledgement: Acknowledgement): ReportRequest {
    const { hostCount } = this.#sum(nowMs);
    // Counts are rates times this aggregator's own window, so the receiver gets the rates back
    // whatever the window; whole milliseconds keep counts and the wire's window consistent, and
    // the clamp keeps the window valid after a long pause.
    const endMs = Math.floor(nowMs);
    const windowMs = Math.min(Math.max(endMs - this.#lastForwardEndMs, 1), MAX_REPORT_WINDOW_MS);
    const windowSec = windowMs / 1000;
    this.#lastForwardEndMs = endMs;
    let forwarded: BucketEntry[] = [];
    for (const bucket of this.#buckets.values()) if (bucket.hosts > 0) forwarded.push(bucket);
    if (forwarded.length > this.#options.maxBucketsPerForward) forwarded = this.#busiest(forwarded);
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
    this.#sequence++;
    return create(ReportRequestSchema, {
      reporterId: this.#options.id,
      tier: Tier.AGGREGATOR,
      zone: this.#options.zone,
      region: this.#options.region,
      sequence: this.#sequence,
      windowStartMs: BigInt(endMs - windowMs),
      windowEndMs: BigInt(endMs),
      buckets: usage,
      hostCount,
      authToken: this.#options.authToken,
      acknowledgedBy: acknowledgement.by,
      acknowledgedWindowEndMs: acknowledgement.windowEndMs,
    });
  }

  /** Sums counted hosts into bucket entries; drops expired hosts and idle buckets. */
  #sum(nowMs: number): { hostCount: number } {
    const { ledger, reporterCap } = this.#options;
    ledger.expire(nowMs);
    for (const bucket of this.#buckets.values()) {
      bucket.offeredRps = 0;
      bucket.admittedRps = 0;
      bucket.wouldDropRps = 0;
      bucket.hosts = 0;
      bucket.heldEpoch = 0n;
    }
    const caps = reporterCap ? ledger.bucketCaps(reporterCap, nowMs) : undefined;
    let hostCount = 0;
    for (const host of ledger.children()) {
      if (!ledger.isCounted(host, nowMs)) continue;
      hostCount += host.hostCount;
      for (const usage of host.usage) {
        const bucket = usage.bucket;
        if (bucket.removed) continue;
        const scale = ledger.capScale(host, usage, caps);
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
    const idleSinceMs = nowMs - this.#options.bucketExpiryMs();
    for (const bucket of this.#buckets.values()) {
      if (bucket.hosts === 0 && bucket.lastReportedMs < idleSinceMs) {
        bucket.removed = true;
        this.#buckets.delete(bucket.key);
      }
    }
    return { hostCount };
  }

  /**
   * The `maxBucketsPerForward` busiest buckets (by offered rate; ties to the oldest, so the choice
   * is stable). A zone flooded with keys (a caller rotating them over a template) keeps its busy
   * buckets limited; the quiet tail goes unreported from this zone, and its directives run out.
   */
  #busiest(candidates: BucketEntry[]): BucketEntry[] {
    const { maxBucketsPerForward } = this.#options;
    this.counters.bucketsLeftOutOfForwards += candidates.length - maxBucketsPerForward;
    if (!this.#forwardCapWarned) {
      this.#forwardCapWarned = true;
      this.#options.logger.warn(
        { aggregator: this.#options.id, buckets: candidates.length, maxBucketsPerForward },
        'control: more buckets than one forward holds; the least busy are left out',
      );
    }
    return selectBusiest(candidates, maxBucketsPerForward, (bucket) => bucket.offeredRps);
  }
}
