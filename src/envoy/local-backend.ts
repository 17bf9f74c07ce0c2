import type { Clock } from '../core/clock.js';
import { systemClock } from '../core/clock.js';
import type { DescriptorOutcome, RlsBackend, WindowLimit } from './rls-backend.js';

export interface LocalBackendOptions {
  clock?: Clock;
  /** Counters held at once (default 100,000); past it, after expired windows are swept, new keys are admitted uncounted. */
  maxKeys?: number;
}

export const DEFAULT_LOCAL_MAX_KEYS = 100_000;

interface WindowCount {
  windowStartMs: number;
  windowEndMs: number;
  count: number;
}

/**
 * Exact counts in this process: a fixed window per bucket key, aligned to the Unix epoch as
 * envoyproxy/ratelimit's are. Each instance counts alone: N instances admit N x the limit.
 * A call over the limit is not counted (as our Redis scripts do), so it never pushes a window
 * further over.
 */
export function createLocalBackend(options: LocalBackendOptions = {}): RlsBackend & {
  readonly size: number;
  readonly uncounted: number;
} {
  const clock = options.clock ?? systemClock;
  const maxKeys = options.maxKeys ?? DEFAULT_LOCAL_MAX_KEYS;
  const counts = new Map<string, WindowCount>();
  let uncounted = 0;

  const sweep = (nowMs: number): void => {
    for (const [key, entry] of counts) if (entry.windowEndMs <= nowMs) counts.delete(key);
  };

  const check = (key: string, limit: WindowLimit, hits: number): DescriptorOutcome => {
    const nowMs = clock.nowMs();
    const windowMs = limit.unitSeconds * 1000;
    const windowStartMs = nowMs - (nowMs % windowMs);
    let entry = counts.get(key);
    if (entry === undefined) {
      if (counts.size >= maxKeys) sweep(nowMs);
      if (counts.size >= maxKeys) {
        uncounted++;
        return { overLimit: false, remaining: limit.requestsPerUnit, fault: true };
      }
      entry = { windowStartMs, windowEndMs: windowStartMs + windowMs, count: 0 };
      counts.set(key, entry);
    } else if (entry.windowStartMs !== windowStartMs) {
      entry.windowStartMs = windowStartMs;
      entry.windowEndMs = windowStartMs + windowMs;
      entry.count = 0;
    }
    if (entry.count + hits > limit.requestsPerUnit) return { overLimit: true, remaining: 0 };
    entry.count += hits;
    return { overLimit: false, remaining: limit.requestsPerUnit - entry.count };
  };

  return {
    kind: 'local',
    check,
    checkOverride: check,
    close: async () => {},
    get size() {
      return counts.size;
    },
    get uncounted() {
      return uncounted;
    },
  };
}
