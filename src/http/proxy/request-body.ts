import type { IncomingMessage } from 'node:http';

/** What a `RequestBody` reports to. */
export interface BodyOwner {
  bodySent(): void;
  /** The client sent no body bytes for `timeoutMs` while the proxy was ready for more. */
  bodyIdle(timeoutMs: number): void;
  /**
   * The body came slower than `minBytesPerSec`: `receivedBytes` over `waitedMs` of the proxy
   * waiting for it, past the grace (`idleTimeoutMs`) and what those bytes earned.
   */
  bodyTooSlow(receivedBytes: number, waitedMs: number, minBytesPerSec: number): void;
  /** The upstream took no body bytes for `timeoutMs` while the proxy had some for it. */
  bodyStuckUpstream(timeoutMs: number): void;
}

/** Who the body is waiting for. */
enum Wait {
  /** undici asked for the next chunk: the client's turn (`idleTimeoutMs`). */
  Client,
  /** A chunk was handed to undici, which has not asked for the next: the upstream's turn (`sendTimeoutMs`). */
  Upstream,
  Stopped,
}

/**
 * A request body as undici reads it: chunk by chunk, each when the upstream socket has room.
 * Through an iterator that does not destroy `req` when undici stops reading (`return()`), so a
 * failed upstream still leaves the client connection able to carry the 502.
 *
 * Two bounds, each on the side the body waits for (0: none):
 * - the client: a pause longer than `idleTimeoutMs` while undici waits for its next chunk (nginx's
 *   `client_body_timeout`). Not while the upstream is slow to take the last one: then the proxy is
 *   not reading, and the client is not idle by choice. And its pace, when `minBytesPerSec` is set
 *   (and `idleTimeoutMs`, its grace): all the time spent waiting for the client may not pass
 *   `idleTimeoutMs` + received bytes / `minBytesPerSec` (Apache's mod_reqtimeout `MinRate`), or a
 *   client trickling a byte per pause holds the request for ever. The current client wait's bound
 *   is the smaller of the two.
 * - the upstream: longer than `sendTimeoutMs` between a chunk handed to undici and undici asking
 *   for the next, i.e. the upstream socket took nothing (nginx's `proxy_send_timeout`). Without
 *   it an upstream that stops reading mid-upload and never answers holds the request and its
 *   pooled connection for ever: the headers deadline waits for the body to be sent.
 *
 * Each is reported once. One timer per body: it fires at most once per the shorter bound and
 * checks the time spent in the current wait, then sleeps until that wait is due or for the
 * shorter bound, whichever is sooner, so a wait is reported as it reaches its bound whichever side
 * the body switched to meanwhile; a chunk only notes the time.
 */
export class RequestBody implements AsyncIterableIterator<Buffer> {
  private readonly chunks: AsyncIterableIterator<Buffer>;
  private timer: NodeJS.Timeout | undefined = undefined;
  private wait = Wait.Client;
  private waitStartedMs = 0;
  /** When the armed timer fires (`performance.now()` time). */
  private timerDueMs = 0;
  /** Time spent in client waits that ended (a chunk came). */
  private clientWaitedMs = 0;
  private receivedBytes = 0;

  constructor(
    req: IncomingMessage,
    private readonly owner: BodyOwner,
    private readonly idleTimeoutMs: number,
    private sendTimeoutMs: number,
    /** 0: no bound on pace; ignored when `idleTimeoutMs` is 0 (no grace). */
    private readonly minBytesPerSec = 0,
  ) {
    this.chunks = req.iterator({ destroyOnReturn: false }) as AsyncIterableIterator<Buffer>;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Buffer>> {
    if (this.wait !== Wait.Stopped) this.waitFor(Wait.Client);
    const result = await this.chunks.next();
    if (this.wait === Wait.Client) this.clientWaitedMs += performance.now() - this.waitStartedMs;
    if (!result.done) this.receivedBytes += result.value.length;
    if (result.done) {
      this.stop();
      this.owner.bodySent();
      // Stopped while the chunk was awaited (the exchange settled): no more timing.
    } else if ((this.wait as Wait) !== Wait.Stopped) {
      this.waitFor(Wait.Upstream);
    }
    return result;
  }

  return(): Promise<IteratorResult<Buffer>> {
    this.stop();
    return this.chunks.return?.() ?? Promise.resolve({ done: true, value: undefined });
  }

  /** The timer fired: reports the current wait if it has lasted its bound, else waits out the rest. */
  fired(): void {
    this.timer = undefined;
    if (this.wait === Wait.Stopped) return;
    const boundMs = this.boundOf(this.wait);
    const waitedMs = performance.now() - this.waitStartedMs;
    if (boundMs > 0 && waitedMs >= boundMs - 1) {
      const wait = this.wait;
      this.stop();
      if (wait === Wait.Upstream) this.owner.bodyStuckUpstream(boundMs);
      else if (boundMs < this.idleTimeoutMs) {
        this.owner.bodyTooSlow(this.receivedBytes, this.clientWaitedMs + waitedMs, this.minBytesPerSec);
      } else this.owner.bodyIdle(boundMs);
      return;
    }
    // Never longer than the shorter bound: the wait may switch sides before this one is due.
    const shortest = this.shortestBoundMs();
    this.arm(boundMs > 0 ? Math.min(boundMs - waitedMs, shortest) : shortest);
  }

  /**
   * The upstream started its answer: from now on it may stop taking the body because the proxy
   * paused it (a client slow to read a full-duplex answer), so its send bound no longer applies;
   * `upstream.bodyTimeoutMs` bounds the answer instead.
   */
  responseStarted(): void {
    this.sendTimeoutMs = 0;
  }

  stop(): void {
    this.wait = Wait.Stopped;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private waitFor(wait: Wait.Client | Wait.Upstream): void {
    this.wait = wait;
    const nowMs = performance.now();
    this.waitStartedMs = nowMs;
    const boundMs = this.boundOf(wait);
    if (this.timer === undefined) {
      const shortest = this.shortestBoundMs();
      if (shortest > 0) this.arm(boundMs > 0 ? Math.min(boundMs, shortest) : shortest);
    } else if (boundMs > 0 && nowMs + boundMs < this.timerDueMs) {
      // A client wait whose pace allowance is nearly spent: due before the armed timer. Only a
      // client slower than `minBytesPerSec` gets here; a body that keeps pace never re-arms.
      clearTimeout(this.timer);
      this.arm(boundMs);
    }
  }

  private arm(delayMs: number): void {
    const ms = Math.max(1, delayMs);
    this.timerDueMs = performance.now() + ms;
    this.timer = setTimeout(bodyTimerFired, ms, this);
  }

  private boundOf(wait: Wait): number {
    if (wait !== Wait.Client) return this.sendTimeoutMs;
    if (this.minBytesPerSec === 0 || this.idleTimeoutMs === 0) return this.idleTimeoutMs;
    const allowanceMs = this.idleTimeoutMs + (this.receivedBytes * 1000) / this.minBytesPerSec;
    // At least 1 ms: 0 would read as "no bound".
    return Math.max(1, Math.min(this.idleTimeoutMs, allowanceMs - this.clientWaitedMs));
  }

  /** The shorter of the two bounds that are set; 0 when neither is. */
  private shortestBoundMs(): number {
    if (this.idleTimeoutMs === 0) return this.sendTimeoutMs;
    if (this.sendTimeoutMs === 0) return this.idleTimeoutMs;
    return Math.min(this.idleTimeoutMs, this.sendTimeoutMs);
  }
}

function bodyTimerFired(body: RequestBody): void {
  body.fired();
}
