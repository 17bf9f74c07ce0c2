import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { formatHostPort } from '../protocol/host-port.js';
import { createHostCheck, type HostCheck } from './host-allowlist.js';
import {
  answerClientErrors,
  type ClientErrorOptions,
  continueSoundRequests,
  TIMEOUT_SWEEP_MS,
  validateHeadersTimeoutMs,
} from './http-client-error.js';

export interface HttpServerOptions {
  /** Where to listen. Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port; read the real one from `listen`'s answer). */
  port?: number;
  /**
   * Names (or IP addresses) besides the listen address that clients may use in `Host`, for
   * `servesHost` (host-allowlist.ts; `ERR_SPILLWAY_INVALID_OPTION` for an entry that is not a
   * host name or IP address). Absent: every `Host` is served, as a reverse proxy serves whatever
   * name its clients use.
   */
  allowedHosts?: readonly string[];
  /**
   * Node's bound on receiving a request's headers, validated by `validateHeadersTimeoutMs`.
   * Absent: Node's default (60 s), or whatever the caller sets on `server` itself.
   */
  headersTimeoutMs?: number;
  /** Node's `keepAlive` (TCP keep-alive on accepted sockets). Default false, Node's. */
  keepAlive?: boolean;
  /** How requests Node's parser rejects or its timeouts expire are answered (`answerClientErrors`). */
  clientErrors: ClientErrorOptions;
  /**
   * Every request, whole. Given: `Expect: 100-continue` is answered by `continueSoundRequests`
   * and the request then comes here. Absent: the caller listens for `request` and
   * `checkContinue` on `server` itself (the proxy decides before inviting a body).
   */
  handle?: (request: IncomingMessage, response: ServerResponse) => void;
}

/** Where a server listens once `listen` has resolved. */
export interface ListeningAddress {
  readonly port: number;
  /** The listen host (as given) and the port, `host:port` or `[v6]:port`. */
  readonly address: string;
  /** What the socket is bound to: the address family and address Node resolved the host to. */
  readonly bound: AddressInfo;
}

export interface HttpServer {
  /** The node:http server: listen for more events (`upgrade`, `connect`) or set timeouts on it. */
  readonly server: Server;
  /** The listen host, its default applied. */
  readonly host: string;
  /** Whether a request's `Host` names this server (`allowedHosts`). */
  readonly servesHost: HostCheck;
  /** Listens on `host:port`; rejects with the listen error (`EADDRINUSE`, …). Call once. */
  listen(): Promise<ListeningAddress>;
  /**
   * Stops accepting and cuts every connection at once (a keep-alive client, a scraper, must not
   * delay a shutdown); resolves when the server has closed. Every call returns the same promise.
   */
  close(): Promise<void>;
}

/**
 * A node:http server with the hardening every Spillway server shares: the timeout sweep each
 * second (`TIMEOUT_SWEEP_MS`), a validated `headersTimeoutMs`, the requests Node gives up on
 * answered in the server's own words (`answerClientErrors`), `100 Continue` only for a sound head
 * (`continueSoundRequests`), and the DNS-rebinding `Host` check ready to ask.
 *
 * `requireHostHeader` is off: an HTTP/1.1 request without Host reaches the handler, which answers
 * it in its own words (`requestHeadFault`), not with Node's bare 400 before any handler runs.
 */
export function createHttpServer(options: HttpServerOptions): HttpServer {
  const host = options.host ?? '127.0.0.1';
  const headersTimeout = validateHeadersTimeoutMs(options.headersTimeoutMs, 'headersTimeoutMs');
  const servesHost: HostCheck =
    options.allowedHosts === undefined
      ? () => true
      : createHostCheck({ listenHost: host, allowedHosts: options.allowedHosts });
  let closing: Promise<void> | undefined;

  const server = createServer(
    {
      requireHostHeader: false,
      connectionsCheckingInterval: TIMEOUT_SWEEP_MS,
      keepAlive: options.keepAlive,
      headersTimeout,
    },
    options.handle,
  );
  answerClientErrors(server, options.clientErrors);
  if (options.handle) continueSoundRequests(server);

  return {
    server,
    host,
    servesHost,
    async listen() {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(options.port ?? 0, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
      const bound = server.address() as AddressInfo;
      return { port: bound.port, address: formatHostPort(host, bound.port), bound };
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
