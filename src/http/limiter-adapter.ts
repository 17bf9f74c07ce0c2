import type { AsyncLimiter, Decision, SyncLimiter } from '../core/decision.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { GlobalLimiter } from '../global/global-limiter.js';

/**
 * One shape over every Spillway limiter, so edge code (middleware, the proxy) is limiter-agnostic.
 * The `kind` tag lets a caller keep the synchronous path synchronous: a local or global decision
 * needs no `await`, no promise and no microtask, which is most of what it costs at the edge.
 */
export type EdgeLimiter =
  | { kind: 'sync'; limit(key: string, cost?: number): Decision }
  | { kind: 'async'; limit(key: string, cost?: number): Promise<Decision> };

export interface EdgeLimiterOptions {
  /** Skip detection. Needed only for a custom limiter that is synchronous (see `toEdgeLimiter`). */
  kind?: 'sync' | 'async';
}

const AsyncFunction = (async () => {}).constructor;

/**
 * Wraps a limiter as an `EdgeLimiter`. Detection, in order (the first that matches wins):
 *
 * 1. `options.kind`, when given.
 * 2. `limit` is an `async function` → async (every Redis limiter).
 * 3. The global limiter's shape (`bucket`, `allow`, `snapshot` methods) → sync.
 * 4. A keyed local limiter's shape (`tryTake` method next to `limit`) → sync.
 * 5. Anything else (a Redis limiter built without `async function` would land here too) → async, with a plain return value wrapped in a resolved promise: correct for
 *    any limiter, one microtask slower. Pass `{ kind: 'sync' }` to keep a custom sync limiter sync.
 *
 * Detection runs once, here; the returned `limit` calls the limiter's own method.
 */
export function toEdgeLimiter(
  limiter: SyncLimiter | AsyncLimiter | GlobalLimiter,
  options: EdgeLimiterOptions = {},
): EdgeLimiter {
  if (typeof limiter !== 'object' || limiter === null || typeof limiter.limit !== 'function') {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      'limiter must be an object with a limit(key, cost) method',
      {
        field: 'limiter',
      },
    );
  }
  const kind = options.kind ?? detectKind(limiter);
  if (kind === 'sync') {
    const sync = limiter as SyncLimiter;
    return { kind: 'sync', limit: (key, cost) => sync.limit(key, cost) };
  }
  if (kind !== 'async') {
    throw new SpillwayError(ErrorCode.InvalidOption, "kind must be 'sync' or 'async'", { field: 'kind' });
  }
  const call = limiter.limit as (key: string, cost?: number) => Decision | Promise<Decision>;
  if (call instanceof AsyncFunction) {
    const asyncLimiter = limiter as AsyncLimiter;
    return { kind: 'async', limit: (key, cost) => asyncLimiter.limit(key, cost) };
  }
  return {
    kind: 'async',
    // A sync throw (invalid key or cost) becomes a rejection, as it is for an async function.
    limit: async (key, cost) => call.call(limiter, key, cost),
  };
}

function detectKind(limiter: SyncLimiter | AsyncLimiter | GlobalLimiter): 'sync' | 'async' {
  if (limiter.limit instanceof AsyncFunction) return 'async';
  const shape = limiter as unknown as Record<string, unknown>;
  if (
    typeof shape.bucket === 'function' &&
    typeof shape.allow === 'function' &&
    typeof shape.snapshot === 'function'
  ) {
    return 'sync';
  }
  if (typeof shape.tryTake === 'function') return 'sync';
  return 'async';
}
