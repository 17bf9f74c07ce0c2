import { Fifo } from './fifo.js';

/** A request or an upgrade waiting for one of the pool's connections. */
export interface ConnectionWaiter {
  /** In the queue. */
  queued: boolean;
  /** Still wants a connection: not answered or abandoned while it waited. */
  readonly wanted: boolean;
  /** A connection is free for it: it takes it (`UpstreamQueue.take`), or declines. */
  connectionFree(): void;
}

/** Answered or abandoned entries are swept out once they are this many and half the queue. */
const SWEEP_MIN = 64;

/**
 * Who holds the upstream pool's connections, and who waits for one. At most `connections`
 * requests and upgrades are handed to the pool at a time, so undici never queues one: the rest
 * wait here, first in first out, where one that timed out or whose client left can be dropped
 * without undici ever seeing it (undici cannot take a request out of its queue: it aborts it once
 * a connection takes it, which destroys that connection).
 *
 * Entries answered or abandoned while they wait (timed out, client gone) are skipped when their
 * turn comes, and swept out once they are half the queue: a pool held for a long time (streams,
 * long polls) does not keep every request that gave up on it.
 */
export class UpstreamQueue {
  private inPool = 0;
  private readonly waiting = new Fifo<ConnectionWaiter>();
  private abandoned = 0;
  private readonly serve = () => this.serveWaiting();

  constructor(private readonly connections: number) {}

  /** Requests and upgrades that wait and still want a connection. */
  get depth(): number {
    return this.waiting.length - this.abandoned;
  }

  /** Entries held, those answered or abandoned while they waited included. */
  get held(): number {
    return this.waiting.length;
  }

  /**
   * A connection is free and nobody waits for one. Between a connection given back and the queue
   * served (a microtask later, `release`), the queue goes first: a newcomer does not overtake it.
   */
  hasRoom(): boolean {
    return this.inPool < this.connections && this.waiting.length === this.abandoned;
  }

  /** Whether `maxQueued` already wait: the next one is refused. */
  isFull(maxQueued: number): boolean {
    return this.depth >= maxQueued;
  }

  /** Takes a connection: after `hasRoom()`, or in `connectionFree()`. */
  take(): void {
    this.inPool++;
  }

  /** A connection given back (a request or an upgrade done with it): the next one waiting takes it. */
  release(): void {
    this.inPool--;
    // After undici has marked the connection free, so the next request is not queued behind it.
    if (this.waiting.length > 0) queueMicrotask(this.serve);
  }

  wait(waiter: ConnectionWaiter): void {
    waiter.queued = true;
    this.waiting.push(waiter);
    // Room already (the queue is being served): make sure it is served.
    if (this.inPool < this.connections) queueMicrotask(this.serve);
  }

  /** An entry still queued was answered or abandoned. */
  abandon(): void {
    this.abandoned++;
    if (this.abandoned < SWEEP_MIN || this.abandoned * 2 < this.waiting.length) return;
    this.waiting.retain(
      (waiter) => waiter.wanted,
      (waiter) => {
        waiter.queued = false;
      },
    );
    this.abandoned = 0;
  }

  /** The oldest waiting, while the pool has room for them. */
  private serveWaiting(): void {
    while (this.inPool < this.connections) {
      const next = this.waiting.shift();
      if (next === undefined) return;
      next.queued = false;
      if (next.wanted) next.connectionFree();
      else this.abandoned--;
    }
  }
}
