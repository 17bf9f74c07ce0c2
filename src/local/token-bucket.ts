import type { Clock } from '../core/clock.js';
import type { Decision } from '../core/decision.js';
import { assertCost, assertKnownOptions, assertTokenBucketRate, optionNames } from '../core/validate.js';
import { coarseClock } from './coarse-clock.js';
import { TIME_SLACK_MS } from './time-slack.js';

export interface TokenBucketOptions {
  /** Most tokens the bucket holds: the largest burst, and the `limit` of every decision. */
  capacity: number;
  /** Tokens added per second, continuously (lazily, at each call; no timers). */
  refillPerSec: number;
  /** Default: the shared 1 ms coarse clock (see coarse-clock.ts). */
  clock?: Clock;
}

/** One token bucket for one caller or resource, decided in process. */
export interface TokenBucket {
  /**
   * Take `cost` tokens (default 1) if they are there. The hot path: no allocation, no I/O.
   * Throws `ERR_SPILLWAY_INVALID_COST` for a negative, non-finite or over-capacity cost.
   */
  tryTake(cost?: number): boolean;
  /** Same decision as `tryTake`, with the full `Decision` (one object allocated per call). */
  take(cost?: number): Decision;
  readonly capacity: number;
  readonly refillPerSec: number;
}

/**
 * Token bucket: holds up to `capacity` tokens, refilled at `refillPerSec`; a call of cost n takes n
 * tokens or, if fewer are there, takes nothing and is rejected.
 *
 * Pro: the most familiar model ("burst of capacity, then refillPerSec"); fractional costs; memory is
 * two numbers. Con: two numbers of state to keep in step (see gcra.ts for the one-number form).
 *
 * @example
 * const bucket = createTokenBucket({ capacity: 10, refillPerSec: 5 });
 * if (!bucket.tryTake()) return reply.code(429).send();
 */
const TOKEN_BUCKET_OPTIONS = optionNames<TokenBucketOptions>({
  capacity: true,
  refillPerSec: true,
  clock: true,
});

export function createTokenBucket(options: TokenBucketOptions): TokenBucket {
  assertKnownOptions(options, TOKEN_BUCKET_OPTIONS, 'createTokenBucket');
  assertTokenBucketRate(options.capacity, options.refillPerSec);
  return new LocalTokenBucket(options.capacity, options.refillPerSec, options.clock ?? coarseClock);
}

// Numeric fields are initialised where declared, with a double, so V8 keeps them unboxed. A field
// that first holds `undefined` (a bare declaration, or a constructor parameter property) is stored
// as a tagged pointer: every write then allocates a HeapNumber and the hot path stops being free.
class LocalTokenBucket implements TokenBucket {
  readonly capacity: number = Number.NaN;
  readonly refillPerSec: number = Number.NaN;
  private readonly refillPerMs: number = Number.NaN;
  private readonly slackTokens: number = Number.NaN;
  /** May dip below 0 by at most `slackTokens` (debt, see time-slack.ts). */
  private tokens = Number.NaN;
  /** Time of the last refill. Never moves backwards, so a clock step back mints nothing. */
  private lastMs = Number.NEGATIVE_INFINITY;
  private readonly clock: Clock;

  constructor(capacity: number, refillPerSec: number, clock: Clock) {
    this.capacity = capacity;
    this.refillPerSec = refillPerSec;
    this.clock = clock;
    this.refillPerMs = refillPerSec / 1000;
    this.slackTokens = this.refillPerMs * TIME_SLACK_MS;
    this.tokens = capacity;
  }

  tryTake(cost = 1): boolean {
    assertCost(cost, this.capacity);
    const tokens = this.refill(this.clock.nowMs());
    if (tokens + this.slackTokens >= cost) {
      this.tokens = tokens - cost;
      return true;
    }
    return false;
  }

  take(cost = 1): Decision {
    assertCost(cost, this.capacity);
    const nowMs = this.clock.nowMs();
    const tokens = this.refill(nowMs);
    const allowed = tokens + this.slackTokens >= cost;
    const left = allowed ? tokens - cost : tokens;
    this.tokens = left;
    return tokenBucketDecision(this.capacity, this.refillPerMs, nowMs, allowed, left, cost);
  }

  private refill(nowMs: number): number {
    if (nowMs > this.lastMs) {
      const tokens = this.tokens + (nowMs - this.lastMs) * this.refillPerMs;
      this.tokens = Math.min(tokens, this.capacity);
      this.lastMs = nowMs;
    }
    return this.tokens;
  }
}

/**
 * A token bucket's decision at `nowMs` on a call of `cost` tokens, `left` tokens in it after the
 * call (taken or not): full again `(capacity - left) / refillPerMs` later; refused, the call can
 * pass once `cost` tokens are there.
 */
export function tokenBucketDecision(
  capacity: number,
  refillPerMs: number,
  nowMs: number,
  allowed: boolean,
  left: number,
  cost: number,
): Decision {
  return {
    allowed,
    limit: capacity,
    remaining: Math.max(left, 0),
    resetAtMs: nowMs + (capacity - left) / refillPerMs,
    retryAfterMs: allowed ? 0 : (cost - left) / refillPerMs,
  };
}
