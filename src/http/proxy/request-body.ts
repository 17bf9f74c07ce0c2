import type { IncomingMessage } from 'node:http';

/** What a `RequestBody` reports to. */
export interface BodyOwner {
  bodySent(): void;
  bodyIdle(timeoutMs: number): void;
}

/**
 * A request body as undici reads it: chunk by chunk, each when the upstream socket has room.
 * Through an iterator that does not destroy `req` when undici stops reading (`return()`), so a
 * failed upstream still leaves the client connection able to carry the 502.
 *
 * The idle timer runs only while undici waits for the client's next chunk, not while the upstream
 * is slow to take the last one (then the proxy is not reading, and the client is not idle by
 * choice): a pause longer than `idleTimeoutMs` (0: none) is reported once. One timer per body,
 * refreshed per chunk.
 */
export class RequestBody implements AsyncIterableIterator<Buffer> {
  private readonly chunks: AsyncIterableIterator<Buffer>;
  private timer: NodeJS.Timeout | undefined = undefined;
  private waiting = false;
  private stopped = false;

  constructor(
    req: IncomingMessage,
    private readonly owner: BodyOwner,
    private readonly idleTimeoutMs: number,
  ) {
    this.chunks = req.iterator({ destroyOnReturn: false }) as AsyncIterableIterator<Buffer>;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Buffer>> {
    if (this.idleTimeoutMs > 0 && !this.stopped) {
      this.waiting = true;
      if (this.timer === undefined) this.timer = setTimeout(bodyIdleFired, this.idleTimeoutMs, this);
      else this.timer.refresh();
    }
    let result: IteratorResult<Buffer>;
    try {
      result = await this.chunks.next();
    } finally {
      this.waiting = false;
    }
    if (result.done) {
      this.stop();
      this.owner.bodySent();
    }
    return result;
  }

  return(): Promise<IteratorResult<Buffer>> {
    this.stop();
    return this.chunks.return?.() ?? Promise.resolve({ done: true, value: undefined });
  }

  /** The timer fired: idle only if undici has been waiting for the client all along. */
  fired(): void {
    if (this.waiting && !this.stopped) this.owner.bodyIdle(this.idleTimeoutMs);
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

function bodyIdleFired(body: RequestBody): void {
  body.fired();
}
