import type { Clock } from '../core/clock.js';
import type { Decision } from '../core/decision.js';
import {
  assertCost,
  assertKey,
  assertKnownOptions,
  assertTokenBucketRate,
  optionNames,
} from '../core/validate.js';
import { KeyTable, resizeFloat64, type SlotStore } from './key-table.js';
import {
  KEYED_LIMITER_OPTIONS,
  type KeyedLimiterOptions,
  type KeyedLocalLimiter,
  type ResolvedKeyedOptions,
  resolveKeyedOptions,
} from './keyed-local-limiter.js';
import { TIME_SLACK_MS } from './time-slack.js';
import { tokenBucketDecision } from './token-bucket.js';

export interface KeyedTokenBucketOptions extends KeyedLimiterOptions {
  capacity: number;
  refillPerSec: number;
}

export interface KeyedTokenBucket extends KeyedLocalLimiter {
  readonly capacity: number;
  readonly refillPerSec: number;
}

/**
 * One token bucket per key (see token-bucket.ts for the algorithm) in bounded memory (see
 * key-table.ts). A missing key is a full bucket.
 *
 * @example
 * const perCaller = createKeyedTokenBucket({ capacity: 20, refillPerSec: 10 });
 * const decision = perCaller.limit(`api:caller=${callerId}`);
 * if (!decision.allowed) res.setHeader('retry-after', Math.ceil(decision.retryAfterMs / 1000));
 */
const KEYED_TOKEN_BUCKET_OPTIONS = optionNames<KeyedTokenBucketOptions>({
  capacity: true,
  refillPerSec: true,
  ...KEYED_LIMITER_OPTIONS,
});

export function createKeyedTokenBucket(options: KeyedTokenBucketOptions): KeyedTokenBucket {
  assertKnownOptions(options, KEYED_TOKEN_BUCKET_OPTIONS, 'createKeyedTokenBucket');
  assertTokenBucketRate(options.capacity, options.refillPerSec);
  const common = resolveKeyedOptions(options);
  return new LocalKeyedTokenBucket(options.capacity, options.refillPerSec, common);
}

// Numeric fields are initialised where declared so V8 keeps them unboxed (see token-bucket.ts).
class LocalKeyedTokenBucket implements KeyedTokenBucket, SlotStore {
  readonly capacity: number = Number.NaN;
  readonly refillPerSec: number = Number.NaN;
  readonly maxKeys: number = Number.NaN;
  private readonly refillPerMs: number = Number.NaN;
  private readonly slackTokens: number = Number.NaN;
  private readonly idleMs: number = Number.NaN;
  private readonly maxKeyLength: number = Number.NaN;
  private readonly clock: Clock;
  /** Per slot; may dip below 0 by at most `slackTokens` (debt, see time-slack.ts). */
  private tokens = new Float64Array(0);
  /** Per slot: time of the last refill, never moved backwards (a clock step back mints nothing). */
  private lastMs = new Float64Array(0);
  private readonly table: KeyTable;

  constructor(capacity: number, refillPerSec: number, options: ResolvedKeyedOptions) {
    this.capacity = capacity;
    this.refillPerSec = refillPerSec;
    this.maxKeys = options.maxKeys;
    this.refillPerMs = refillPerSec / 1000;
    this.slackTokens = this.refillPerMs * TIME_SLACK_MS;
    this.idleMs = options.idleMs;
    this.maxKeyLength = options.maxKeyLength;
    this.clock = options.clock;
    this.table = new KeyTable(options.maxKeys, this);
  }

  get size(): number {
    return this.table.size;
  }

  get evictions(): number {
    return this.table.evictions;
  }

  tryTake(key: string, cost = 1): boolean {
    assertKey(key, this.maxKeyLength);
    assertCost(cost, this.capacity);
    const nowMs = this.clock.nowMs();
    const slot = this.table.index.get(key);
    if (slot === undefined) {
      if (cost > 0) this.insert(key, cost, nowMs);
      return true;
    }
    this.table.referenced[slot] = 1;
    const tokens = this.refill(slot, nowMs);
    if (tokens + this.slackTokens >= cost) {
      this.tokens[slot] = tokens - cost;
      return true;
    }
    return false;
  }

  limit(key: string, cost = 1): Decision {
    assertKey(key, this.maxKeyLength);
    assertCost(cost, this.capacity);
    const nowMs = this.clock.nowMs();
    const slot = this.table.index.get(key);
    let tokens: number;
    let allowed: boolean;
    if (slot === undefined) {
      if (cost > 0) this.insert(key, cost, nowMs);
      tokens = this.capacity - cost;
      allowed = true;
    } else {
      this.table.referenced[slot] = 1;
      tokens = this.refill(slot, nowMs);
      allowed = tokens + this.slackTokens >= cost;
      if (allowed) {
        tokens -= cost;
        this.tokens[slot] = tokens;
      }
    }
    return tokenBucketDecision(this.capacity, this.refillPerMs, nowMs, allowed, tokens, cost);
  }

  reset(key: string): void {
    this.table.delete(key);
  }

  prune(): number {
    return this.table.prune(this.clock.nowMs());
  }

  resize(slotCapacity: number): void {
    this.tokens = resizeFloat64(this.tokens, slotCapacity);
    this.lastMs = resizeFloat64(this.lastMs, slotCapacity);
  }

  isExpired(slot: number, nowMs: number): boolean {
    const idleMs = nowMs - this.lastMs[slot]!;
    return idleMs >= this.idleMs || this.tokens[slot]! + idleMs * this.refillPerMs >= this.capacity;
  }

  private insert(key: string, cost: number, nowMs: number): void {
    const slot = this.table.insert(key, nowMs);
    this.tokens[slot] = this.capacity - cost;
    this.lastMs[slot] = nowMs;
  }

  private refill(slot: number, nowMs: number): number {
    const lastMs = this.lastMs[slot]!;
    let tokens = this.tokens[slot]!;
    if (nowMs > lastMs) {
      tokens += (nowMs - lastMs) * this.refillPerMs;
      if (tokens > this.capacity) tokens = this.capacity;
      this.tokens[slot] = tokens;
      this.lastMs[slot] = nowMs;
    }
    return tokens;
  }
}
