import { type IncomingMessage, maxHeaderSize, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { type RawResponse, writeRawResponse } from './raw-response.js';

/**
 * How often Node checks `server.headersTimeout` and `server.requestTimeout`, for every Spillway
 * HTTP server (createServer's `connectionsCheckingInterval`). Node's default, 30 s, let a client
 * trickling its headers (slowloris) hold a connection for the bound plus up to 30 s; each second,
 * the bounds hold within a second. The sweep visits only connections with a request in progress.
 */
export const TIMEOUT_SWEEP_MS = 1_000;

/** Node's `requestTimeout` default, which a `headersTimeout` may not exceed (createServer throws). */
const NODE_REQUEST_TIMEOUT_MS = 300_000;

/**
 * A server's `headersTimeoutMs` option: a whole number of ms from 1 to Node's `requestTimeout`
 * (300 s), else ERR_SPILLWAY_INVALID_OPTION naming `field` (Node would throw its own RangeError
 * from createServer, or take a fraction). Undefined: Node's default, 60 s.
 */
export function validateHeadersTimeoutMs(value: number | undefined, field: string): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isInteger(value) || value < 1 || value > NODE_REQUEST_TIMEOUT_MS) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `${field} must be a whole number of ms from 1 to ${NODE_REQUEST_TIMEOUT_MS}, got ${String(value)}`,
      { field },
    );
  }
  return value;
}

/** A request Node's server gave up on, as a status and a message a client can act on. */
export interface ClientFailure {
  /**
   * `408`: not in within `headersTimeout` / `requestTimeout`; `431`: headers over
   * `http.maxHeaderSize`; `413`: chunk extensions too large; `505`: a version other than HTTP/1.x;
   * `417`: an `Expect` other than `100-continue`; `400`: any other parse error or malformed head
   * (`requestHeadFault`).
   */
  status: 400 | 408 | 413 | 417 | 431 | 505;
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
 *   `413`, as Node answers it; `HPE_INVALID_VERSION`: `505`; any other `HPE_*`: `400`.
 * - `HPE_CLOSED_CONNECTION` (bytes after a request with `Connection: close`): ignored, as RFC
 *   9112 §9.6 has it; that request is answered and the connection closed after it.
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
  // An `Expect` other than `100-continue` (RFC 9110 §10.1.1 allows a 417): Node's bare `417`
  // unless someone listens. A whole request, with a response object, that never reaches `request`.
  server.on('checkExpectation', (_req: IncomingMessage, res: ServerResponse) => {
    try {
      const failure: ClientFailure = {
        status: 417,
        message: 'the request expects something other than 100-continue (Expect), which is not supported',
      };
      options.failed?.(failure);
      const response = options.respond(failure);
      // Its body, if any, is not read: the connection closes.
      res.writeHead(response.status, {
        ...response.headers,
        'content-type': response.contentType,
        'content-length': Buffer.byteLength(response.body),
        'cache-control': 'no-store',
        connection: 'close',
      });
      res.end(response.body);
    } catch {
      res.destroy();
    }
  });
}

/**
 * Node answers `Expect: 100-continue` with `100 Continue` before any handler runs, inviting the
 * body of a request the handler then refuses for its head (`requestHeadFault`). For a server
 * without a `checkContinue` path of its own: `100 Continue` goes to a sound head only; a faulty
 * one is marked `Connection: close` (a body the client sends anyway is not read). Either way the
 * request then goes on as `request`, as Node's own handling sends it.
 */
export function continueSoundRequests(server: Server): void {
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
    if (requestHeadFault(req) === undefined) res.writeContinue();
    else res.setHeader('connection', 'close');
    server.emit('request', req, res);
  });
}

/**
 * What a server must refuse in a request head Node's parser let through, before routing it.
 * Undefined when the request may go on.
 *
 * - A version other than HTTP/1.x: `505`. llhttp takes `HTTP/2.0` in a request line, and a line
 *   with no version at all as HTTP/0.9; both reach the handlers, and a proxy would forward them as
 *   HTTP/1.1. (It rejects other versions itself, `HPE_INVALID_VERSION`: also `505` here.)
 * - More than one `Host` line: `400` (RFC 9112 §3.2). Node keeps the first in `headers.host`; a
 *   server behind or in front of this one may take another, so the request would be judged and
 *   served for different hosts.
 * - HTTP/1.1 without `Host`: `400` (RFC 9112 §3.2; HTTP/1.0 may omit it). Node's
 *   `requireHostHeader` answers it with a bare `400` before any handler runs; Spillway's servers
 *   turn that off and ask this, so the answer is theirs.
 */
export function requestHeadFault(req: IncomingMessage): ClientFailure | undefined {
  if (req.httpVersionMajor !== 1) {
    return { status: 505, message: `HTTP/${req.httpVersion} is not supported: send HTTP/1.1 or HTTP/1.0` };
  }
  let hosts = 0;
  const raw = req.rawHeaders;
  for (let i = 0; i < raw.length; i += 2)
    if (raw[i]!.length === 4 && raw[i]!.toLowerCase() === 'host') hosts++;
  if (hosts > 1) return { status: 400, message: 'the request has more than one Host header (RFC 9112 §3.2)' };
  if (hosts === 0 && req.httpVersionMinor >= 1) {
    return { status: 400, message: 'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)' };
  }
  return undefined;
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
  // Bytes after a request that asked to close the connection: RFC 9112 §9.6 has them ignored.
  // That request's response is still to come, and Node closes the connection after it: nothing to
  // write (it would pass for another answer), nothing to cut (that request would get none).
  if ((error as NodeJS.ErrnoException).code === 'HPE_CLOSED_CONNECTION') return;
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
  if (code === 'HPE_INVALID_VERSION') {
    return { status: 505, message: 'the request line names an HTTP version other than 1.1 or 1.0' };
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
