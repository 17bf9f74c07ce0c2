import { create } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '../core/clock.js';
import { type HeaderValue, HeaderValueSchema } from '../gen/envoy/config/core/v3/base_pb.js';
import type { RateLimitDescriptor } from '../gen/envoy/extensions/common/ratelimit/v3/ratelimit_pb.js';
import {
  type RateLimitRequest,
  type RateLimitResponse,
  RateLimitResponse_Code,
  type RateLimitResponse_DescriptorStatus,
  RateLimitResponse_DescriptorStatusSchema,
  type RateLimitResponse_RateLimit_Unit,
  RateLimitResponseSchema,
} from '../gen/envoy/service/ratelimit/v3/rls_pb.js';
import { RateLimitUnit } from '../gen/envoy/type/v3/ratelimit_unit_pb.js';
import { type RateLimitPolicy, rateLimitHeaders } from '../http/rate-limit-headers.js';
import { overrideKey } from './bucket-key.js';
import { type CompiledRateLimits, type DescriptorRule, matchDescriptor } from './descriptor-rules.js';
import { UNIT_SECONDS } from './ratelimit-config.js';
import { checkRequestBounds, type RequestBounds, RequestRefusal, resolveBounds } from './request-bounds.js';
import type { DescriptorOutcome, RlsBackend, WindowLimit } from './rls-backend.js';
import { RlsStats, UNKNOWN_DOMAIN_LABEL } from './rls-stats.js';

export interface RateLimitServiceOptions {
  limits: CompiledRateLimits;
  backend: RlsBackend;
  clock?: Clock;
  /** Add the IETF `RateLimit` / `RateLimit-Policy` fields (and `Retry-After` when over) to responses. Default false. */
  responseHeaders?: boolean;
  /** Answer every request OK whatever its descriptors (envoyproxy/ratelimit's SHADOW_MODE). Default false. */
  shadowMode?: boolean;
  /** `ok` (envoyproxy/ratelimit's answer: every descriptor OK, no limit) or `error` (NOT_FOUND). Default `ok`. */
  unknownDomain?: 'ok' | 'error';
  bounds?: Partial<RequestBounds>;
  stats?: RlsStats;
}

export interface RateLimitService {
  /**
   * Answer one ShouldRateLimit call as envoyproxy/ratelimit does. Synchronous with an in-process
   * backend. Throws RequestRefusal (a gRPC status and message) for requests it refuses.
   */
  shouldRateLimit(request: RateLimitRequest): RateLimitResponse | Promise<RateLimitResponse>;
  /** Swap the rules (a reload); calls in flight finish on the rules they started with. */
  updateLimits(limits: CompiledRateLimits): void;
  readonly limits: CompiledRateLimits;
  readonly stats: RlsStats;
}

/** envoyproxy/ratelimit answers `limit_remaining` MaxUint32 for an unlimited rule. */
const UNLIMITED_REMAINING = 4_294_967_295;

/** A descriptor resolved to what counts it; `undefined` entries are OK with no limit. */
interface Planned {
  rule: DescriptorRule | undefined;
  /** Set for a request's own limit (`RateLimitDescriptor.limit`). */
  override: WindowLimit | undefined;
  key: string;
  limit: WindowLimit;
  responseUnit: RateLimitResponse_RateLimit_Unit;
  hits: number;
}

