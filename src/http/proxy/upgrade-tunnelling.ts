import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Dispatcher } from 'undici';
import { requestHeadFault } from '../../server/http-client-error.js';
import { rateLimitHeaders } from '../rate-limit-headers.js';
import { rateLimitedBody } from '../rate-limited-response.js';
import { type ActiveRules, forwardedRequestHeaders } from './active-rules.js';
import type { ProxyContext } from './proxy-context.js';
import { repeatedHeaderBody, requestTarget, sendRawJson } from './proxy-responses.js';
import type { ProxyVerdict } from './request-decision.js';
import { headerValue } from './request-facts.js';
import { joinTunnel, type Tunnel } from './tunnel.js';
import {
  refusedUpgrade,
  switchedAsRequested,
  upgradeMembers,
  upgradeRefusalBody,
} from './upgrade-protocols.js';
import {
  CLIENT_GONE,
  describeUpstreamFailure,
  ExchangeAbortError,
  headersTimeoutFailure,
} from './upstream-failure.js';
import type { ConnectionWaiter, UpstreamQueue } from './upstream-queue.js';
import { switchingProtocolsHead, type UpgradeAnswer, UpstreamUpgrade } from './upstream-upgrade.js';

/** The client connections Node handed over for an upgrade, and the tunnels among them: what a drain waits for. */
export class UpgradedConnections {
  /**
   * Until they close: being decided, waiting for the upstream's 101, or tunnels. The server's
   * `closeAllConnections` no longer reaches them.
   */
  readonly #sockets = new Set<Duplex>();
  readonly #tunnels = new Set<Tunnel>();
  /** Set while a graceful stop waits for the last tunnel to close. */
  #lastTunnelClosed: (() => void) | undefined;

  hold(socket: Duplex): void {
    this.#sockets.add(socket);
  }

  release(socket: Duplex): void {
    this.#sockets.delete(socket);
  }

