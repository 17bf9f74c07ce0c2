import { create } from '@bufbuild/protobuf';
import type { Random } from '../../src/core/clock.js';
import {
  type RateLimitQuotaResponse,
  type RateLimitQuotaUsageReports,
  RateLimitQuotaUsageReportsSchema,
} from '../../src/gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import {
  type RateLimitStrategy,
  RateLimitStrategy_BlanketRule,
} from '../../src/gen/envoy/type/v3/ratelimit_strategy_pb.js';

/**
 * A data plane as Envoy's rate_limit_quota filter behaves (envoy-wire-contract.md, section 2.4):
 * the first request in a bucket subscribes it with an immediate report; then it reports every
 * `reportIntervalMs`; an assignment that differs from the one in force starts a new token bucket
 * (full), an identical one only extends its TTL; an expired assignment falls back to allowing all
 * (`expired_assignment_behavior: fallback_rate_limit ALLOW_ALL`); an abandoned bucket is forgotten.
 * Requests arrive at `rps` (Poisson with `random`, or evenly spaced without). No I/O: the owner moves
 * it through time with `advance` and carries reports and responses.
 */
export interface SimEnvoyOptions {
  domain: string;
  bucket: Record<string, string>;
  rps: number;
  reportIntervalMs: number;
  random?: Random;
  send(report: RateLimitQuotaUsageReports): void;
}

interface TokenBucketState {
  maxTokens: number;
  tokens: number;
  fillPerMs: number;
  key: string;
}

export class SimEnvoy {
  readonly options: SimEnvoyOptions;
  rps: number;
  /** Cumulative outcomes, for assertions. */
  allowed = 0;
  denied = 0;
  #pendingAllowed = 0;
  #pendingDenied = 0;
  #lastReportMs: number | undefined;
  #subscribed = false;
  #firstReportSent = false;
  #strategy: RateLimitStrategy | undefined;
  #bucket: TokenBucketState | undefined;
  #expiresAtMs = Number.POSITIVE_INFINITY;
  #carry = 0;
  #nowMs: number;
  assignmentsApplied = 0;
  abandoned = 0;

  constructor(options: SimEnvoyOptions, nowMs: number) {
    this.options = options;
    this.rps = options.rps;
    this.#nowMs = nowMs;
  }

  /** Move to `nowMs`: requests arrive and are decided; a report leaves when one is due. */
  advance(nowMs: number): void {
    const dtMs = nowMs - this.#nowMs;
    this.#nowMs = nowMs;
    if (this.#bucket) {
      this.#bucket.tokens = Math.min(
        this.#bucket.maxTokens,
        this.#bucket.tokens + dtMs * this.#bucket.fillPerMs,
      );
    }
    const expected = (this.rps * dtMs) / 1000;
    const arrivals = this.options.random ? poisson(expected, this.options.random) : this.#evenly(expected);
    for (let i = 0; i < arrivals; i++) {
      if (this.#decide(nowMs)) {
        this.allowed++;
        this.#pendingAllowed++;
      } else {
        this.denied++;
        this.#pendingDenied++;
      }
      if (!this.#subscribed) {
        this.#subscribed = true;
        this.#report(nowMs);
      }
    }
    if (
      this.#subscribed &&
      this.#lastReportMs !== undefined &&
      nowMs - this.#lastReportMs >= this.options.reportIntervalMs
    ) {
      this.#report(nowMs);
    }
  }

  onResponse(response: RateLimitQuotaResponse): void {
    for (const action of response.bucketAction) {
      if (action.bucketAction.case === 'abandonAction') {
        this.abandoned++;
        this.#subscribed = false;
        this.#strategy = undefined;
        this.#bucket = undefined;
        this.#expiresAtMs = Number.POSITIVE_INFINITY;
        continue;
      }
      if (action.bucketAction.case !== 'quotaAssignmentAction') continue;
      const assignment = action.bucketAction.value;
      const ttl = assignment.assignmentTimeToLive;
      this.#expiresAtMs =
        ttl === undefined
          ? Number.POSITIVE_INFINITY
          : this.#nowMs + Number(ttl.seconds) * 1000 + ttl.nanos / 1e6;
      const strategy = assignment.rateLimitStrategy;
      const key = strategyKey(strategy);
      if (this.#strategy !== undefined && strategyKey(this.#strategy) === key) continue;
      this.#strategy = strategy;
      this.assignmentsApplied++;
      const s = strategy?.strategy;
      if (s?.case === 'tokenBucket') {
        const interval = s.value.fillInterval!;
        const intervalMs = Number(interval.seconds) * 1000 + interval.nanos / 1e6;
        this.#bucket = {
          maxTokens: s.value.maxTokens,
          tokens: s.value.maxTokens,
          fillPerMs: (s.value.tokensPerFill ?? 1) / intervalMs,
          key,
        };
      } else {
        this.#bucket = undefined;
      }
    }
  }

  #decide(nowMs: number): boolean {
    const strategy = this.#strategy?.strategy;
    if (strategy === undefined || nowMs >= this.#expiresAtMs) return true;
    if (strategy.case === 'blanketRule') return strategy.value !== RateLimitStrategy_BlanketRule.DENY_ALL;
    if (strategy.case === 'tokenBucket' && this.#bucket) {
      if (this.#bucket.tokens < 1) return false;
      this.#bucket.tokens -= 1;
      return true;
    }
    return true;
  }

  #report(nowMs: number): void {
    const elapsedMs = this.#lastReportMs === undefined ? 1 : nowMs - this.#lastReportMs;
    this.#lastReportMs = nowMs;
    const report = create(RateLimitQuotaUsageReportsSchema, {
      domain: this.#firstReportSent ? '' : this.options.domain,
      bucketQuotaUsages: [
        {
          bucketId: { bucket: this.options.bucket },
          timeElapsed: {
            seconds: BigInt(Math.floor(elapsedMs / 1000)),
            nanos: Math.round((elapsedMs % 1000) * 1e6),
          },
          numRequestsAllowed: BigInt(this.#pendingAllowed),
          numRequestsDenied: BigInt(this.#pendingDenied),
        },
      ],
    });
    this.#firstReportSent = true;
    this.#pendingAllowed = 0;
    this.#pendingDenied = 0;
    this.options.send(report);
  }

  #evenly(expected: number): number {
    this.#carry += expected;
    const whole = Math.floor(this.#carry);
    this.#carry -= whole;
    return whole;
  }
}

function strategyKey(strategy: RateLimitStrategy | undefined): string {
  const s = strategy?.strategy;
  if (s === undefined || s.case === undefined) return 'none';
  if (s.case === 'tokenBucket') {
    const i = s.value.fillInterval;
    return `tb:${s.value.maxTokens}:${s.value.tokensPerFill}:${i?.seconds}:${i?.nanos}`;
  }
  if (s.case === 'blanketRule') return `blanket:${s.value}`;
  return `rptu:${s.value.requestsPerTimeUnit}:${s.value.timeUnit}`;
}

/** Knuth's method for small means, a normal approximation for large ones. */
function poisson(mean: number, random: Random): number {
  if (mean > 30) return Math.max(0, Math.round(mean + Math.sqrt(mean) * gaussian(random)));
  const limit = Math.exp(-mean);
  let k = 0;
  let p = random();
  while (p > limit) {
    k++;
    p *= random();
  }
  return k;
}

function gaussian(random: Random): number {
  return Math.sqrt(-2 * Math.log(random() || 1e-12)) * Math.cos(2 * Math.PI * random());
}
