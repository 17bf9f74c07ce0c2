/**
 * The one result every Spillway limiter returns, local, Redis or global.
 *
 * A rejection is a returned decision (`allowed: false`), never an exception. Exceptions are kept
 * for real failures (bad input, a store that failed under a fail-closed policy is still a decision).
 */
export interface Decision {
  /** Whether this call may proceed. */
  allowed: boolean;
  /** The configured limit (tokens or requests per window) the decision was made against. */
  limit: number;
  /** Tokens or requests left after this call (never negative; may be fractional for refilling buckets). */
  remaining: number;
  /** Epoch milliseconds when the limiter is fully replenished (window end or bucket full). */
  resetAtMs: number;
  /** Milliseconds the caller should wait before retrying the same cost; 0 when allowed. */
  retryAfterMs: number;
  /**
   * Set only when the decision was not a normal count:
   * - `fail-open` / `fail-closed`: the store did not answer in time or failed; the policy decided.
   * - `insurance`: the store was unreachable and the local insurance limiter decided.
   * - `shadow`: a shadow-mode bucket would have rejected; the request was admitted and counted.
   */
  reason?: DecisionReason;
  /** With `fail-open`, `fail-closed` or `insurance`: what went wrong with the store. */
  storeFault?: StoreFault;
}

export type DecisionReason = 'fail-open' | 'fail-closed' | 'insurance' | 'shadow';
export type StoreFault = 'timeout' | 'error';

/** A limiter whose decisions are synchronous (local and global data plane). */
export interface SyncLimiter {
  /** Decide one call of `cost` units (default 1) for `key`. */
  limit(key: string, cost?: number): Decision;
}

/** A limiter whose decisions need a round trip (Redis). */
export interface AsyncLimiter {
  limit(key: string, cost?: number): Promise<Decision>;
}

export type Limiter = SyncLimiter | AsyncLimiter;
