import { type Cancellable, type Clock, type Scheduler, systemScheduler } from '../core/clock.js';
import { assertKnownOptions, assertPositiveFinite, optionNames } from '../core/validate.js';

/**
 * A clock that is cheap to read: `nowMs()` returns a cached time that a ticker refreshes every
 * `resolutionMs`, instead of calling into the platform clock (`Date.now()` or `performance.now()`,
 * which costs more than a whole local limiter decision: docs/local-limiters.md).
 *
 * Contract:
 * - The value is at most about `resolutionMs` old while the event loop is free; while the loop is
 *   blocked (one long synchronous task) it does not advance. A limiter then sees less time pass
 *   than really did, so it refills less and admits less — the error is on the safe side.
 * - It never goes backwards, even if the source does.
 * - The ticker starts on the first read, is unref'd (it never keeps a process alive) and stops by
 *   itself after `idleStopMs` without reads; the next read restarts it with a fresh reading. So an
 *   idle process pays nothing, and a busy one pays one timer per `resolutionMs`.
 *
 * Why not "read the real clock every N calls": then the staleness depends on the call rate, which
 * is exactly the input a limiter must not trust. A time-based refresh bounds staleness in time.
 */
export interface CoarseClock extends Clock {
  /** Cached time in epoch milliseconds (see the contract above). */
  nowMs(): number;
  /** Whether the ticker is currently scheduled. */
  readonly running: boolean;
  /** Stop the ticker now; the next `nowMs()` restarts it. */
  stop(): void;
}

export interface CoarseClockOptions {
  /** How often the cached time is refreshed. Default 1 ms (the finest Node timers offer). */
  resolutionMs?: number;
  /** Stop ticking after this long without a read. Default 1000 ms. */
  idleStopMs?: number;
  /** Source of time and timers. Default: the real clock and unref'd timers. */
  scheduler?: Scheduler;
}

class Ticker implements CoarseClock {
  private cachedMs = Number.NEGATIVE_INFINITY;
  private isRunning = false;
  private readSinceTick = false;
  private idleMs = 0;
  private pendingTick: Cancellable | undefined;

  constructor(
    private readonly scheduler: Scheduler,
    private readonly resolutionMs: number,
    private readonly idleStopMs: number,
  ) {}

  nowMs(): number {
    if (!this.isRunning) this.start();
    this.readSinceTick = true;
    return this.cachedMs;
  }

  get running(): boolean {
    return this.isRunning;
  }

  stop(): void {
    this.pendingTick?.cancel();
    this.pendingTick = undefined;
    this.isRunning = false;
  }

  private start(): void {
    this.isRunning = true;
    this.idleMs = 0;
    this.refresh();
    this.schedule();
  }

  private refresh(): void {
    const sourceMs = this.scheduler.nowMs();
    if (sourceMs > this.cachedMs) this.cachedMs = sourceMs;
  }

  private schedule(): void {
    this.pendingTick = this.scheduler.setTimeout(this.onTick, this.resolutionMs);
  }

  private readonly onTick = (): void => this.tick();

  private tick(): void {
    if (!this.isRunning) return;
    this.refresh();
    if (this.readSinceTick) {
      this.readSinceTick = false;
      this.idleMs = 0;
    } else {
      this.idleMs += this.resolutionMs;
      if (this.idleMs >= this.idleStopMs) {
        this.pendingTick = undefined;
        this.isRunning = false;
        return;
      }
    }
    this.schedule();
  }
}

const COARSE_CLOCK_OPTIONS = optionNames<CoarseClockOptions>({
  resolutionMs: true,
  idleStopMs: true,
  scheduler: true,
});

export function createCoarseClock(options: CoarseClockOptions = {}): CoarseClock {
  assertKnownOptions(options, COARSE_CLOCK_OPTIONS, 'createCoarseClock');
  const resolutionMs = options.resolutionMs ?? 1;
  const idleStopMs = options.idleStopMs ?? 1000;
  assertPositiveFinite('resolutionMs', resolutionMs);
  assertPositiveFinite('idleStopMs', idleStopMs);
  return new Ticker(options.scheduler ?? systemScheduler, resolutionMs, idleStopMs);
}

/**
 * The process-wide coarse clock (1 ms resolution), the default clock of every local limiter. One
 * ticker serves all limiters, however many there are.
 */
export const coarseClock: CoarseClock = createCoarseClock();
