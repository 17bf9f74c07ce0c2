import type { Clock } from '../core/clock.js';
import type { Decision, SyncLimiter } from '../core/decision.js';
import { assertPositiveFinite, assertPositiveInteger, DEFAULT_MAX_KEY_LENGTH } from '../core/validate.js';
import { coarseClock } from './coarse-clock.js';

export interface KeyedLimiterOptions {
  /**
   * Most keys held at once; beyond it a key is evicted by the CLOCK (second chance) policy: an
   * expired one when the hand finds one, else one untouched since the hand last passed. Default 100,000.
   */
  maxKeys?: number;
  /**
   * Drop a key untouched for this long even if its bucket is not yet full again. Default: never
   * earlier than full (lossless). Lower values save memory at the price of forgetting debt.
   */
  idleMs?: number;
  /** Longest accepted key. Default 512 (DEFAULT_MAX_KEY_LENGTH). */
  maxKeyLength?: number;
  /** Default: the shared 1 ms coarse clock (see coarse-clock.ts). */
  clock?: Clock;
}

/** What every keyed local limiter offers on top of `SyncLimiter`. */
export interface KeyedLocalLimiter extends SyncLimiter {
  /** Decide one call of `cost` units (default 1) for `key`; one `Decision` allocated per call. */
  limit(key: string, cost?: number): Decision;
  /** The same decision as a boolean: no allocation for a key already held. */
  tryTake(key: string, cost?: number): boolean;
  /** Forget `key` (it starts full again). */
  reset(key: string): void;
  /** Drop every expired key now (keys also expire on their own as new keys arrive). Returns how many. */
  prune(): number;
  /** Keys currently held. */
  readonly size: number;
  /** Live keys dropped because the table was full (their state was lost). */
  readonly evictions: number;
  readonly maxKeys: number;
}

/** Every option a keyed local limiter shares, for `optionNames` of the factories' own options. */
export const KEYED_LIMITER_OPTIONS = {
  maxKeys: true,
  idleMs: true,
  maxKeyLength: true,
  clock: true,
} as const satisfies { readonly [K in keyof Required<KeyedLimiterOptions>]: true };

/** Options after defaults and validation (internal). */
export interface ResolvedKeyedOptions {
  maxKeys: number;
  idleMs: number;
  maxKeyLength: number;
  clock: Clock;
}

export function resolveKeyedOptions(options: KeyedLimiterOptions): ResolvedKeyedOptions {
  const maxKeys = options.maxKeys ?? 100_000;
  const maxKeyLength = options.maxKeyLength ?? DEFAULT_MAX_KEY_LENGTH;
  assertPositiveInteger('maxKeys', maxKeys);
  assertPositiveInteger('maxKeyLength', maxKeyLength);
  if (options.idleMs !== undefined) assertPositiveFinite('idleMs', options.idleMs);
  return {
    maxKeys,
    maxKeyLength,
    idleMs: options.idleMs ?? Number.POSITIVE_INFINITY,
    clock: options.clock ?? coarseClock,
  };
}
