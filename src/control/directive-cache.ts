import { create } from '@bufbuild/protobuf';
import { type Directive, DirectiveSchema } from '../gen/spillway/v1/control_pb.js';
import type { UsageRates } from './child-ledger.js';
import { wouldAdmitMore } from './would-admit-more.js';

/** A parent's directive for one bucket, as an aggregator keeps it to answer its hosts. */
export interface CachedDirective {
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

/** Where a bucket keeps its cached directive. */
export interface DirectiveSlot {
  directive: CachedDirective | undefined;
}

/** A host's usage of a bucket, as `relay` judges it. */
export interface RelayedUsage extends UsageRates {
  readonly bucket: DirectiveSlot;
  /** Calls offered in the report's window: the sample the admitted share was measured on. */
  offeredCalls: number;
  /** The first forward whose sum counts this usage (see zone-sums.ts). */
  joinedForward: bigint;
}

/**
 * Relayed TTLs are refreshed at most this often: replies share one directive object per bucket, and
 * a host may see a TTL up to this much longer than exact. Small next to any sane TTL (seconds).
 */
const RELAY_REFRESH_MS = 50;

/**
 * The directives an aggregator's parents sent, per bucket, and the rule for relaying them to hosts:
 * the newest (epoch, version) wins while fresh, the TTL relayed shrinks with the directive's age
 * (so hosts' stale policies see the truth), and a directive computed without a host is withheld
 * from it where it would let the host admit more (`relay`).
 */
export class DirectiveCache {
  /** Until when some cached directive is fresh (the latest receipt plus its TTL). */
  #freshUntilMs = Number.NEGATIVE_INFINITY;
  readonly counters = {
    /** Directives ignored as older (epoch, version) than the one cached. */
    staleDirectives: 0,
    /** Cached directives left out of a reply (one per reply and bucket) by `relay`'s rule. */
    withheldDirectives: 0,
  };

  /** No cached directive is fresh: the aggregator just started, or every directive ran out. */
  isCold(nowMs: number): boolean {
    return nowMs >= this.#freshUntilMs;
  }

  /**
   * Caches a reply's directives for the buckets `slotOf` knows; `forwardSequence` is the forward
   * the reply answers. Returns whether any directive was taken.
   */
  apply(
    directives: readonly Directive[],
    forwardSequence: bigint,
    nowMs: number,
    slotOf: (key: string) => DirectiveSlot | undefined,
  ): boolean {
    let taken = false;
    for (const directive of directives) {
      const slot = slotOf(directive.bucket);
      if (!slot) continue;
      const cached = slot.directive;
      const cachedFresh = cached !== undefined && nowMs - cached.receivedAtMs < cached.received.ttlMs;
      if (
        cached &&
        cachedFresh &&
        (directive.epoch < cached.epoch ||
          (directive.epoch === cached.epoch && directive.version < cached.version))
      ) {
        this.counters.staleDirectives++;
        continue;
      }
      this.#freshUntilMs = Math.max(this.#freshUntilMs, nowMs + directive.ttlMs);
      taken = true;
      // The same (epoch, version) again is the same computation, from the sums it was computed
      // from: a controller between ticks (stateful ratio policy), a parent aggregator relaying
      // its cache. It counts no forward sent since it first came.
      const sameComputation =
        cached !== undefined && directive.epoch === cached.epoch && directive.version === cached.version;
      slot.directive = {
        received: directive,
        receivedAtMs: nowMs,
        forwardSequence: sameComputation ? cached.forwardSequence : forwardSequence,
        epoch: directive.epoch,
        version: directive.version,
        relayed: directive,
        relayedAtMs: nowMs,
      };
    }
    return taken;
  }

  /**
   * The cached directive with the TTL it has left, or undefined when stale or absent, or withheld.
   *
   * Withheld: the host (re)joined the bucket's sums after the forward that brought the directive,
   * and its ratio would let the host admit more than it does now (`wouldAdmitMore`). Such a
   * directive was computed without the host, from a sum that may lack much of the fleet (hosts
   * cut off one after another leave an aggregator forwarding its own share alone), so its ratio
   * can be near 0. Withheld, the host keeps the ratio it holds until the reply to a forward that
   * counts it. A host that drops nothing (new, no directive yet) is never withheld from: any ratio
   * tightens it, so a cold start gets the cache at its first report. Measured:
   * docs/reliability.md, "Hosts cut off from their aggregators one after the other".
   */
  relay(usage: RelayedUsage, nowMs: number): Directive | undefined {
    const cached = usage.bucket.directive;
    if (!cached) return undefined;
    const remainingMs = cached.received.ttlMs - (nowMs - cached.receivedAtMs);
    if (remainingMs <= 0) return undefined;
    if (
      cached.forwardSequence < usage.joinedForward &&
      wouldAdmitMore(cached.received.dropRatio, usage, usage.offeredCalls)
    ) {
      this.counters.withheldDirectives++;
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

  /** The newest epoch among the directives cached for `usages`' buckets (0n: none). */
  newestEpoch(usages: readonly { readonly bucket: DirectiveSlot }[]): bigint {
    let epoch = 0n;
    for (const usage of usages) {
      const cached = usage.bucket.directive;
      if (cached && cached.epoch > epoch) epoch = cached.epoch;
    }
    return epoch;
  }
}
