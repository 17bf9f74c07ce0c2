/**
 * Time is injected everywhere so the same code runs in real time and in virtual time (tests, the
 * fleet simulator). `nowMs()` is epoch milliseconds and may be fractional.
 */
export interface Clock {
  nowMs(): number;
}

/** A handle to cancel something scheduled. */
export interface Cancellable {
  cancel(): void;
}

/** Timers, injected for the same reason as the clock. */
export interface Scheduler extends Clock {
  /** Run `fn` once after `delayMs`. Real implementations must not keep the process alive. */
  setTimeout(fn: () => void, delayMs: number): Cancellable;
}

/** Randomness, injected so tests and the simulator are deterministic. Returns a value in [0, 1). */
export type Random = () => number;

/** Wall clock with sub-millisecond resolution: monotonic `performance.now()` anchored to epoch. */
export const systemClock: Clock = {
  nowMs: () => performance.timeOrigin + performance.now(),
};

/** Real timers, unref'd so a limiter never keeps a process alive on its own. */
export const systemScheduler: Scheduler = {
  nowMs: systemClock.nowMs,
  setTimeout(fn, delayMs) {
    const timer = setTimeout(fn, delayMs);
    timer.unref();
    return { cancel: () => clearTimeout(timer) };
  },
};

/**
 * A clock and scheduler that only move when told to. Timers fire in due-time order (ties in
 * scheduling order) as `advance()` passes them; a timer scheduled by a firing timer fires in the
 * same `advance()` if it falls inside the advanced span.
 */
interface ManualTimer {
  dueMs: number;
  sequence: number;
  fn: () => void;
  cancelled: boolean;
}

export class ManualClock implements Scheduler {
  #nowMs: number;
  #sequence = 0;
  #timers: ManualTimer[] = [];

  constructor(startMs = 1_700_000_000_000) {
    this.#nowMs = startMs;
  }

  nowMs(): number {
    return this.#nowMs;
  }

  setTimeout(fn: () => void, delayMs: number): Cancellable {
    const timer: ManualTimer = {
      dueMs: this.#nowMs + Math.max(0, delayMs),
      sequence: this.#sequence++,
      fn,
      cancelled: false,
    };
    this.#timers.push(timer);
    return {
      cancel: () => {
        timer.cancelled = true;
      },
    };
  }

  /** Move time forward by `ms`, firing every timer that falls due on the way. */
  advance(ms: number): void {
    const targetMs = this.#nowMs + ms;
    for (;;) {
      this.#timers = this.#timers.filter((t) => !t.cancelled);
      let next: ManualTimer | undefined;
      for (const t of this.#timers) {
        if (
          t.dueMs <= targetMs &&
          (!next || t.dueMs < next.dueMs || (t.dueMs === next.dueMs && t.sequence < next.sequence))
        ) {
          next = t;
        }
      }
      if (!next) break;
      this.#nowMs = Math.max(this.#nowMs, next.dueMs);
      next.cancelled = true;
      next.fn();
    }
    this.#nowMs = targetMs;
  }

  /** Set the time directly (may go backwards, to test clock steps). Fires nothing. */
  set(ms: number): void {
    this.#nowMs = ms;
  }

  /** Timers still pending. */
  get pendingTimers(): number {
    return this.#timers.filter((t) => !t.cancelled).length;
  }
}

/** A seeded PRNG (mulberry32): fast, deterministic, good enough for load shedding and simulation. */
export function seededRandom(seed: number): Random {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
