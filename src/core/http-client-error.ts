import { type IncomingMessage, maxHeaderSize, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { type RawResponse, writeRawResponse } from './raw-response.js';

/**
 * How often Node checks `server.headersTimeout` and `server.requestTimeout`, for every Spillway
 * HTTP server (createServer's `connectionsCheckingInterval`). Node's default, 30 s, let a client
 * trickling its headers (slowloris) hold a connection for the bound plus up to 30 s; each second,
 * the bounds hold within a second. The sweep visits only connections with a request in progress.
 */
export const TIMEOUT_SWEEP_MS = 1_000;

/** A request Node's server gave up on, as a status and a message a client can act on. */
export interface ClientFailure {
  /**
   * `408`: not in within `headersTimeout` / `requestTimeout`; `431`: headers over
   * `http.maxHeaderSize`; `413`: chunk extensions too large; `400`: any other parse error.
   */
  status: 400 | 408 | 413 | 431;
  message: string;
}

/** A request a server's handlers were handed, and its response. */
export interface ClientExchange {
  req: IncomingMessage;
  res: ServerResponse;
}

export interface ClientErrorOptions {
  /** The failure as this server words its errors: a whole response, written with `Connection: close`. */
  respond(failure: ClientFailure): RawResponse;
  /**
   * The last request the server's handlers were handed on this connection, if any. Default: the
   * last `request` event's, tracked here; a server that tracks its own (and hands some requests
   * elsewhere, `checkContinue`) says which.
   */
  lastExchange?(socket: Duplex): ClientExchange | undefined;
  /** A request that never reached the server's handlers was answered here (or could not be). */
  failed?(failure: ClientFailure): void;
  /**
   * The connection of a request that reached the handlers, its response not complete, is being
   * cut for `failure`: the handlers see it close, and may count it as this rather than as a client
   * that left.
   */
  cut?(socket: Duplex, failure: ClientFailure): void;
}

/**
 * Makes `server` answer, as it answers everything else, the requests Node's HTTP server gives up
 * on before its handlers see them whole. Without a `clientError` listener, Node answers a request
 * its parser rejects (`HPE_*`) or whose `headersTimeout` / `requestTimeout` expired with a bare
 * status line of its own (400, 431, 413, 408, no body); with one, Node writes nothing and leaves
 * the socket to the listener. This listener writes `options.respond`'s response, with
 * `Connection: close`, and never throws (an exception here would be uncaught: the process exits).
 *
 * - `ERR_HTTP_REQUEST_TIMEOUT`: `408`.
 * - `HPE_HEADER_OVERFLOW` (headers over `http.maxHeaderSize`): `431`; `HPE_CHUNK_EXTENSIONS_OVERFLOW`:
 *   `413`, as Node answers it; any other `HPE_*`: `400`.
 * - `HPE_INVALID_EOF_STATE` (the client ended its side mid-request), `ECONNRESET` and any other
 *   socket error: the client is gone or leaving, there is no request to judge and nobody to
 *   answer. The socket is destroyed and nothing is reported; a request on it that reached the
 *   handlers sees its client leave, as when any client leaves.
 *
 * Whose error it is: the last request the handlers were handed on the connection while its body
 * is still arriving (its headers were complete, so a timeout is `requestTimeout`'s), else a new
 * request Node had not handed over (so `headersTimeout` unless only `requestTimeout` is set). A
 * request already answered whose leftover body then fails was answered once: nothing more is
 * reported or written. (Node's `socket._httpMessage`, which its own default answer reads, is
 * cleared once a response finishes, while that request's body may still be arriving, and is set
 * for a pipelined request the error does not belong to.)
 *
 * Nothing is written while an earlier request on the connection is unanswered or mid-response:
 * the client matches responses to requests in order, so the answer would pass for that request's
 * (or land inside it). The socket is then only destroyed.
 */
export function answerClientErrors(server: Server, options: ClientErrorOptions): void {
  let lastExchange = options.lastExchange;
  if (lastExchange === undefined) {
    const last = new WeakMap<Duplex, ClientExchange>();
    server.on('request', (req: IncomingMessage, res: ServerResponse) => last.set(req.socket, { req, res }));
    lastExchange = (socket) => last.get(socket);
  }
  const tracked = { ...options, lastExchange };
  server.on('clientError', (error: Error, socket: Duplex) => {
    try {
      answerClientError(server, error, socket, tracked);
    } catch {
      socket.destroy();
    }
  });
}

/**
 * RFC 9112 §3.2: a server MUST answer `400` to an HTTP/1.1 request without `Host` (HTTP/1.0 may
 * omit it). Node's `requireHostHeader` answers it with a bare `400` before any handler runs;
 * Spillway's servers turn that off and ask this, so the answer is theirs. Read as "1.1 or later":
 * llhttp also takes `HTTP/2.0` in a request line, and no version after 1.0 may omit `Host`.
 * Undefined when the request may go on.
 */
export function missingHost(req: IncomingMessage): ClientFailure | undefined {
  if (req.headers.host !== undefined) return undefined;
  if (req.httpVersionMajor < 1 || (req.httpVersionMajor === 1 && req.httpVersionMinor < 1)) return undefined;
  return { status: 400, message: 'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)' };
}

function answerClientError(
  server: Server,
  error: Error,
  socket: Duplex,
  options: ClientErrorOptions & Required<Pick<ClientErrorOptions, 'lastExchange'>>,
): void {
  // Ended already: by this listener on an earlier error (a parser that failed reports again on
  // every chunk that follows), or by the server (a lingering close, a raw response). Whoever ended
  // it destroys it once the peer has had time to read what was sent; destroying it now could reset
  // the connection before it has.
  if (socket.destroyed || socket.writableEnded) return;
  const last = options.lastExchange(socket);
  const arriving = last !== undefined && !last.req.complete ? last : undefined;
  const failure = describeClientError(error, server, arriving !== undefined);
  if (failure === undefined || arriving?.res.writableEnded) {
    socket.destroy();
    return;
  }
  if (arriving) options.cut?.(socket, failure);
  else options.failed?.(failure);
  // Its own response not started (the request arriving), or every earlier one finished.
  const mayAnswer = arriving ? !arriving.res.headersSent : last === undefined || last.res.writableFinished;
  if (!socket.writable || !mayAnswer) {
    socket.destroy();
    return;
  }
  writeRawResponse(socket, options.respond(failure));
}

function describeClientError(
  error: Error,
  server: Server,
  headersComplete: boolean,
): ClientFailure | undefined {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    return { status: 408, message: timeoutMessage(server, headersComplete) };
  }
  if (code === undefined || !code.startsWith('HPE_') || code === 'HPE_INVALID_EOF_STATE') return undefined;
  if (code === 'HPE_HEADER_OVERFLOW') {
    return { status: 431, message: `the request headers are larger than ${maxHeaderSize} bytes` };
  }
  if (code === 'HPE_CHUNK_EXTENSIONS_OVERFLOW') {
    return { status: 413, message: 'the chunk extensions of the request body are too large' };
  }
  // llhttp's description of what it could not parse, a fixed string (never the client's bytes).
  const reason = (error as { reason?: unknown }).reason;
  return {
    status: 400,
    message: `the request could not be parsed: ${typeof reason === 'string' ? `${reason} (${code})` : code}`,
  };
}

/**
 * Which bound expired. Node runs both from the start of the request: `headersTimeout` only until
 * the headers are complete (the request then reaches the handlers), `requestTimeout` until the
 * whole request is in. Read when the error comes: a server may change them while it runs.
 */
function timeoutMessage(server: Server, headersComplete: boolean): string {
  const { headersTimeout, requestTimeout } = server;
  const requestBound =
    requestTimeout > 0 && (headersComplete || headersTimeout === 0 || requestTimeout < headersTimeout);
  return requestBound
    ? `no complete request within ${requestTimeout} ms`
    : `no complete request headers within ${headersTimeout} ms`;
}
