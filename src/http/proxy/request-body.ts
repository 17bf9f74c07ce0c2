import type { IncomingMessage } from 'node:http';

/** What a `RequestBody` reports to. */
export interface BodyOwner {
  bodySent(): void;
  /** The client sent no body bytes for `timeoutMs` while the proxy was ready for more. */
  bodyIdle(timeoutMs: number): void;
  /**
   * The body came slower than `minBytesPerSec`: `receivedBytes` over `waitedMs` of the proxy
   * waiting for it, past the grace (`minRateGraceMs`) and what those bytes earned.
   */
  bodyTooSlow(receivedBytes: number, waitedMs: number, minBytesPerSec: number): void;
  /** The upstream took no body bytes for `timeoutMs` while the proxy had some for it. */
  bodyStuckUpstream(timeoutMs: number): void;
}

/**
 * Whether a body is read ahead (`RequestBody.readAhead`) before its request takes an upstream
 * connection: one declared at most `bufferBodyBytes` long, or a chunked one (read until it ends
 * or passes them). A larger declared body streams at once; 0 streams every body.
 */
export function readsAhead(req: IncomingMessage, bufferBodyBytes: number): boolean {
  if (bufferBodyBytes === 0) return false;
  const declared = req.headers['content-length'];
  return declared === undefined || Number(declared) <= bufferBodyBytes;
}

/** Who the body is waiting for. */
enum Wait {
  /** undici (or the read-ahead) asked for the next chunk: the client's turn (`idleTimeoutMs`, the pace). */
  Client,
  /** A chunk was handed to undici, which has not asked for the next: the upstream's turn (`sendTimeoutMs`). */
  Upstream,
  /**
   * Read ahead and held while the request waits for a pooled upstream connection: nobody's turn
   * (the headers deadline bounds that wait).
   */
  Held,
  Stopped,
}

/** How long a body may wait on each side, and how slow it may come (0: no bound). */
export interface BodyBounds {
  /** A pause of the client while the proxy is ready for more (`server.bodyTimeoutMs`). */
  idleTimeoutMs: number;
  /** A pause of the upstream while the proxy has bytes for it (`upstream.sendTimeoutMs`). */
  sendTimeoutMs: number;
  /** The slowest average pace (`server.bodyMinBytesPerSec`). */
  minBytesPerSec?: number;
  /** Time the pace allows before any byte (`server.bodyMinRateGraceMs`); default 1 s. */
  minRateGraceMs?: number;
}

const DEFAULT_MIN_RATE_GRACE_MS = 1_000;

