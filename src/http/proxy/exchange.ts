import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import { rateLimitHeaders } from '../rate-limit-headers.js';
import { rateLimitedBody } from '../rate-limited-response.js';
import { type ActiveRules, forwardedRequestHeaders } from './active-rules.js';
import { clientResponseHeaders } from './forward-headers.js';
import { lingeringClose } from './lingering-close.js';
import type { ProxyContext } from './proxy-context.js';
import type { ProxyOutcome } from './proxy-metrics.js';
import { hasBody, NO_HEADERS, repeatedHeaderBody, sendJson } from './proxy-responses.js';
import { addRateLimitFields } from './rate-limit-merge.js';
import { type BodyOwner, RequestBody, readsAhead } from './request-body.js';
import type { ProxyVerdict } from './request-decision.js';
import {
  CLIENT_GONE,
  describeUpstreamFailure,
  ExchangeAbortError,
  headersTimeoutFailure,
} from './upstream-failure.js';
import type { ConnectionWaiter } from './upstream-queue.js';

/**
 * One request, from its arrival to its `close`. When it is forwarded, this is also the undici
 * dispatch handler of its upstream request: response headers go out with `writeHead`, each
 * body chunk with `res.write` (the upstream socket paused while `res` is over its high-water
 * mark, resumed on `drain`), and the outcome is counted once. No response stream, promise or
 * AbortController per request: the client leaving (`closed`) aborts through the controller.
 *
 * A request body up to `server.bufferBodyBytes` is read whole before the request takes a
 * connection, so a client slow to send it holds none; a larger one streams (its client holding at
 * most `server.maxUploadsPerClient` of them, `ClientUploads`). Either way its pace is the
 * client's, bounded by `RequestBody`.
 *
 * Waiting for the upstream is bounded by one deadline, `upstream.headersTimeoutMs`, from the
 * forward (after any read-ahead): time waiting for a connection (in the upstream queue) counts
 * (undici's own headers timeout starts only once the request is on a connection, so a saturated
 * pool would hold requests for ever). It is suspended while a streamed body is sent, and resumes
 * with what is left of it once the body is sent. One timer per forwarded request, set and cleared.
 */
export class Exchange implements Dispatcher.DispatchHandler, BodyOwner, ConnectionWaiter {
  /** The origin-form target to forward, set once the request is found sound. */
  target = '';
  /** Waiting in the upstream queue for a pooled connection. */
  queued = false;
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** The rules it arrived under, which it is served under to its end. */
  readonly rules: ActiveRules;
  readonly #context: ProxyContext;
  /** The client sent `Expect: 100-continue`: its body comes only once it is told to send it. */
  readonly #expectContinue: boolean;
  #headers: Record<string, string | string[]> = NO_HEADERS;
  #limitHeaders: Record<string, string> = NO_HEADERS;
  /** Handed to the pool and not yet finished there (holding one of the queue's connections). */
  #inPool = false;
  /** Set once forwarded: the outcome counted for it (at most once). */
  #forwarded = false;
  #outcome: ProxyOutcome | undefined = undefined;
  #controller: Dispatcher.DispatchController | undefined = undefined;
  /** The client left before its response was complete. */
  #clientGone = false;
  /** Upstream response headers arrived, or the deadline for them passed. */
  #headersWaitOver = false;
  /** The upstream response ended (`res.end()` called). */
  #upstreamEnded = false;
  #forwardedMs = 0;
  /** When the request got an upstream connection (`onRequestStart`); 0 while queued. */
  #connectedMs = 0;
  /** When the upstream had the whole request: its body sent, or its connection taken if it has none. */
  #sentMs = 0;
  /** `upstream.headersTimeoutMs` when the request was forwarded (0: no deadline). */
  #headersTimeoutMs = 0;
  /** The headers deadline, while it runs. */
  #deadline: NodeJS.Timeout | undefined = undefined;
  /** A body streamed to the upstream as it comes (read ahead first, when it may be small). */
  #body: RequestBody | null = null;
  /** A body read whole before the request took a connection (`server.bufferBodyBytes`). */
  #bufferedBody: Buffer | null = null;
  /** Gives back the client's upload slot (`ClientUploads`); a no-op once given back. */
  #releaseUpload: () => void = noop;

