import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ClientErrorOptions, ClientFailure } from '../../server/http-client-error.js';
import type { ProxyMetrics, ProxyOutcome } from './proxy-metrics.js';
import { rawJson } from './proxy-responses.js';

/** A request the proxy was handed, until its response closes. */
export interface OpenExchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** Its response closed, or its connection did before it had one. */
  closed(): void;
}

/** What a request Node's server gave up on is counted as. */
type ClientErrorOutcome = Extract<ProxyOutcome, 'client_timeout' | 'bad_request'>;

/** What the proxy keeps per client connection, from its first request on. */
interface ConnectionRecord {
  /** The last request the proxy was handed: whose a `clientError` is. */
  last: OpenExchange;
  /**
   * Requests not yet closed. A pipelined request waiting behind another has a response with no
   * socket yet, which never closes if the connection does: the connection's `close` closes what
   * is left, so each is counted once and leaves the in-flight count.
   */
  open: Set<OpenExchange>;
  /**
   * Set when the `clientError` listener cut the connection while a request on it was in the
   * proxy's hands: that request counts this outcome rather than `client_abort`.
   */
  cut?: ClientErrorOutcome;
}

/**
 * The proxy's client connections: per connection the requests it carries (a record from its first
 * request on, gone with the socket), and across them the count of requests and upgraded
 * connections in flight.
 */
export class ClientConnections {
  readonly #records = new WeakMap<Duplex, ConnectionRecord>();
  readonly #metrics: ProxyMetrics;
  #inFlight = 0;

  constructor(metrics: ProxyMetrics) {
    this.#metrics = metrics;
  }

  /** Requests and upgraded connections being served. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** A request or an upgraded connection starts (1) or ends (-1). */
  countInFlight(delta: number): void {
    this.#inFlight += delta;
    this.#metrics.inFlight(delta);
  }

  /** A request handed over on its connection: the connection's last, open until `closed`. */
  opened(exchange: OpenExchange): void {
    const socket = exchange.req.socket;
    let record = this.#records.get(socket);
    if (record) record.last = exchange;
    else {
      const open = new Set<OpenExchange>();
      record = { last: exchange, open };
      this.#records.set(socket, record);
      socket.once('close', () => {
        for (const left of open) left.closed();
      });
    }
    record.open.add(exchange);
  }

  /** Takes `exchange` out of the in-flight count; false when it was already closed. */
  closed(exchange: OpenExchange): boolean {
    if (!this.#records.get(exchange.req.socket)?.open.delete(exchange)) return false;
    this.countInFlight(-1);
    return true;
  }

  /** Whether a request on `socket` has a response not yet complete (an upgrade behind it may not answer). */
  hasResponsePending(socket: Duplex): boolean {
    const open = this.#records.get(socket)?.open;
    return open !== undefined && [...open].some((earlier) => !earlier.res.writableFinished);
  }

  /** The outcome of a request whose client went away: `client_abort`, unless its connection was cut. */
  clientGoneOutcome(req: IncomingMessage): ProxyOutcome {
    return this.#records.get(req.socket)?.cut ?? 'client_abort';
  }

  /**
   * For `answerClientErrors`: requests Node's parser rejects or its timeout sweep expires are
   * answered and counted as the proxy's other answers are. A request the proxy was handed counts
   * the outcome its connection was cut for, not `client_abort`.
   */
  clientErrorOptions(): ClientErrorOptions {
    const metrics = this.#metrics;
    return {
      respond: (failure) =>
        rawJson(failure.status, {}, { error: clientErrorOutcome(failure), message: failure.message }),
      lastExchange: (socket) => this.#records.get(socket)?.last,
      failed: (failure) => metrics.request(clientErrorOutcome(failure)),
      cut: (socket, failure) => {
        const record = this.#records.get(socket);
        if (record) record.cut = clientErrorOutcome(failure);
      },
    };
  }
}

function clientErrorOutcome(failure: ClientFailure): ClientErrorOutcome {
  return failure.status === 408 ? 'client_timeout' : 'bad_request';
}
