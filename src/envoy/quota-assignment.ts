import { create } from '@bufbuild/protobuf';
import { DurationSchema } from '@bufbuild/protobuf/wkt';
import {
  type BucketId,
  type RateLimitQuotaResponse_BucketAction,
  RateLimitQuotaResponse_BucketActionSchema,
} from '../gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import {
  type RateLimitStrategy,
  RateLimitStrategy_BlanketRule,
  RateLimitStrategySchema,
} from '../gen/envoy/type/v3/ratelimit_strategy_pb.js';
import { RateLimitUnit } from '../gen/envoy/type/v3/ratelimit_unit_pb.js';

/**
 * What one Envoy is told to enforce for one quota bucket. The controller's drop ratio becomes the
 * Envoy's share of the limit, its own offered rate x (1 - ratio), as a token bucket Envoy runs
 * itself (or requests_per_time_unit, which Envoy does not implement yet); ALLOW_ALL while the
 * bucket is under its limit (ratio 0), DENY_ALL at a limit of 0.
 */
export type Strategy =
  | { kind: 'allow' }
  | { kind: 'deny' }
  | {
      kind: 'token-bucket';
      shareRps: number;
      maxTokens: number;
      tokensPerFill: number;
      fillIntervalNs: bigint;
    }
  | { kind: 'per-time-unit'; shareRps: number; requests: number; unit: RateLimitUnit };

export type StrategyStyle = 'token-bucket' | 'requests-per-time-unit';

export interface StrategyOptions {
  style: StrategyStyle;
  /** Token bucket depth in time at the share's rate (`max_tokens`), at least MIN_MAX_TOKENS. */
  burstMs: number;
}

/**
 * The smallest token bucket handed out: a depth of 1 drops a quarter of a Poisson stream offered at
 * 3x its rate (the bucket is full, and refills are lost, while the next request is on its way); 5
 * loses under 1%.
 */
export const MIN_MAX_TOKENS = 5;
const NS_PER_S = 1_000_000_000n;

export function shareStrategy(shareRps: number, options: StrategyOptions): Strategy {
  if (!(shareRps > 0)) return { kind: 'deny' };
  if (options.style === 'requests-per-time-unit') {
    // Whole requests per the shortest unit that keeps at least 100 of them (1% resolution).
    for (const [unit, seconds] of [
      [RateLimitUnit.SECOND, 1],
      [RateLimitUnit.MINUTE, 60],
      [RateLimitUnit.HOUR, 3_600],
    ] as const) {
      if (shareRps * seconds >= 100 || unit === RateLimitUnit.HOUR) {
        return {
          kind: 'per-time-unit',
          shareRps,
          requests: Math.max(1, Math.round(shareRps * seconds)),
          unit,
        };
      }
    }
  }
  // tokens_per_fill / fill_interval is exactly the share (Envoy refills continuously at that rate).
  const tokensPerFill = Math.max(1, Math.round(shareRps));
  const fillIntervalNs = BigInt(Math.max(1, Math.round((tokensPerFill / shareRps) * 1e9)));
  const maxTokens = Math.max(MIN_MAX_TOKENS, Math.ceil((shareRps * options.burstMs) / 1000));
  return {
    kind: 'token-bucket',
    shareRps,
    maxTokens: Math.min(maxTokens, 4_294_967_295),
    tokensPerFill,
    fillIntervalNs,
  };
}

/** Envoy keeps a token bucket (its tokens included) only when the new one is equal field by field. */
export function sameStrategy(a: Strategy | undefined, b: Strategy): boolean {
  if (a === undefined || a.kind !== b.kind) return false;
  if (a.kind === 'token-bucket' && b.kind === 'token-bucket') {
    return (
      a.maxTokens === b.maxTokens &&
      a.tokensPerFill === b.tokensPerFill &&
      a.fillIntervalNs === b.fillIntervalNs
    );
  }
  if (a.kind === 'per-time-unit' && b.kind === 'per-time-unit')
    return a.requests === b.requests && a.unit === b.unit;
  return true;
}

export function strategyMessage(strategy: Strategy): RateLimitStrategy {
  switch (strategy.kind) {
    case 'allow':
      return create(RateLimitStrategySchema, {
        strategy: { case: 'blanketRule', value: RateLimitStrategy_BlanketRule.ALLOW_ALL },
      });
    case 'deny':
      return create(RateLimitStrategySchema, {
        strategy: { case: 'blanketRule', value: RateLimitStrategy_BlanketRule.DENY_ALL },
      });
    case 'token-bucket':
      return create(RateLimitStrategySchema, {
        strategy: {
          case: 'tokenBucket',
          value: {
            maxTokens: strategy.maxTokens,
            tokensPerFill: strategy.tokensPerFill,
            fillInterval: duration(strategy.fillIntervalNs),
          },
        },
      });
    case 'per-time-unit':
      return create(RateLimitStrategySchema, {
        strategy: {
          case: 'requestsPerTimeUnit',
          value: { requestsPerTimeUnit: BigInt(strategy.requests), timeUnit: strategy.unit },
        },
      });
  }
}

export function assignmentAction(
  bucketId: BucketId,
  strategy: Strategy,
  timeToLiveMs: number,
): RateLimitQuotaResponse_BucketAction {
  return create(RateLimitQuotaResponse_BucketActionSchema, {
    bucketId,
    bucketAction: {
      case: 'quotaAssignmentAction',
      value: {
        assignmentTimeToLive: duration(BigInt(Math.round(timeToLiveMs)) * 1_000_000n),
        rateLimitStrategy: strategyMessage(strategy),
      },
    },
  });
}

export function abandonAction(bucketId: BucketId): RateLimitQuotaResponse_BucketAction {
  return create(RateLimitQuotaResponse_BucketActionSchema, {
    bucketId,
    bucketAction: { case: 'abandonAction', value: {} },
  });
}

function duration(ns: bigint) {
  return create(DurationSchema, { seconds: ns / NS_PER_S, nanos: Number(ns % NS_PER_S) });
}