/**
 * A request body as undici reads it: chunk by chunk, each when the upstream socket has room.
 * Through an iterator that does not destroy `req` when undici stops reading (`return()`), so a
 * failed upstream still leaves the client connection able to carry the 502. `readAhead` reads
 * it before any upstream connection is taken: whole when it is small, its first bytes otherwise.
 *
 * Two bounds, each on the side the body waits for:
 * - the client: a pause longer than `idleTimeoutMs` while the proxy waits for its next chunk
 *   (nginx's `client_body_timeout`). Not while the upstream is slow to take the last one: then
 *   the proxy is not reading, and the client is not idle by choice. And its pace, when
 *   `minBytesPerSec` is set: all the time spent waiting for the client may not pass
 *   `minRateGraceMs` + received bytes / `minBytesPerSec` (Apache's mod_reqtimeout `MinRate`), or
 *   a client trickling a byte per pause holds the request for ever. The grace is short (a
 *   second): the pace is judged from the start, so a trickled upload is cut within seconds, not
 *   after a pause bound's worth of grace. The current client wait's bound is the smaller of the two.
 * - the upstream: longer than `sendTimeoutMs` between a chunk handed to undici and undici asking
 *   for the next, i.e. the upstream socket took nothing (nginx's `proxy_send_timeout`). Without
 *   it an upstream that stops reading mid-upload and never answers holds the request and its
 *   pooled connection for ever: the headers deadline waits for the body to be sent.
 *
 * Each is reported once. One timer per body: it fires at most once per the shortest bound and
 * checks the time spent in the current wait, then sleeps until that wait is due or for the
 * shortest bound, whichever is sooner, so a wait is reported as it reaches its bound whichever
 * side the body switched to meanwhile; a chunk only notes the time.
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
  /** Read ahead (`readAhead`) and not yet handed to undici. */
  private readonly ahead: Buffer[] = [];
  private readonly idleTimeoutMs: number;
  private sendTimeoutMs: number;
  private readonly minBytesPerSec: number;
  private readonly minRateGraceMs: number;

  constructor(
    req: IncomingMessage,
    private readonly owner: BodyOwner,
    bounds: BodyBounds,
  ) {
    this.chunks = req.iterator({ destroyOnReturn: false }) as AsyncIterableIterator<Buffer>;
    this.idleTimeoutMs = bounds.idleTimeoutMs;
    this.sendTimeoutMs = bounds.sendTimeoutMs;
    this.minBytesPerSec = bounds.minBytesPerSec ?? 0;
    this.minRateGraceMs = bounds.minRateGraceMs ?? DEFAULT_MIN_RATE_GRACE_MS;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Buffer>> {
    const held = this.ahead.shift();
    if (held !== undefined) {
      if (this.wait !== Wait.Stopped) this.waitFor(Wait.Upstream);
      return { done: false, value: held };
    }
    const result = await this.#pull();
    if (result.done) this.owner.bodySent();
    return result;
  }

  /**
   * Reads the body before the request takes an upstream connection, under the client's bounds:
   * resolves with the whole body once it ends within `maxBytes`, or with undefined once it has
   * passed them (what was read is held and handed to undici first, then the rest as it comes).
   * Also resolves with undefined once the body is stopped meanwhile (its owner answered), and
   * rejects when the client goes away: the owner knows which.
   */
  async readAhead(maxBytes: number): Promise<Buffer | undefined> {
    let bytes = 0;
    for (;;) {
      const result = await this.#pull();
      if (result.done) {
        const whole = Buffer.concat(this.ahead, bytes);
        this.ahead.length = 0;
        return whole;
      }
      if ((this.wait as Wait) === Wait.Stopped) return undefined;
      this.ahead.push(result.value);
      bytes += result.value.length;
      if (bytes > maxBytes) {
        if (this.wait !== Wait.Stopped) this.waitFor(Wait.Held);
        return undefined;
      }
    }
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
      else if (this.idleTimeoutMs === 0 || boundMs < this.idleTimeoutMs) {
        this.owner.bodyTooSlow(this.receivedBytes, this.clientWaitedMs + waitedMs, this.minBytesPerSec);
      } else this.owner.bodyIdle(boundMs);
      return;
    }
    // Never longer than the shortest bound: the wait may switch sides before this one is due.
    const shortest = this.shortestBoundMs();
    const nextMs = boundMs > 0 ? Math.min(boundMs - waitedMs, shortest) : shortest;
    if (Number.isFinite(nextMs)) this.arm(nextMs);
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

  /**
   * The next chunk from the client, timed as the client's turn; stops the timing at the end.
   * Truly private: undici probes a body for stream methods (it calls a `read` it finds).
   */
  async #pull(): Promise<IteratorResult<Buffer>> {
    if (this.wait !== Wait.Stopped) this.waitFor(Wait.Client);
    const result = await this.chunks.next();
    if (this.wait === Wait.Client) this.clientWaitedMs += performance.now() - this.waitStartedMs;
    if (result.done) {
      this.stop();
    } else {
      this.receivedBytes += result.value.length;
      // Stopped while the chunk was awaited (the exchange settled): no more timing.
      if ((this.wait as Wait) !== Wait.Stopped) this.waitFor(Wait.Upstream);
    }
    return result;
  }

  private waitFor(wait: Wait.Client | Wait.Upstream | Wait.Held): void {
    this.wait = wait;
    const nowMs = performance.now();
    this.waitStartedMs = nowMs;
    const boundMs = this.boundOf(wait);
    if (this.timer === undefined) {
      const shortest = this.shortestBoundMs();
      const delayMs = boundMs > 0 ? Math.min(boundMs, shortest) : shortest;
      if (Number.isFinite(delayMs)) this.arm(delayMs);
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

  /** The bound of a wait of this kind starting now; 0 when it has none. */
  private boundOf(wait: Wait): number {
    if (wait === Wait.Upstream) return this.sendTimeoutMs;
    if (wait !== Wait.Client) return 0;
    if (this.minBytesPerSec === 0) return this.idleTimeoutMs;
    const allowanceMs = this.minRateGraceMs + (this.receivedBytes * 1000) / this.minBytesPerSec;
    // At least 1 ms: 0 would read as "no bound".
    const paceMs = Math.max(1, allowanceMs - this.clientWaitedMs);
    return this.idleTimeoutMs === 0 ? paceMs : Math.min(this.idleTimeoutMs, paceMs);
  }

  /** The shortest of the bounds that are set, as a polling period; Infinity when none is. */
  private shortestBoundMs(): number {
    let shortest = Number.POSITIVE_INFINITY;
    if (this.idleTimeoutMs > 0) shortest = this.idleTimeoutMs;
    if (this.sendTimeoutMs > 0) shortest = Math.min(shortest, this.sendTimeoutMs);
    if (this.minBytesPerSec > 0) shortest = Math.min(shortest, this.minRateGraceMs);
    return shortest;
  }
}

function bodyTimerFired(body: RequestBody): void {
  body.fired();
}
