import type { Clock } from '../core/clock.js';
import type { Decision } from '../core/decision.js';
import { assertCost, assertKey, assertKnownOptions, optionNames } from '../core/validate.js';
import { gcraDecision, resolveGcraRate } from './gcra.js';
import { KeyTable, resizeFloat64, type SlotStore } from './key-table.js';
import {
  KEYED_LIMITER_OPTIONS,
  type KeyedLimiterOptions,
  type KeyedLocalLimiter,
  type ResolvedKeyedOptions,
  resolveKeyedOptions,
} from './keyed-local-limiter.js';
import { TIME_SLACK_MS } from './time-slack.js';

export interface KeyedGcraOptions extends KeyedLimiterOptions {
  /** Units admitted per `periodMs` in steady state, per key. */
  limit: number;
  periodMs: number;
  /** Most units admitted at once from rest; the `limit` of every decision. Default: `limit`. */
  burst?: number;
}

export interface KeyedGcra extends KeyedLocalLimiter {
  /** The `limit` option (named apart from the `limit()` method). */
  readonly limitPerPeriod: number;
  readonly periodMs: number;
  readonly burst: number;
}

/**
 * One GCRA limiter per key (see gcra.ts for the algorithm and its Pro/Con) in bounded memory (see
 * key-table.ts). State is one number per key, the theoretical arrival time. A missing key is full.
 *
 * @example
 * const perTenant = createKeyedGcra({ limit: 600, periodMs: 60_000, burst: 50 });
 * if (!perTenant.tryTake(tenantId)) throw new TooManyRequests();
 */
const KEYED_GCRA_OPTIONS = optionNames<KeyedGcraOptions>({
  limit: true,
  periodMs: true,
  burst: true,
  ...KEYED_LIMITER_OPTIONS,
});

export function createKeyedGcra(options: KeyedGcraOptions): KeyedGcra {
  assertKnownOptions(options, KEYED_GCRA_OPTIONS, 'createKeyedGcra');
  const { limit, periodMs, burst } = resolveGcraRate(options);
  return new LocalKeyedGcra(limit, periodMs, burst, resolveKeyedOptions(options));
}

// Numeric fields are initialised where declared so V8 keeps them unboxed (see token-bucket.ts).
class LocalKeyedGcra implements KeyedGcra, SlotStore {
  readonly limitPerPeriod: number = Number.NaN;
  readonly periodMs: number = Number.NaN;
  readonly burst: number = Number.NaN;
  readonly maxKeys: number = Number.NaN;
  private readonly emissionIntervalMs: number = Number.NaN;
  private readonly toleranceMs: number = Number.NaN;
  private readonly idleMs: number = Number.NaN;
  private readonly maxKeyLength: number = Number.NaN;
  private readonly clock: Clock;
  /** Times are relative to creation, for precision (see gcra.ts). */
  private readonly originMs: number = Number.NaN;
  /** Per slot: theoretical arrival time; at or before now means full (expired). */
  private tatMs = new Float64Array(0);
  /** Per slot: last call time, kept only when `idleMs` is set (otherwise TAT decides expiry). */
  private touchedMs: Float64Array | undefined;
  private readonly table: KeyTable;

  constructor(limitPerPeriod: number, periodMs: number, burst: number, options: ResolvedKeyedOptions) {
    this.limitPerPeriod = limitPerPeriod;
    this.periodMs = periodMs;
    this.burst = burst;
    this.maxKeys = options.maxKeys;
    this.emissionIntervalMs = periodMs / limitPerPeriod;
    this.toleranceMs = burst * this.emissionIntervalMs;
    this.idleMs = options.idleMs;
    this.maxKeyLength = options.maxKeyLength;
    this.clock = options.clock;
    this.originMs = this.clock.nowMs();
    if (Number.isFinite(this.idleMs)) this.touchedMs = new Float64Array(0);
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
    assertCost(cost, this.burst);
    const nowMs = this.clock.nowMs() - this.originMs;
    const slot = this.table.index.get(key);
    if (slot === undefined) {
      if (cost > 0) this.insert(key, nowMs + cost * this.emissionIntervalMs, nowMs);
      return true;
    }
    this.table.referenced[slot] = 1;
    if (this.touchedMs !== undefined) this.touchedMs[slot] = nowMs;
    const tatMs = this.tatMs[slot]!;
    const newTatMs = Math.max(tatMs, nowMs) + cost * this.emissionIntervalMs;
    if (newTatMs - this.toleranceMs <= nowMs + TIME_SLACK_MS) {
      this.tatMs[slot] = newTatMs;
      return true;
    }
    return false;
  }

  limit(key: string, cost = 1): Decision {
    assertKey(key, this.maxKeyLength);
    assertCost(cost, this.burst);
    const nowMs = this.clock.nowMs() - this.originMs;
    const slot = this.table.index.get(key);
    let tatMs = nowMs;
    if (slot !== undefined) {
      this.table.referenced[slot] = 1;
      if (this.touchedMs !== undefined) this.touchedMs[slot] = nowMs;
      const storedMs = this.tatMs[slot]!;
      if (storedMs > nowMs) tatMs = storedMs;
    }
    const decision = gcraDecision(this.burst, this.emissionIntervalMs, this.originMs, tatMs, nowMs, cost);
    if (decision.allowed && cost > 0) {
      const newTatMs = tatMs + cost * this.emissionIntervalMs;
      if (slot === undefined) this.insert(key, newTatMs, nowMs);
      else this.tatMs[slot] = newTatMs;
    }
    return decision;
  }

  reset(key: string): void {
    this.table.delete(key);
  }

  prune(): number {
    return this.table.prune(this.clock.nowMs() - this.originMs);
  }

  resize(slotCapacity: number): void {
    this.tatMs = resizeFloat64(this.tatMs, slotCapacity);
    if (this.touchedMs !== undefined) this.touchedMs = resizeFloat64(this.touchedMs, slotCapacity);
  }

  isExpired(slot: number, nowMs: number): boolean {
    if (this.tatMs[slot]! <= nowMs) return true;
    return this.touchedMs !== undefined && nowMs - this.touchedMs[slot]! >= this.idleMs;
  }

  private insert(key: string, tatMs: number, nowMs: number): void {
    const slot = this.table.insert(key, nowMs);
    this.tatMs[slot] = tatMs;
    if (this.touchedMs !== undefined) this.touchedMs[slot] = nowMs;
  }
}
