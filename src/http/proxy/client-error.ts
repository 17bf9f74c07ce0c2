import { type IncomingMessage, maxHeaderSize, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ProxyOutcome } from './proxy-metrics.js';
import { writeRawResponse } from './raw-response.js';

/** What a request Node's server gave up on is counted as. */
export type ClientErrorOutcome = Extract<ProxyOutcome, 'client_timeout' | 'bad_request'>;

/** A request the proxy was handed, and its response. */
export interface ClientExchange {
  req: IncomingMessage;
  res: ServerResponse;
}

export interface ClientErrorListenerOptions {
  /** Node's bounds on receiving a request, as the server has them now (rules reloads change them). */
  timeouts(): { headersTimeoutMs: number; requestTimeoutMs: number };
  /** The last request the proxy was handed on this connection, if any. */
  lastExchange(socket: Duplex): ClientExchange | undefined;
  /** A request that never reached the proxy's handlers was answered here (or could not be): count it. */
  count(outcome: ClientErrorOutcome): void;
  /**
   * The connection of a request that reached the proxy, its response not complete, is being cut
   * for `outcome`: that request counts `outcome` instead of `client_abort`, once, when it closes.
   */
  cut(socket: Duplex, outcome: ClientErrorOutcome): void;
}

interface ClientErrorAnswer {
  status: 400 | 408 | 413 | 431;
  outcome: ClientErrorOutcome;
  message: string;
}

/**
 * The HTTP server's `clientError` listener. Without one, Node answers a request its parser rejects
 * (`HPE_*`) or whose `headersTimeout` / `requestTimeout` expired with a bare status line of its
 * own (400, 431, 413, 408, no body) that no metric counts; with one, Node writes nothing and
 * leaves the socket to the listener. This one answers as the proxy answers everything else, a
 * JSON body whose `error` is the `spillway_proxy_requests_total` outcome it is counted as, with
 * `Connection: close`, and never throws (an exception here would be uncaught: the process exits).
 *
 * - `ERR_HTTP_REQUEST_TIMEOUT`: `408`, `client_timeout`.
 * - `HPE_HEADER_OVERFLOW` (headers over `http.maxHeaderSize`): `431`; `HPE_CHUNK_EXTENSIONS_OVERFLOW`:
 *   `413`, as Node answers it; any other `HPE_*`: `400`. All `bad_request`.
 * - `HPE_INVALID_EOF_STATE` (the client ended its side mid-request), `ECONNRESET` and any other
 *   socket error: the client is gone or leaving, there is no request to judge and nobody to
 *   answer. The socket is destroyed and nothing is counted here; a request on it that reached
 *   the proxy counts `client_abort`, as any client that leaves does.
 *
 * Whose error it is: the last request the proxy was handed on the connection while its body is
 * still arriving (its headers were complete, so a timeout is `requestTimeout`'s), else a new
 * request Node had not handed over (so `headersTimeout` unless only `requestTimeout` is set). A
 * request the proxy already answered whose leftover body then fails was counted when answered:
 * nothing more is counted or written. (Node's `socket._httpMessage`, which its own default
 * answer reads, is cleared once a response finishes, while that request's body may still be
 * arriving, and is set for a pipelined request the error does not belong to.)
 *
 * Nothing is written while an earlier request on the connection is unanswered or mid-response:
 * the client matches responses to requests in order, so the answer would pass for that request's
 * (or land inside it). The socket is then only destroyed, and that request counts `client_abort`.
 */
export function createClientErrorListener(
  options: ClientErrorListenerOptions,
): (error: Error, socket: Duplex) => void {
  return (error, socket) => {
    try {
      answerClientError(error, socket, options);
    } catch {
      socket.destroy();
    }
  };
}

function answerClientError(error: Error, socket: Duplex, options: ClientErrorListenerOptions): void {
  // Ended already: by this listener on an earlier error (a parser that failed reports again on
  // every chunk that follows), or by the proxy (`lingeringClose`, a raw response). Whoever ended it
  // destroys it once the peer has had time to read what was sent; destroying it now could reset
  // the connection before it has.
  if (socket.destroyed || socket.writableEnded) return;
  const last = options.lastExchange(socket);
  const arriving = last !== undefined && !last.req.complete ? last : undefined;
  const answer = describeClientError(error, options.timeouts(), arriving !== undefined);
  if (answer === undefined || arriving?.res.writableEnded) {
    socket.destroy();
    return;
  }
  if (arriving) options.cut(socket, answer.outcome);
  else options.count(answer.outcome);
  // Its own response not started (the request arriving), or every earlier one finished.
  const mayAnswer = arriving ? !arriving.res.headersSent : last === undefined || last.res.writableFinished;
  if (!socket.writable || !mayAnswer) {
    socket.destroy();
    return;
  }
  writeRawResponse(socket, answer.status, {}, { error: answer.outcome, message: answer.message });
}

function describeClientError(
  error: Error,
  timeouts: { headersTimeoutMs: number; requestTimeoutMs: number },
  headersComplete: boolean,
): ClientErrorAnswer | undefined {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    return { status: 408, outcome: 'client_timeout', message: timeoutMessage(timeouts, headersComplete) };
  }
  if (code === undefined || !code.startsWith('HPE_') || code === 'HPE_INVALID_EOF_STATE') return undefined;
  if (code === 'HPE_HEADER_OVERFLOW') {
    return {
      status: 431,
      outcome: 'bad_request',
      message: `the request headers are larger than ${maxHeaderSize} bytes`,
    };
  }
  if (code === 'HPE_CHUNK_EXTENSIONS_OVERFLOW') {
    return {
      status: 413,
      outcome: 'bad_request',
      message: 'the chunk extensions of the request body are too large',
    };
  }
  // llhttp's description of what it could not parse, a fixed string (never the client's bytes).
  const reason = (error as { reason?: unknown }).reason;
  return {
    status: 400,
    outcome: 'bad_request',
    message: `the request could not be parsed: ${typeof reason === 'string' ? `${reason} (${code})` : code}`,
  };
}

/**
 * Which bound expired. Node runs both from the start of the request: `headersTimeout` only until
 * the headers are complete (the request then reaches the proxy), `requestTimeout` until the whole
 * request is in.
 */
function timeoutMessage(
  { headersTimeoutMs, requestTimeoutMs }: { headersTimeoutMs: number; requestTimeoutMs: number },
  headersComplete: boolean,
): string {
  const requestBound =
    requestTimeoutMs > 0 &&
    (headersComplete || headersTimeoutMs === 0 || requestTimeoutMs < headersTimeoutMs);
  return requestBound
    ? `no complete request within ${requestTimeoutMs} ms`
    : `no complete request headers within ${headersTimeoutMs} ms`;
}
