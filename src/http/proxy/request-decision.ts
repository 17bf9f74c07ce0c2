import type { IncomingMessage } from 'node:http';
import type { Decision } from '../../core/decision.js';
import {
  classifyDecision,
  combineOutcomes,
  decideWithLimiter,
  type PolicyOutcome,
  type Verdict,
} from '../edge-decision.js';
import { type MatchedBucket, matchBuckets, repeatedKeyHeader } from '../rules/match-buckets.js';
import type { ActiveRules } from './active-rules.js';
import type { ProxyLogger } from './proxy-context.js';
import type { ProxyMetrics } from './proxy-metrics.js';
import { LazyRequestFacts } from './request-facts.js';

export interface ProxyVerdict extends Verdict {
  /** Set when a key header came on several lines: the request is answered 400, no bucket decided. */
  repeatedHeader?: string;
}

/** A limiter failure is logged at most once per this long (each is counted). */
const LOG_INTERVAL_MS = 10_000;

const ALLOW_UNLIMITED: ProxyVerdict = Object.freeze({ allowed: true, visible: [], rejectedBy: [] });

/**
 * The decision for a request: the buckets that match it, each decided with its limiter in
 * parallel and classified, combined into one verdict (`edge-decision.ts`, shared with the
 * middleware). Synchronous when every matched limiter is; a limiter that throws admits (logged,
 * counted as `error`): the proxy fails open.
 */
export class RequestDecider {
  readonly #metrics: ProxyMetrics;
  readonly #logger: ProxyLogger | undefined;
  /** When a limiter failure was last logged. */
  #lastLimiterErrorLogMs = 0;
  readonly #classify = (decision: Decision, { bucket }: MatchedBucket): PolicyOutcome => {
    const result = classifyDecision(decision, bucket.shadow);
    this.#metrics.decision(bucket.config.name, result);
    return { policy: bucket.policy, shadow: bucket.shadow, decision, result };
  };
  readonly #limiterFailed = (error: unknown, { bucket }: MatchedBucket): PolicyOutcome => {
    const nowMs = Date.now();
    if (nowMs - this.#lastLimiterErrorLogMs >= LOG_INTERVAL_MS) {
      this.#lastLimiterErrorLogMs = nowMs;
      this.#logger?.warn(
        { bucket: bucket.config.name, err: error instanceof Error ? error.message : String(error) },
        'proxy: limiter failed; request admitted',
      );
    }
    this.#metrics.decision(bucket.config.name, 'error');
    return { policy: bucket.policy, shadow: bucket.shadow, decision: undefined, result: 'error' };
  };

  constructor(metrics: ProxyMetrics, logger: ProxyLogger | undefined) {
    this.#metrics = metrics;
    this.#logger = logger;
  }

  decide(rules: ActiveRules, req: IncomingMessage): ProxyVerdict | Promise<ProxyVerdict> {
    if (rules.rules.buckets.length === 0) return ALLOW_UNLIMITED;
    const facts = new LazyRequestFacts(req, rules.resolveClient, rules.rules.routing);
    const matched = matchBuckets(rules.rules.buckets, facts);
    if (matched.length === 0) return ALLOW_UNLIMITED;
    const repeatedHeader = repeatedKeyHeader(matched, facts);
    if (repeatedHeader !== undefined) return { allowed: false, visible: [], rejectedBy: [], repeatedHeader };
    const outcomes: (PolicyOutcome | Promise<PolicyOutcome>)[] = [];
    let pending = false;
    for (const match of matched) {
      const limiter = rules.limiters.get(match.bucket)!;
      const cost = match.bucket.config.cost;
      const outcome = decideWithLimiter(limiter, match.key, cost, this.#classify, this.#limiterFailed, match);
      if (outcome instanceof Promise) pending = true;
      outcomes.push(outcome);
    }
    if (!pending) return combineOutcomes(outcomes as PolicyOutcome[]);
    return Promise.all(outcomes).then(combineOutcomes);
  }
}
