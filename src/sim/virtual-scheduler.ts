import type { Cancellable, Scheduler } from '../core/clock.js';

/**
 * The simulator's virtual time: the same contract as `ManualClock` (timers fire in due-time
 * order, ties in scheduling order, a timer scheduled by a firing timer fires in the same run if
 * it falls inside the span) with two differences a fleet needs:
 *
 * - A binary heap instead of a scan, so a fleet of 10,000 hosts with tens of thousands of
 *   pending timers (report intervals, in-flight messages, timeouts) costs O(log n) per timer
 *   rather than O(n).
 * - `runUntil()` is async and drains the microtask queue after each group of timers that fall
 *   due at the same instant. The real components settle promises (a report reply resolves the
 *   reporter's `await`), and their continuations must run at the virtual instant the reply
 *   arrived, before time moves on. One difference from a real event loop remains: Node drains
 *   microtasks after each timer, this scheduler after all the timers of one instant, so two
 *   timers due at the same instant both run before either's continuations. With a network
 *   delay above zero a reply lands at a later instant than its send, so this only reorders
 *   independent work; with a zero delay it can differ from Node's order.
 */
interface VirtualTimer {
  dueMs: number;
  sequence: number;
  fn: () => void;
  cancelled: boolean;
}

export class VirtualScheduler implements Scheduler {
  #nowMs: number;
  #sequence = 0;
  #heap: VirtualTimer[] = [];
  #pending = 0;
  #firedTimers = 0;

  constructor(startMs = 1_700_000_000_000) {
    this.#nowMs = startMs;
  }

  nowMs(): number {
    return this.#nowMs;
  }

  setTimeout(fn: () => void, delayMs: number): Cancellable {
    const timer: VirtualTimer = {
      dueMs: this.#nowMs + (Number.isFinite(delayMs) ? Math.max(0, delayMs) : 0),
      sequence: this.#sequence++,
      fn,
      cancelled: false,
    };
    this.#push(timer);
    this.#pending++;
    return {
      cancel: () => {
        if (!timer.cancelled) {
          timer.cancelled = true;
          this.#pending--;
        }
      },
    };
  }

  /** Timers scheduled and not yet fired or cancelled. */
  get pendingTimers(): number {
    return this.#pending;
  }

  /** Timers fired since construction (a cost figure for the simulator's report). */
  get firedTimers(): number {
    return this.#firedTimers;
  }

  /**
   * Move time to `targetMs`, firing every timer due on the way and letting the promise
   * continuations of each instant run before the next. Time never moves backwards.
   */
  async runUntil(targetMs: number): Promise<void> {
    for (;;) {
      const next = this.#peekLive();
      if (!next || next.dueMs > targetMs) break;
      const instantMs = next.dueMs;
      this.#nowMs = Math.max(this.#nowMs, instantMs);
      // Fire everything due at this instant (including timers they add with zero delay), then
      // let the promise work they started settle before the clock moves on.
      for (;;) {
        const timer = this.#peekLive();
        if (!timer || timer.dueMs > instantMs) break;
        this.#pop();
        timer.cancelled = true;
        this.#pending--;
        this.#firedTimers++;
        timer.fn();
      }
      await drainMicrotasks();
    }
    this.#nowMs = Math.max(this.#nowMs, targetMs);
  }

  /** `runUntil(now + ms)`. */
  advance(ms: number): Promise<void> {
    return this.runUntil(this.#nowMs + ms);
  }

  #peekLive(): VirtualTimer | undefined {
    while (this.#heap.length > 0 && this.#heap[0]!.cancelled) this.#pop();
    return this.#heap[0];
  }

  #push(timer: VirtualTimer): void {
    const heap = this.#heap;
    heap.push(timer);
    let index = heap.length - 1;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (!before(heap[index]!, heap[parent]!)) break;
      [heap[index], heap[parent]] = [heap[parent]!, heap[index]!];
      index = parent;
    }
  }

  #pop(): void {
    const heap = this.#heap;
    const last = heap.pop();
    if (heap.length === 0 || !last) return;
    heap[0] = last;
    let index = 0;
    for (;;) {
      const left = 2 * index + 1;
      const right = left + 1;
      let smallest = index;
      if (left < heap.length && before(heap[left]!, heap[smallest]!)) smallest = left;
      if (right < heap.length && before(heap[right]!, heap[smallest]!)) smallest = right;
      if (smallest === index) break;
      [heap[index], heap[smallest]] = [heap[smallest]!, heap[index]!];
      index = smallest;
    }
  }
}

function before(a: VirtualTimer, b: VirtualTimer): boolean {
  return a.dueMs < b.dueMs || (a.dueMs === b.dueMs && a.sequence < b.sequence);
}

/**
 * Resolves after every microtask queued so far, and every microtask those queue, has run: a
 * macrotask (setImmediate) only starts once the microtask queue is empty.
 */
export function drainMicrotasks(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
