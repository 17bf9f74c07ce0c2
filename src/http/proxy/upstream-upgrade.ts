import { type IncomingHttpHeaders, STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Dispatcher } from 'undici';
import { CLOSE_GRACE_MS } from '../../server/raw-response.js';
import { clientResponseHeaders } from './forward-headers.js';
import { addRateLimitFields } from './rate-limit-merge.js';

/** What the upstream made of an upgrade request. */
export type UpgradeAnswer =
  /** `101`: the upstream socket, detached from the pool, for the tunnel. */
  | { kind: 'upgraded'; headers: IncomingHttpHeaders; socket: Duplex }
  /**
   * Any final answer but `101` (a WebSocket endpoint's `401`, `403`, `426`, or a `200` that
   * ignores the upgrade): relayed to the client as it comes, then the connection is closed.
   */
  | { kind: 'answered'; statusCode: number };

/**
 * The upstream side of an upgrade, as an undici dispatch handler. undici's `upgrade()` API fails
 * on any answer but `101` ("bad upgrade"), which would turn an endpoint's `401` into the proxy's
 * `502`; this handler relays such an answer instead, with the proxy's `RateLimit` fields merged in
 * as on any response. The client socket is the raw one Node handed over: the answer is written on
 * it as HTTP/1.1 with `Connection: close`, its body delimited by `Content-Length` when the upstream
 * sent one and by the close otherwise.
 *
 * Aborting `signal` before an answer (the client left, the deadline passed) aborts the upstream
 * request; a `101` that arrives after it is closed at once.
 */
export class UpstreamUpgrade implements Dispatcher.DispatchHandler {
  /** Settles once: the answer, or the failure before any (connection refused, reset, aborted). */
  readonly answer: Promise<UpgradeAnswer>;
  /** undici is done with the pooled connection: upgraded (detached), answered whole, failed or aborted. */
  readonly finished: Promise<void>;
  private resolveAnswer: (answer: UpgradeAnswer) => void = () => {};
  private rejectAnswer: (error: unknown) => void = () => {};
  private finish: () => void = () => {};
  private controller: Dispatcher.DispatchController | undefined = undefined;
  /** The answer's head went to the client: what follows is its body. */
  private relaying = false;
  private ended = false;
  /** undici gave it a connection (`onRequestStart`): a deadline passing from now on is the upstream's. */
  connected = false;

  /** `sendTimeoutMs`: how long the client may take no bytes of a relayed answer (0: no bound). */
  constructor(
    private readonly client: Duplex,
    private readonly limitHeaders: Readonly<Record<string, string>>,
    private readonly signal: AbortSignal,
    private readonly sendTimeoutMs: number,
  ) {
    this.answer = new Promise((resolve, reject) => {
      this.resolveAnswer = resolve;
      this.rejectAnswer = reject;
    });
    // Its caller may have stopped waiting (abandoned); the failure is then nobody's to handle.
    this.answer.catch(() => {});
    this.finished = new Promise((resolve) => {
      this.finish = resolve;
    });
    signal.addEventListener('abort', () => this.controller?.abort(signal.reason as Error), { once: true });
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    this.connected = true;
    if (this.signal.aborted) controller.abort(this.signal.reason as Error);
  }

  onRequestUpgrade(
    _controller: Dispatcher.DispatchController,
    _statusCode: number,
    headers: IncomingHttpHeaders,
    socket: Duplex,
  ): void {
    this.finish();
    if (this.signal.aborted) {
      socket.destroy();
      this.rejectAnswer(this.signal.reason);
      return;
    }
    this.resolveAnswer({ kind: 'upgraded', headers, socket });
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders,
    statusMessage?: string,
  ): void {
    // 1xx informational responses are not relayed.
    if (statusCode < 200) return;
    if (this.signal.aborted) {
      controller.abort(this.signal.reason as Error);
      return;
    }
    const relayed = clientResponseHeaders(headers);
    addRateLimitFields(relayed, this.limitHeaders);
    let head = `HTTP/1.1 ${statusCode} ${statusMessage || STATUS_CODES[statusCode] || ''}\r\n`;
    for (const [name, value] of Object.entries(relayed)) {
      for (const item of Array.isArray(value) ? value : [value]) head += `${name}: ${item}\r\n`;
    }
    this.relaying = true;
    // Header bytes as undici read them (latin1), not re-encoded as UTF-8.
    this.client.write(`${head}connection: close\r\n\r\n`, 'latin1');
    // From here the client's leaving is this handler's to notice.
    this.client.once('close', () => {
      if (!this.ended) controller.abort(new Error('the client closed the connection during the answer'));
    });
    this.resolveAnswer({ kind: 'answered', statusCode });
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.client.write(chunk)) return;
    controller.pause();
    const client = this.client;
    const stalled =
      this.sendTimeoutMs > 0
        ? setTimeout(() => {
            client.destroy();
            controller.abort(new Error(`the client took no response bytes for ${this.sendTimeoutMs} ms`));
          }, this.sendTimeoutMs)
        : undefined;
    client.once('drain', () => {
      clearTimeout(stalled);
      controller.resume();
    });
  }

  onResponseEnd(): void {
    this.ended = true;
    this.finish();
    const client = this.client;
    client.end();
    setTimeout(() => client.destroy(), CLOSE_GRACE_MS).unref();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.ended = true;
    this.finish();
    // Mid-answer: the client sees a cut response, as on any forwarded request.
    if (this.relaying) this.client.destroy();
    else this.rejectAnswer(error);
  }
}

/**
 * The upstream's `101` as the client gets it: its `Upgrade` and `Connection: upgrade`, its other
 * fields minus hop-by-hop ones, and the proxy's `RateLimit` fields merged with any it sent.
 */
export function switchingProtocolsHead(
  upstreamHeaders: IncomingHttpHeaders,
  limitHeaders: Readonly<Record<string, string>>,
): string {
  const relayed = clientResponseHeaders(upstreamHeaders);
  addRateLimitFields(relayed, limitHeaders);
  let head = 'HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n';
  const protocol = upstreamHeaders.upgrade;
  if (protocol !== undefined) head += `upgrade: ${protocol}\r\n`;
  for (const [name, value] of Object.entries(relayed)) {
    for (const item of Array.isArray(value) ? value : [value]) head += `${name}: ${item}\r\n`;
  }
  return `${head}\r\n`;
}
