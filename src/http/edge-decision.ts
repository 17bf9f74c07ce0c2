import type { Decision } from '../core/decision.js';
import type { EdgeLimiter } from './limiter-adapter.js';
import type { RateLimitPolicy } from './rate-limit-headers.js';

/**
 * How every edge (the sidecar proxy, the Express and Fastify middleware) turns a request's limiter
 * calls into one answer: each policy is decided with its limiter, each decision classified, and
 * the classified decisions combined into a verdict (go on, or 429) and the decisions clients are
 * shown in the RateLimit fields. Written once, so both edges admit, reject and show the same way.
 */

/**
 * One policy's decision, classified: `would_drop` is a shadow policy's rejection (admitted) or a
 * shadow bucket's `reason: 'shadow'` decision, `error` a limiter that threw (admitted).
 */
export type DecisionResult = 'allowed' | 'rejected' | 'would_drop' | 'fail_open' | 'fail_closed' | 'error';

/** One policy decided for a request; `decision` is undefined when its limiter threw (`error`). */
export interface PolicyOutcome {
  policy: RateLimitPolicy;
  /** A shadow policy is decided and counted but never rejects and is never shown to clients. */
  shadow: boolean;
  decision: Decision | undefined;
  result: DecisionResult;
}

/** What a request's policies come to. */
export interface Verdict {
  allowed: boolean;
  /** The decisions clients see in the RateLimit fields, in the order the policies were decided. */
  visible: { policy: RateLimitPolicy; decision: Decision }[];
  /** The names of the policies that rejected the request. */
  rejectedBy: string[];
}

/**
 * `decision.allowed` first: a decision that admits is `allowed`, unless it admits only because the
 * store failed open (`fail_open`: no real count) or a shadow bucket would have dropped it
 * (`would_drop`); one that rejects is `would_drop` for a shadow policy, else `fail_closed` when the
 * store failed closed, else `rejected`.
 */
export function classifyDecision(decision: Decision, shadow: boolean): DecisionResult {
  const reason = decision.reason;
  if (decision.allowed) {
    if (reason === 'fail-open') return 'fail_open';
    return reason === 'shadow' ? 'would_drop' : 'allowed';
  }
  if (shadow) return 'would_drop';
  return reason === 'fail-closed' ? 'fail_closed' : 'rejected';
}

/** Whether a policy with this result lets the request go on. */
export function admits(result: DecisionResult): boolean {
  return result !== 'rejected' && result !== 'fail_closed';
}

/**
 * Whether clients are shown this policy's decision: not a shadow policy's (clients cannot tell it
 * is there), not a fail-open one or a limiter error (no real count to tell them).
 */
export function shownToClients(result: DecisionResult, shadow: boolean): boolean {
  return !shadow && result !== 'fail_open' && result !== 'error';
}

/** The verdict of a request: allowed when every policy admits it (each is charged either way). */
export function combineOutcomes(outcomes: readonly PolicyOutcome[]): Verdict {
  const visible: Verdict['visible'] = [];
  const rejectedBy: string[] = [];
  for (const { policy, shadow, decision, result } of outcomes) {
    if (decision === undefined || !shownToClients(result, shadow)) continue;
    if (!admits(result)) rejectedBy.push(policy.name);
    visible.push({ policy, decision });
  }
  return { allowed: rejectedBy.length === 0, visible, rejectedBy };
}

/**
 * Calls `limiter` for one policy, keeping a synchronous limiter synchronous (no promise, no
 * microtask): `decided` gets its decision, `failed` what it threw or rejected with, each with
 * `context` (so a caller need not allocate a closure per call). `decided` runs outside the
 * limiter's `try`: what it throws is its caller's, not a limiter failure.
 */
export function decideWithLimiter<T, C = undefined>(
  limiter: EdgeLimiter,
  key: string,
  cost: number,
  decided: (decision: Decision, context: C) => T,
  failed: (error: unknown, context: C) => T | Promise<T>,
  context?: C,
): T | Promise<T> {
  if (limiter.kind === 'sync') {
    let decision: Decision;
    try {
      decision = limiter.limit(key, cost);
    } catch (error) {
      return failed(error, context as C);
    }
    return decided(decision, context as C);
  }
  let pending: Promise<Decision>;
  try {
    pending = limiter.limit(key, cost);
  } catch (error) {
    return failed(error, context as C);
  }
  return pending.then(
    (decision) => decided(decision, context as C),
    (error: unknown) => failed(error, context as C),
  );
}