export function createRateLimitService(options: RateLimitServiceOptions): RateLimitService {
  let limits = options.limits;
  const { backend } = options;
  const clock = options.clock ?? systemClock;
  const bounds = resolveBounds(options.bounds);
  const stats = options.stats ?? new RlsStats();
  const responseHeaders = options.responseHeaders === true;
  const shadowMode = options.shadowMode === true;
  const unknownDomain = options.unknownDomain ?? 'ok';

  const shouldRateLimit = (request: RateLimitRequest): RateLimitResponse | Promise<RateLimitResponse> => {
    try {
      checkRequestBounds(request, bounds);
    } catch (error) {
      if (error instanceof RequestRefusal) stats.refuse(error.reason);
      throw error;
    }
    const domain = limits.domains.get(request.domain);
    if (domain === undefined) {
      if (unknownDomain === 'error') {
        stats.refuse('unknown_domain');
        throw RequestRefusal.notFound(`rate limit domain '${request.domain}' is not configured`);
      }
      const counters = stats.domain(UNKNOWN_DOMAIN_LABEL);
      counters.requests++;
      counters.unmatched += request.descriptors.length;
      return okResponse(request.descriptors.length);
    }
    const counters = stats.domain(request.domain);
    counters.requests++;
    const requestHits = Math.max(1, request.hitsAddend);
    const plans: (Planned | undefined)[] = [];
    let replaced: Set<string> | undefined;
    for (const descriptor of request.descriptors) {
      const plan = planDescriptor(descriptor, request.domain, requestHits, domain);
      plans.push(plan);
      if (plan?.rule !== undefined && plan.rule.replaces.length > 0) {
        replaced ??= new Set();
        for (const name of plan.rule.replaces) replaced.add(name);
      }
    }
    // `replaces`: a rule named by another matched rule is left out of this request, uncounted.
    if (replaced !== undefined) {
      for (let i = 0; i < plans.length; i++) {
        const name = plans[i]?.rule?.name;
        if (name !== undefined && replaced.has(name)) plans[i] = undefined;
      }
    }
    const outcomes: (DescriptorOutcome | Promise<DescriptorOutcome> | undefined)[] = [];
    let pending = false;
    for (const plan of plans) {
      const outcome = plan === undefined ? undefined : decide(plan);
      if (outcome instanceof Promise) pending = true;
      outcomes.push(outcome);
    }
    if (!pending) return respond(plans, outcomes as (DescriptorOutcome | undefined)[], counters);
    return Promise.all(outcomes).then((settled) => respond(plans, settled, counters));
  };

  const decide = (plan: Planned): DescriptorOutcome | Promise<DescriptorOutcome> => {
    if (plan.rule?.unlimited === true) return { overLimit: false, remaining: UNLIMITED_REMAINING };
    // requests_per_unit 0 refuses every request (the reference's "black list"), from the first one.
    if (plan.limit.requestsPerUnit === 0) return { overLimit: true, remaining: 0 };
    return plan.override !== undefined
      ? backend.checkOverride(plan.key, plan.limit, plan.hits)
      : backend.check(plan.key, plan.limit, plan.hits);
  };

  const respond = (
    plans: readonly (Planned | undefined)[],
    outcomes: readonly (DescriptorOutcome | undefined)[],
    counters: { overLimit: number; unmatched: number },
  ): RateLimitResponse => {
    const nowMs = clock.nowMs();
    const nowSec = Math.floor(nowMs / 1000);
    const statuses: RateLimitResponse_DescriptorStatus[] = [];
    let overNonQuota = false;
    let quotaDescriptors = 0;
    let quotaOver = 0;
    let headerInputs: { policy: RateLimitPolicy; decision: HeaderDecision }[] | undefined;
    for (let i = 0; i < plans.length; i++) {
      const plan = plans[i];
      const outcome = outcomes[i];
      if (plan === undefined || outcome === undefined) {
        counters.unmatched++;
        statuses.push(create(RateLimitResponse_DescriptorStatusSchema, { code: RateLimitResponse_Code.OK }));
        continue;
      }
      const rule = plan.rule;
      if (outcome.fault === true) stats.backendFaults++;
      if (rule?.unlimited === true) {
        statuses.push(
          create(RateLimitResponse_DescriptorStatusSchema, {
            code: RateLimitResponse_Code.OK,
            limitRemaining: UNLIMITED_REMAINING,
          }),
        );
        continue;
      }
      const shadow = rule?.shadowMode === true;
      const over = outcome.overLimit && !shadow;
      const ruleCounters = stats.rule(metricKey(plan));
      if (!outcome.overLimit) ruleCounters.withinLimit += plan.hits;
      else if (shadow || shadowMode) ruleCounters.shadowOverLimit += plan.hits;
      else ruleCounters.overLimit += plan.hits;
      if (rule?.quotaMode === true) {
        quotaDescriptors++;
        if (over) quotaOver++;
      } else if (over) {
        overNonQuota = true;
      }
      const resetSec = plan.limit.unitSeconds - (nowSec % plan.limit.unitSeconds);
      statuses.push(
        create(RateLimitResponse_DescriptorStatusSchema, {
          code: over ? RateLimitResponse_Code.OVER_LIMIT : RateLimitResponse_Code.OK,
          currentLimit: {
            requestsPerUnit: plan.limit.requestsPerUnit,
            unit: plan.responseUnit,
            name: rule?.name ?? '',
          },
          limitRemaining: outcome.overLimit ? 0 : Math.min(UNLIMITED_REMAINING, outcome.remaining),
          durationUntilReset: { seconds: BigInt(resetSec), nanos: 0 },
        }),
      );
      if (responseHeaders && !shadow) {
        headerInputs ??= [];
        headerInputs.push({
          policy: {
            name: rule?.name ?? rule?.id ?? plan.key,
            limit: plan.limit.requestsPerUnit,
            windowSec: plan.limit.unitSeconds,
          },
          decision: {
            allowed: !over,
            limit: plan.limit.requestsPerUnit,
            remaining: outcome.overLimit ? 0 : outcome.remaining,
            resetAtMs: (nowSec + resetSec) * 1000,
            retryAfterMs: over ? (nowSec + resetSec) * 1000 - nowMs : 0,
          },
        });
      }
    }
    const overall =
      !shadowMode && (overNonQuota || (quotaDescriptors > 0 && quotaOver === quotaDescriptors))
        ? RateLimitResponse_Code.OVER_LIMIT
        : RateLimitResponse_Code.OK;
    if (overall === RateLimitResponse_Code.OVER_LIMIT) counters.overLimit++;
    const response = create(RateLimitResponseSchema, { overallCode: overall, statuses });
    if (headerInputs !== undefined) response.responseHeadersToAdd = headerValues(headerInputs, nowMs);
    return response;
  };

  return {
    shouldRateLimit,
    updateLimits(next: CompiledRateLimits) {
      limits = next;
    },
    get limits() {
      return limits;
    },
    stats,
  };
}