  constructor(context: ProxyContext, req: IncomingMessage, res: ServerResponse, expectContinue: boolean) {
    this.#context = context;
    this.req = req;
    this.res = res;
    this.rules = context.rules;
    this.#expectContinue = expectContinue;
  }

  /**
   * Takes one of its client's upload slots when it has a body to come; false when the client
   * already has `server.maxUploadsPerClient` in progress (the request is then refused).
   */
  claimUpload(): boolean {
    const release = this.#context.uploads.claim(this.req, this.rules);
    if (release === undefined) return false;
    this.#releaseUpload = release;
    return true;
  }

  /** The verdict is in: answer 429, or forward; nothing when the client left while it was pending. */
  followVerdict(verdict: ProxyVerdict): void {
    const { req, res } = this;
    const metrics = this.#context.metrics;
    if (this.#clientGone) {
      metrics.request(this.#context.connections.clientGoneOutcome(req));
      return;
    }
    if (verdict.repeatedHeader !== undefined) {
      metrics.request('bad_request');
      if (hasBody(req) && !this.#expectContinue) res.setHeader('connection', 'close');
      sendJson(res, 400, repeatedHeaderBody(verdict.repeatedHeader));
      return;
    }
    const limitHeaders = verdict.visible.length === 0 ? NO_HEADERS : rateLimitHeaders(verdict.visible);
    if (!verdict.allowed) {
      metrics.request('limited');
      // A body we will not read: close the connection instead of draining megabytes.
      if (hasBody(req) && !this.#expectContinue) res.setHeader('connection', 'close');
      const retryAfter = limitHeaders['Retry-After'] ?? '1';
      sendJson(res, 429, rateLimitedBody(verdict.rejectedBy, Number(retryAfter)), limitHeaders);
      return;
    }
    if (this.#expectContinue) res.writeContinue();
    this.#forward(limitHeaders);
  }

  #forward(limitHeaders: Record<string, string>): void {
    const { req, rules } = this;
    const config = this.#context.upstream.config;
    const server = rules.rules.server;
    this.#headers = forwardedRequestHeaders(req, rules, config.preserveHost);
    this.#limitHeaders = limitHeaders;
    this.#forwarded = true;
    if (!hasBody(req)) {
      this.#toUpstream();
      return;
    }
    const body = new RequestBody(req, this, {
      idleTimeoutMs: server.bodyTimeoutMs,
      sendTimeoutMs: config.sendTimeoutMs,
      minBytesPerSec: server.bodyMinBytesPerSec,
      minRateGraceMs: server.bodyMinRateGraceMs,
    });
    this.#body = body;
    if (!readsAhead(req, server.bufferBodyBytes)) {
      this.#toUpstream();
      return;
    }
    // A client that goes away rejects it: `closed` counts that.
    body.readAhead(server.bufferBodyBytes).then((whole) => this.#readAhead(whole), noop);
  }

  /**
   * Read ahead before taking a connection: the whole body (sent as one buffer), or its first
   * `server.bufferBodyBytes` and more to come (streamed). Nothing when answered meanwhile.
   */
  #readAhead(whole: Buffer | undefined): void {
    if (this.#outcome !== undefined || this.#clientGone) return;
    if (whole !== undefined) {
      this.#body = null;
      this.#bufferedBody = whole;
    }
    this.#toUpstream();
  }

  /** To the pool, or its queue: the headers deadline starts now. */
  #toUpstream(): void {
    const upstream = this.#context.upstream;
    const config = upstream.config;
    this.#forwardedMs = performance.now();
    this.#headersTimeoutMs = config.headersTimeoutMs;
    if (this.#headersTimeoutMs > 0)
      this.#deadline = setTimeout(headersDeadline, this.#headersTimeoutMs, this);
    if (upstream.queue.hasRoom()) this.#dispatch();
    else if (upstream.queue.isFull(config.maxQueued)) this.#refuseQueueFull();
    else upstream.queue.wait(this);
  }

  /** Not answered (timed out, client gone) while it waited in the upstream queue. */
  get wanted(): boolean {
    return this.#outcome === undefined;
  }

  /** A pooled connection is free for it, out of the upstream queue: dispatched. */
  connectionFree(): void {
    // Its deadline is due, its timer not yet run (timers due together run one after another, and
    // this runs between them): dispatched, it would be aborted as it gets its connection.
    if (this.#headersTimeoutMs > 0 && performance.now() - this.#forwardedMs >= this.#headersTimeoutMs - 1) {
      clearTimeout(this.#deadline);
      this.headersTimedOut();
      return;
    }
    this.#dispatch();
  }

  /** To the pool, which has a connection free for it (or is opening one). */
  #dispatch(): void {
    const upstream = this.#context.upstream;
    upstream.queue.take();
    this.#inPool = true;
    try {
      upstream.dispatch(
        {
          path: this.target,
          method: this.req.method as Dispatcher.HttpMethod,
          headers: this.#headers,
          // Dispatcher.md lists async iterables among request bodies; the type declarations do not.
          body: this.#bufferedBody ?? (this.#body as unknown as Dispatcher.DispatchOptions['body']),
          headersTimeout: this.#headersTimeoutMs,
          bodyTimeout: upstream.config.bodyTimeoutMs,
        },
        this,
      );
    } catch (error) {
      // undici reports failures through onResponseError; a throw here is a bug: a 500, not a crash.
      this.#releaseConnection();
      this.#settle('upstream_error');
      this.failed(error);
    }
  }

  /** Every pooled connection busy and the queue full: 503, the request never sent. */
  #refuseQueueFull(): void {
    this.#settle('upstream_queue_full');
    this.#closeAfterResponse();
    const message = this.#context.upstream.queueFullMessage();
    sendJson(this.res, 503, { error: 'upstream_queue_full', message }, this.#limitHeaders);
  }

  /** undici is done with the request (ended, failed or aborted): its connection takes the next one waiting. */
  #releaseConnection(): void {
    if (!this.#inPool) return;
    this.#inPool = false;
    this.#context.upstream.queue.release();
  }

  /** The headers deadline passed: 504, whether the request is still queued or on a connection. */
  headersTimedOut(): void {
    this.#deadline = undefined;
    if (this.#outcome !== undefined || this.#headersWaitOver) return;
    const queued = this.#controller === undefined;
    // Time queued is the pool's, not the upstream's: not a headers wait.
    if (queued) this.#headersWaitOver = true;
    else this.#recordHeadersWait();
    const upstream = this.#context.upstream.config;
    const failure = headersTimeoutFailure('request', queued, this.#headersTimeoutMs, upstream);
    this.#settle(failure.outcome);
    // Still in the queue: skipped there. Handed to the pool but not yet on a connection (one being
    // opened): dropped in onRequestStart, before anything is written, at the cost of that connection.
    this.#controller?.abort(new ExchangeAbortError(failure.message));
    this.#closeAfterResponse();
    sendJson(
      this.res,
      failure.status,
      { error: failure.outcome, message: failure.message },
      this.#limitHeaders,
    );
  }

  /** The request body was sent whole: the wait for headers resumes with what is left of the deadline. */
  bodySent(): void {
    this.#sentMs = performance.now();
    if (this.#outcome !== undefined || this.#headersWaitOver || this.#headersTimeoutMs === 0) return;
    const leftMs = this.#headersTimeoutMs - (this.#connectedMs - this.#forwardedMs);
    this.#deadline = setTimeout(headersDeadline, Math.max(1, leftMs), this);
  }

  /** No request body bytes for `timeoutMs` while undici waited for them: 408, or a cut response. */
  bodyIdle(timeoutMs: number): void {
    // The client is the stalled side: nothing to read and drop after the answer.
    this.#bodyStalled('client_timeout', 408, `no request body bytes for ${timeoutMs} ms`, false);
  }

  /** The request body came slower than `server.bodyMinBytesPerSec`: 408, or a cut response. */
  bodyTooSlow(receivedBytes: number, waitedMs: number, minBytesPerSec: number): void {
    this.#bodyStalled(
      'client_timeout',
      408,
      `the request body came slower than ${minBytesPerSec} bytes/s: ${receivedBytes} bytes in ${Math.round(waitedMs)} ms`,
      false,
    );
  }

  /** The upstream took no request body bytes for `timeoutMs`: 504, or a cut response. */
  bodyStuckUpstream(timeoutMs: number): void {
    this.#bodyStalled(
      'upstream_timeout',
      504,
      `upstream took no request body bytes for ${timeoutMs} ms`,
      true,
    );
  }

  /**
   * The request body stalled on one side: the upstream request is aborted and the client gets
   * `status` with `Connection: close`, or a cut response once one started. `drainRest`: the rest
   * of the body is read and dropped after the answer (`closeAfterResponse`).
   */
  #bodyStalled(
    outcome: 'client_timeout' | 'upstream_timeout',
    status: 408 | 504,
    message: string,
    drainRest: boolean,
  ): void {
    if (this.#outcome !== undefined) return;
    this.#settle(outcome);
    const res = this.res;
    if (res.headersSent) {
      res.destroy();
    } else {
      if (drainRest) this.#closeAfterResponse();
      else res.setHeader('connection', 'close');
      sendJson(res, status, { error: outcome, message }, this.#limitHeaders);
    }
    this.#controller?.abort(new ExchangeAbortError(message));
  }

  /**
   * This response is the connection's last (`Connection: close`). When the request body is not
   * all read, the rest is read and dropped after the response, bounded (`lingeringClose`), so
   * the connection neither stalls on an unread upload nor resets before the client has read
   * the response.
   */
  #closeAfterResponse(): void {
    const { req, res } = this;
    if (!res.headersSent) res.setHeader('connection', 'close');
    if (this.#body !== null && !req.complete) lingeringClose(req, this.rules.rules.server.bodyTimeoutMs);
  }

  /**
   * `spillway_proxy_upstream_headers_seconds`: how long the upstream took to answer, from the
   * whole request sent (the connection taken, when it answers before the body is all sent) to
   * its headers or its deadline. Neither time queued for a connection nor the client's upload
   * pace counts, and a request that fails otherwise (client gone, body timeout, upstream
   * error) records nothing.
   */
  #recordHeadersWait(): void {
    this.#headersWaitOver = true;
    const fromMs = this.#sentMs === 0 ? this.#connectedMs : this.#sentMs;
    this.#context.metrics.upstreamHeadersSeconds((performance.now() - fromMs) / 1000);
  }

  /** Deciding or forwarding threw: a 500, or a cut response once headers are out. */
  failed(error: unknown): void {
    this.#context.logger?.error(
      { err: error instanceof Error ? error.message : String(error) },
      'proxy: request failed',
    );
    if (!this.res.headersSent)
      sendJson(this.res, 500, { error: 'internal_error', message: 'the proxy failed' });
    else this.res.destroy();
  }

  #settle(outcome: ProxyOutcome): void {
    if (this.#outcome !== undefined) return;
    this.#outcome = outcome;
    this.#releaseUpload();
    this.#context.metrics.request(outcome);
    clearTimeout(this.#deadline);
    if (this.queued) this.#context.upstream.queue.abandon();
    this.#body?.stop();
  }

  /**
   * `res` closed: the response is complete, or the client went away: before its verdict (then
   * `followVerdict` forwards nothing) or while forwarded (abort upstream).
   */
  closed(): void {
    const connections = this.#context.connections;
    if (!connections.closed(this)) return;
    this.#releaseUpload();
    if (this.#outcome !== undefined) return;
    if (this.res.writableFinished) {
      if (this.#forwarded) this.#settle('forwarded');
      return;
    }
    this.#clientGone = true;
    if (!this.#forwarded) return;
    // Not yet on a connection: skipped in the queue, or aborted in onRequestStart when it gets one.
    if (!this.#upstreamEnded) this.#controller?.abort(new ExchangeAbortError(CLIENT_GONE));
    this.#settle(connections.clientGoneOutcome(this.req));
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    // Answered while it was queued (the client left, or the deadline passed): never sent.
    if (this.#outcome !== undefined) {
      controller.abort(new ExchangeAbortError(`answered while queued (${this.#outcome})`));
      return;
    }
    this.#connectedMs = performance.now();
    if (this.#body === null) this.#sentMs = this.#connectedMs;
    else clearTimeout(this.#deadline);
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders,
  ): void {
    // 1xx informational responses are not relayed (Node answers the client's 100-continue itself).
    if (statusCode < 200) return;
    clearTimeout(this.#deadline);
    this.#context.upstreamHealth.answered();
    this.#recordHeadersWait();
    this.#body?.responseStarted();
    const res = this.res;
    const responseHeaders = clientResponseHeaders(headers);
    addRateLimitFields(responseHeaders, this.#limitHeaders);
    // The upstream answers before it has the whole body (a 413, a 401, an echo): the rest of
    // the upload has to be read before this connection could carry another request.
    if (this.#body !== null && !this.req.complete) this.#closeAfterResponse();
    try {
      res.writeHead(statusCode, responseHeaders);
    } catch (error) {
      // An upstream header Node refuses to send (invalid characters): a broken upstream reply.
      this.#settle('upstream_error');
      controller.abort(error as Error);
      sendJson(res, 502, {
        error: 'upstream_error',
        message: `invalid upstream response: ${(error as Error).message}`,
      });
    }
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#outcome !== undefined) return;
    if (!this.res.write(chunk)) {
      controller.pause();
      const timeoutMs = this.rules.rules.server.sendTimeoutMs;
      const stalled = timeoutMs > 0 ? setTimeout(responseStalledFired, timeoutMs, this) : undefined;
      this.res.once('drain', () => {
        clearTimeout(stalled);
        controller.resume();
      });
    }
  }

  /** The client took no response bytes for `server.sendTimeoutMs`: the response is cut. */
  responseStalled(): void {
    if (this.#outcome !== undefined) return;
    this.#settle('client_timeout');
    this.res.destroy();
    this.#controller?.abort(new ExchangeAbortError('the client stopped reading the response'));
  }

  onResponseEnd(): void {
    this.#releaseConnection();
    this.#upstreamEnded = true;
    if (this.#outcome === undefined) this.res.end();
  }

  onResponseError(_controller: Dispatcher.DispatchController | undefined, error: Error): void {
    this.#releaseConnection();
    if (this.#outcome !== undefined) return;
    const res = this.res;
    // A request read whole is destroyed once it ends (Node's autoDestroy): its client is still there.
    if (this.#clientGone || res.destroyed || (this.req.destroyed && !this.req.complete)) {
      this.#settle(this.#context.connections.clientGoneOutcome(this.req));
      return;
    }
    if (res.headersSent) {
      // The upstream body failed mid-way: the client sees a cut response.
      this.#settle('upstream_error');
      res.destroy();
      return;
    }
    const failure = describeUpstreamFailure(error, this.#context.upstream.config);
    this.#context.upstreamHealth.failed(failure);
    this.#settle(failure.outcome);
    this.#closeAfterResponse();
    sendJson(res, failure.status, { error: failure.outcome, message: failure.message }, this.#limitHeaders);
  }
}

function noop(): void {}

function headersDeadline(exchange: Exchange): void {
  exchange.headersTimedOut();
}

function responseStalledFired(exchange: Exchange): void {
  exchange.responseStalled();
}
