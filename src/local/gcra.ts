import type { Clock } from '../core/clock.js';
import type { Decision } from '../core/decision.js';
import { assertCost, assertGcraRate, assertKnownOptions, optionNames } from '../core/validate.js';
import { coarseClock } from './coarse-clock.js';
import { TIME_SLACK_MS } from './time-slack.js';

export interface GcraOptions {
  /** Requests (cost units) admitted per `periodMs` in steady state. */
  limit: number;
  periodMs: number;
  /** Most units admitted at once from rest; the `limit` of every decision. Default: `limit`. */
  burst?: number;
  /** Default: the shared 1 ms coarse clock (see coarse-clock.ts). */
  clock?: Clock;
}

/** One GCRA limiter for one caller or resource, decided in process. */
export interface Gcra {
  /** Admit `cost` units (default 1) or not. The hot path: no allocation, no I/O. */
  tryTake(cost?: number): boolean;
  /** Same decision as `tryTake`, with the full `Decision` (one object allocated per call). */
  take(cost?: number): Decision;
  readonly limit: number;
  readonly periodMs: number;
  readonly burst: number;
}

/**
 * GCRA (generic cell rate algorithm): each unit is due `periodMs / limit` after the previous one;
 * the state is the theoretical arrival time (TAT) of the next unit, and a call is admitted if
 * arriving now is at most `burst` units early.
 *
 * Pro: one number of state per key (half a token bucket) and no accumulated token count, which
 *   makes it the cheapest to store and to update atomically in a shared store; `retryAfterMs`
 *   falls straight out of the state; exactly the same admissions as a token bucket of capacity
 *   `burst` refilled at `limit / periodMs`.
 * Con: less intuitive to read and to explain; `remaining` is derived rather than stored; changing
 *   `limit` reinterprets existing state (a TAT means a different number of tokens).
 *
 * @example
 * // 100 requests a minute, at most 10 back to back.
 * const gcra = createGcra({ limit: 100, periodMs: 60_000, burst: 10 });
 * const decision = gcra.take(); // { allowed, limit: 10, remaining, resetAtMs, retryAfterMs }
 */
const GCRA_OPTIONS = optionNames<GcraOptions>({ limit: true, periodMs: true, burst: true, clock: true });

export function createGcra(options: GcraOptions): Gcra {
  assertKnownOptions(options, GCRA_OPTIONS, 'createGcra');
  const { limit, periodMs, burst } = resolveGcraRate(options);
  return new LocalGcra(limit, periodMs, burst, options.clock ?? coarseClock);
}

/** A GCRA's rate with `burst` defaulted to `limit`, checked (ERR_SPILLWAY_INVALID_LIMIT). */
export function resolveGcraRate(options: Pick<GcraOptions, 'limit' | 'periodMs' | 'burst'>): {
  limit: number;
  periodMs: number;
  burst: number;
} {
  const { limit, periodMs } = options;
  const burst = options.burst ?? limit;
  assertGcraRate(limit, periodMs, burst);
  return { limit, periodMs, burst };
}

// Numeric fields are initialised where declared so V8 keeps them unboxed (see token-bucket.ts).
class LocalGcra implements Gcra {
  readonly limit: number = Number.NaN;
  readonly periodMs: number = Number.NaN;
  readonly burst: number = Number.NaN;
  private readonly emissionIntervalMs: number = Number.NaN;
  private readonly toleranceMs: number = Number.NaN;
  /**
   * Times are kept relative to the limiter's creation: at epoch magnitude (1.7e12 ms) a double
   * steps by 0.24 µs, too coarse to add sub-microsecond emission intervals without drift.
   */
  private readonly originMs: number = Number.NaN;
  /** TAT relative to `originMs`; at or before now means the limiter is full. */
  private tatMs = Number.NEGATIVE_INFINITY;
  private readonly clock: Clock;

  constructor(limit: number, periodMs: number, burst: number, clock: Clock) {
    this.limit = limit;
    this.periodMs = periodMs;
    this.burst = burst;
    this.clock = clock;
    this.emissionIntervalMs = periodMs / limit;
    this.toleranceMs = burst * this.emissionIntervalMs;
    this.originMs = clock.nowMs();
  }

  tryTake(cost = 1): boolean {
    assertCost(cost, this.burst);
    const nowMs = this.clock.nowMs() - this.originMs;
    const tatMs = Math.max(this.tatMs, nowMs);
    const newTatMs = tatMs + cost * this.emissionIntervalMs;
    if (newTatMs - this.toleranceMs <= nowMs + TIME_SLACK_MS) {
      this.tatMs = newTatMs;
      return true;
    }
    return false;
  }

  take(cost = 1): Decision {
    assertCost(cost, this.burst);
    const nowMs = this.clock.nowMs() - this.originMs;
    const tatMs = Math.max(this.tatMs, nowMs);
    const decision = gcraDecision(this.burst, this.emissionIntervalMs, this.originMs, tatMs, nowMs, cost);
    if (decision.allowed) this.tatMs = tatMs + cost * this.emissionIntervalMs;
    return decision;
  }
}

/**
 * A GCRA's decision on `cost` units at `nowMs`, from the theoretical arrival time `tatMs` (at
 * least `nowMs`), both relative to `originMs`: allowed when the new TAT, `tatMs + cost *
 * emissionIntervalMs`, is at most `burst` intervals ahead (give or take TIME_SLACK_MS). The caller
 * stores that new TAT when allowed.
 */
export function gcraDecision(
  burst: number,
  emissionIntervalMs: number,
  originMs: number,
  tatMs: number,
  nowMs: number,
  cost: number,
): Decision {
  const toleranceMs = burst * emissionIntervalMs;
  const newTatMs = tatMs + cost * emissionIntervalMs;
  const allowAtMs = newTatMs - toleranceMs;
  const allowed = allowAtMs <= nowMs + TIME_SLACK_MS;
  const stateMs = allowed ? newTatMs : tatMs;
  const remaining = (toleranceMs - (stateMs - nowMs)) / emissionIntervalMs;
  return {
    allowed,
    limit: burst,
    remaining: Math.max(remaining, 0),
    resetAtMs: originMs + stateMs,
    retryAfterMs: allowed ? 0 : allowAtMs - nowMs,
  };
}