type HeaderDecision = Parameters<typeof rateLimitHeaders>[0][number]['decision'];

function planDescriptor(
  descriptor: RateLimitDescriptor,
  domainName: string,
  requestHits: number,
  domain: Parameters<typeof matchDescriptor>[0],
): Planned | undefined {
  const hits = descriptor.hitsAddend !== undefined ? Number(descriptor.hitsAddend) : requestHits;
  const override = descriptor.limit;
  if (override !== undefined) {
    const unitSeconds = overrideUnitSeconds(override.unit);
    const limit: WindowLimit = {
      requestsPerUnit: override.requestsPerUnit,
      unitSeconds,
      limitRps: override.requestsPerUnit / unitSeconds,
    };
    return {
      rule: undefined,
      override: limit,
      key: overrideKey(domainName, descriptor.entries),
      limit,
      // The reference casts the unit's number into the response's enum (same numbers to YEAR).
      responseUnit: override.unit as number as RateLimitResponse_RateLimit_Unit,
      hits,
    };
  }
  const match = matchDescriptor(domain, descriptor.entries);
  if (match === undefined) return undefined;
  const rule = match.rule;
  return {
    rule,
    override: undefined,
    key: match.bucketKey,
    limit: rule,
    responseUnit: rule.responseUnit,
    hits,
  };
}

const OVERRIDE_UNIT_SECONDS: Partial<Record<RateLimitUnit, number>> = {
  [RateLimitUnit.SECOND]: UNIT_SECONDS.second,
  [RateLimitUnit.MINUTE]: UNIT_SECONDS.minute,
  [RateLimitUnit.HOUR]: UNIT_SECONDS.hour,
  [RateLimitUnit.DAY]: UNIT_SECONDS.day,
  [RateLimitUnit.MONTH]: UNIT_SECONDS.month,
  [RateLimitUnit.YEAR]: UNIT_SECONDS.year,
};

/** Units were checked by `checkRequestBounds`. */
function overrideUnitSeconds(unit: RateLimitUnit): number {
  return OVERRIDE_UNIT_SECONDS[unit] ?? UNIT_SECONDS.second;
}

function metricKey(plan: Planned): string {
  const rule = plan.rule;
  if (rule === undefined) return plan.key;
  return rule.detailedMetric || rule.valueToMetric ? plan.key : rule.id;
}

function okResponse(descriptors: number): RateLimitResponse {
  const statuses: RateLimitResponse_DescriptorStatus[] = [];
  for (let i = 0; i < descriptors; i++) {
    statuses.push(create(RateLimitResponse_DescriptorStatusSchema, { code: RateLimitResponse_Code.OK }));
  }
  return create(RateLimitResponseSchema, { overallCode: RateLimitResponse_Code.OK, statuses });
}

function headerValues(
  inputs: { policy: RateLimitPolicy; decision: HeaderDecision }[],
  nowMs: number,
): HeaderValue[] {
  return Object.entries(rateLimitHeaders(inputs, nowMs)).map(([key, value]) =>
    create(HeaderValueSchema, { key, value }),
  );
}