  joinTunnel(client: Duplex, upstream: Duplex, idleTimeoutMs: number): void {
    const tunnel = joinTunnel(client, upstream, idleTimeoutMs, () => {
      this.#tunnels.delete(tunnel);
      if (this.#tunnels.size === 0) this.#lastTunnelClosed?.();
    });
    this.#tunnels.add(tunnel);
  }

  /** Resolves once no tunnel is open, whichever side closes the last one. */
  tunnelsClosed(): Promise<void> {
    return new Promise<void>((resolve) => {
      if (this.#tunnels.size === 0) resolve();
      else this.#lastTunnelClosed = resolve;
    });
  }

  /** Cuts every connection handed over for an upgrade, tunnels and their upstream sides included. */
  destroyAll(): void {
    for (const socket of this.#sockets) socket.destroy();
    for (const tunnel of this.#tunnels) tunnel.destroy();
  }
}

/**
 * An upgrade request (WebSocket): decided as any request, then sent upstream on a pooled
 * connection; the upstream's `101` joins the client and upstream sockets in a tunnel, any other
 * answer is relayed (`UpstreamUpgrade`).
 */
export function serveUpgrade(
  context: ProxyContext,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
): Promise<void> {
  return new UpgradeRequest(context, req, socket, head).serve();
}

/**
 * An upgrade waiting in the upstream queue: until its upstream answers 101 (undici then detaches
 * the socket from the pool), an upgrade holds a pooled connection like any request, so it waits
 * for one in the same queue, under the same deadline.
 */
class QueuedUpgrade implements ConnectionWaiter {
  readonly gotConnection: Promise<void>;
  queued = false;
  #resolve: () => void = () => {};
  readonly #queue: UpstreamQueue;
  readonly #signal: AbortSignal;
  readonly #timeoutMs: number;
  readonly #queuedMs = performance.now();

  /** `timeoutMs`: its deadline, running since now (0: none). */
  constructor(queue: UpstreamQueue, signal: AbortSignal, timeoutMs: number) {
    this.#queue = queue;
    this.#signal = signal;
    this.#timeoutMs = timeoutMs;
    this.gotConnection = new Promise((resolve) => {
      this.#resolve = resolve;
    });
    signal.addEventListener(
      'abort',
      () => {
        if (this.queued) queue.abandon();
      },
      { once: true },
    );
  }

  /** Its client left or its deadline passed while it waited: it takes no connection. */
  get wanted(): boolean {
    return !this.#signal.aborted;
  }

  connectionFree(): void {
    // Its deadline is due, its timer not yet run: it would be aborted as it gets its connection.
    if (this.#timeoutMs > 0 && performance.now() - this.#queuedMs >= this.#timeoutMs - 1) return;
    this.#queue.take();
    this.#resolve();
  }
}

/**
 * One upgrade, from Node handing its socket over to a tunnel, a relayed answer or the proxy's own
 * answer. The socket counts in flight, and a drain waits for it, until it closes.
 */
class UpgradeRequest {
  readonly #context: ProxyContext;
  readonly #req: IncomingMessage;
  readonly #socket: Duplex;
  /** Bytes the client sent after its request, for the upstream. */
  readonly #head: Buffer;
  readonly #rules: ActiveRules;
  /** The protocols its `Upgrade` field asks for, in lower case. */
  readonly #requested: string[];
  /** Aborted when the client leaves before the tunnel is joined, or the deadline passes. */
  readonly #abort = new AbortController();
  #released = false;
  /** The deadline for a pooled connection and the upstream's answer passed. */
  #timedOut = false;
  #holdsConnection = false;
  readonly #release = (): void => {
    if (this.#released) return;
    this.#released = true;
    this.#context.upgrades.release(this.#socket);
    this.#context.connections.countInFlight(-1);
  };
  readonly #clientLeft = (): void => this.#abort.abort(new ExchangeAbortError(CLIENT_GONE));
  readonly #readForEnd = (): void => {
    this.#socket.read(0);
  };

  constructor(context: ProxyContext, req: IncomingMessage, socket: Duplex, head: Buffer) {
    this.#context = context;
    this.#req = req;
    this.#socket = socket;
    this.#head = head;
    context.connections.countInFlight(1);
    context.upgrades.hold(socket);
    socket.once('close', this.#release);
    socket.on('error', () => socket.destroy());
    // A client that leaves before the tunnel is joined: server sockets are half-open, so one that
    // goes away may only end its side; 'end' is seen only while the socket is read. `read(0)`
    // consumes nothing: bytes the client sends after its request stay buffered for the tunnel.
    socket.on('readable', this.#readForEnd);
    socket.once('end', this.#clientLeft);
    socket.once('close', this.#clientLeft);
    this.#rules = context.rules;
    this.#requested = upgradeMembers(headerValue(req, 'upgrade'));
  }

  async serve(): Promise<void> {
    try {
      const target = this.#soundTarget();
      if (target === undefined) return;
      const pending = this.#context.decider.decide(this.#rules, this.#req);
      const verdict = pending instanceof Promise ? await pending : pending;
      const limitHeaders = this.#allowedBy(verdict);
      if (limitHeaders !== undefined) await this.#forward(target, limitHeaders);
    } catch (error) {
      this.#context.logger?.error(
        { err: error instanceof Error ? error.message : String(error) },
        'proxy: upgrade failed',
      );
      this.#socket.destroy();
      this.#release();
    }
  }

  #stopWatchingClient(): void {
    this.#socket.off('readable', this.#readForEnd);
    this.#socket.off('end', this.#clientLeft);
    this.#socket.off('close', this.#clientLeft);
  }

  /** The target to forward, or undefined once the upgrade was refused (answered or cut). */
  #soundTarget(): string | undefined {
    const { metrics, connections, lifecycle } = this.#context;
    const socket = this.#socket;
    // Pipelined behind a request still unanswered on this connection: any answer now would pass
    // for that request's (Node hands an upgrade over at once). Nothing is written, the connection
    // closes, as for a parse error there (`answerClientErrors`); that request counts client_abort.
    if (connections.hasResponsePending(socket)) {
      metrics.request('bad_request');
      socket.destroy();
      return undefined;
    }
    const target = requestTarget(this.#req);
    const draining = lifecycle.draining;
    if (draining || target === undefined) {
      metrics.request(draining ? 'draining' : 'bad_request');
      sendRawJson(socket, draining ? 503 : 400, {}, { error: draining ? 'draining' : 'bad_request' });
      return undefined;
    }
    // Node never required it of an upgrade (`requireHostHeader` checks plain requests only).
    const headFault = requestHeadFault(this.#req);
    if (headFault !== undefined) {
      metrics.request('bad_request');
      sendRawJson(socket, headFault.status, {}, { error: 'bad_request', message: headFault.message });
      return undefined;
    }
    // Before any bucket is decided: a refused upgrade spends nothing.
    const tunnels = this.#rules.rules.server.upgradeProtocols;
    const refused = refusedUpgrade(this.#requested, tunnels);
    if (refused !== undefined) {
      metrics.request('upgrade_refused');
      sendRawJson(socket, 501, {}, upgradeRefusalBody(refused, tunnels));
      return undefined;
    }
    return target;
  }

  /** The RateLimit fields of an allowed upgrade, or undefined once it was refused (or its client left). */
  #allowedBy(verdict: ProxyVerdict): Record<string, string> | undefined {
    const metrics = this.#context.metrics;
    const socket = this.#socket;
    if (this.#abort.signal.aborted) {
      metrics.request('client_abort');
      socket.destroy();
      return undefined;
    }
    if (verdict.repeatedHeader !== undefined) {
      metrics.request('bad_request');
      sendRawJson(socket, 400, {}, repeatedHeaderBody(verdict.repeatedHeader));
      return undefined;
    }
    const limitHeaders = rateLimitHeaders(verdict.visible);
    if (!verdict.allowed) {
      metrics.request('limited');
      const retryAfter = Number(limitHeaders['Retry-After'] ?? '1');
      sendRawJson(socket, 429, limitHeaders, rateLimitedBody(verdict.rejectedBy, retryAfter));
      return undefined;
    }
    return limitHeaders;
  }

  /** To the upstream, once a pooled connection is free, under one deadline for it and the answer. */
  async #forward(target: string, limitHeaders: Record<string, string>): Promise<void> {
    const { metrics, upstream } = this.#context;
    const { queue, config } = upstream;
    const signal = this.#abort.signal;
    const headers = forwardedRequestHeaders(this.#req, this.#rules, config.preserveHost);
    // One deadline for a pooled connection and the upstream's answer, as for any request.
    const headersTimeoutMs = config.headersTimeoutMs;
    const deadline =
      headersTimeoutMs > 0
        ? setTimeout(() => {
            this.#timedOut = true;
            this.#abort.abort(new ExchangeAbortError('upgrade deadline'));
          }, headersTimeoutMs)
        : undefined;
    // undici acts on the abort only once the upgrade has a connection (one being opened may
    // take a while): the client's answer cannot wait for it.
    const abandoned = new Promise<undefined>((resolve) =>
      signal.addEventListener('abort', () => resolve(undefined), { once: true }),
    );
    if (queue.hasRoom()) {
      queue.take();
      this.#holdsConnection = true;
    } else if (queue.isFull(config.maxQueued)) {
      clearTimeout(deadline);
      this.#stopWatchingClient();
      metrics.request('upstream_queue_full');
      const message = upstream.queueFullMessage();
      sendRawJson(this.#socket, 503, limitHeaders, { error: 'upstream_queue_full', message });
      return;
    } else {
      const waiter = new QueuedUpgrade(queue, signal, headersTimeoutMs);
      queue.wait(waiter);
      await Promise.race([waiter.gotConnection.then(() => (this.#holdsConnection = true)), abandoned]);
    }
    let upgrading: UpstreamUpgrade | undefined;
    let answer: UpgradeAnswer | undefined;
    let failure: unknown;
    if (this.#holdsConnection && !signal.aborted) {
      const sendTimeoutMs = this.#rules.rules.server.sendTimeoutMs;
      upgrading = new UpstreamUpgrade(this.#socket, limitHeaders, signal, sendTimeoutMs);
      // Upgraded (detached), answered whole or failed, undici is done with the pooled connection.
      upgrading.finished.then(() => queue.release());
      upstream.dispatch(
        {
          path: target,
          method: (this.#req.method ?? 'GET') as Dispatcher.HttpMethod,
          headers,
          upgrade: headerValue(this.#req, 'upgrade') ?? 'websocket',
          // Ours runs from the decision, queue time included (above).
          headersTimeout: 0,
          bodyTimeout: config.bodyTimeoutMs,
        },
        upgrading,
      );
      try {
        answer = await Promise.race([upgrading.answer, abandoned]);
      } catch (error) {
        failure = error;
      }
    } else if (this.#holdsConnection) {
      // Its connection came as it was abandoned: the connection goes to the next one waiting.
      queue.release();
    }
    clearTimeout(deadline);
    this.#stopWatchingClient();
    this.#answered(answer, failure, upgrading, limitHeaders, headersTimeoutMs);
  }

  /** What the upstream made of it, for the client: a tunnel, a relayed answer or the proxy's 5xx. */
  #answered(
    answer: UpgradeAnswer | undefined,
    failure: unknown,
    upgrading: UpstreamUpgrade | undefined,
    limitHeaders: Record<string, string>,
    headersTimeoutMs: number,
  ): void {
    const { metrics, upstream } = this.#context;
    const socket = this.#socket;
    if (this.#abort.signal.aborted) {
      // An upgrade that succeeds after all is closed at once (UpstreamUpgrade sees the abort).
      if (this.#timedOut) {
        // Still queued, or handed to the pool with its connection still being opened.
        const queued = upgrading === undefined || !upgrading.connected;
        const timeout = headersTimeoutFailure('upgrade', queued, headersTimeoutMs, upstream.config);
        metrics.request(timeout.outcome);
        sendRawJson(socket, 504, limitHeaders, { error: timeout.outcome, message: timeout.message });
      } else {
        metrics.request('client_abort');
        socket.destroy();
      }
      return;
    }
    if (answer === undefined) {
      const described = describeUpstreamFailure(failure, upstream.config);
      this.#context.upstreamHealth.failed(described);
      metrics.request(described.outcome);
      sendRawJson(socket, described.status, limitHeaders, {
        error: described.outcome,
        message: described.message,
      });
      return;
    }
    this.#context.upstreamHealth.answered();
    // Another answer is on its way to the client (UpstreamUpgrade relays it, then closes).
    if (answer.kind === 'answered') {
      metrics.request('forwarded');
      return;
    }
    const upstreamSocket = answer.socket;
    // A tunnel to a protocol the client did not ask for (and the proxy did not admit) is no tunnel
    // the decision covered.
    if (!switchedAsRequested(answer.headers.upgrade, this.#requested)) {
      upstreamSocket.destroy();
      metrics.request('upstream_error');
      sendRawJson(socket, 502, limitHeaders, {
        error: 'upstream_error',
        message: `upstream switched to a protocol the client did not ask for (${String(answer.headers.upgrade ?? 'none named')})`,
      });
      return;
    }
    metrics.request('forwarded');
    // Header bytes as undici read them (latin1), not re-encoded as UTF-8.
    socket.write(switchingProtocolsHead(answer.headers, limitHeaders), 'latin1');
    if (this.#head.length > 0) upstreamSocket.write(this.#head);
    this.#context.upgrades.joinTunnel(socket, upstreamSocket, this.#rules.rules.server.upgradeIdleTimeoutMs);
  }
}
