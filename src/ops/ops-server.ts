import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { assertKnownOptions, optionNames } from '../core/validate.js';
import { formatHostPort } from '../protocol/host-port.js';
import { createHostCheck } from '../server/host-allowlist.js';
import {
  answerClientErrors,
  continueSoundRequests,
  requestHeadFault,
  TIMEOUT_SWEEP_MS,
  validateHeadersTimeoutMs,
} from '../server/http-client-error.js';

const TEXT = 'text/plain; charset=utf-8';

/** What `/healthz` reports. `ok: false` answers 503 so load balancers and orchestrators act on it. */
export interface HealthReport {
  ok: boolean;
  [detail: string]: unknown;
}

export interface OpsServerOptions {
  /** Default 127.0.0.1: metrics name every bucket, so exposing them is a deliberate choice. */
  host?: string;
  /** Default 0 (any free port; read the real one from `address`). */
  port?: number;
  /**
   * Names (or IP addresses) besides the listen address that scrapers may use in `Host`, e.g. a
   * DNS name Prometheus scrapes. Every other `Host` is refused with `403` (DNS rebinding; see
   * server/host-allowlist.ts for what is served by default). `ERR_SPILLWAY_INVALID_OPTION` for an
   * entry that is not a host name or IP address.
   */
  allowedHosts?: readonly string[];
  registry: Registry;
  health: () => HealthReport | Promise<HealthReport>;
  /**
   * Node's bound on receiving a request's headers (a client trickling them holds a connection):
   * `408` past it. Default 60 s, Node's; at most Node's `requestTimeout` (300 s).
   */
  headersTimeoutMs?: number;
}

export interface OpsServer {
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

/**
 * The operations endpoint every Spillway process serves: `GET /healthz` (JSON, 200 when healthy,
 * 503 when not) and `GET /metrics` (Prometheus text format). Anything else is 404 (405 for other
 * methods on those paths). Errors are plain text, as a scraper or `curl` shows them; a request
 * Node's parser rejects or whose headers are late gets one too, with `Connection: close`, and an
 * HTTP/1.1 request without Host a 400. A request whose Host the endpoint does not serve gets a
 * 403 before routing, HTTP/1.0 without Host included (`allowedHosts`): a page that rebinds its
 * name to this machine must not read the metrics, which name buckets, limits and hosts. Plain
 * node:http: two routes do not need a framework.
 */
const OPS_SERVER_OPTIONS = optionNames<OpsServerOptions>({
  host: true,
  port: true,
  allowedHosts: true,
  registry: true,
  health: true,
  headersTimeoutMs: true,
});

export async function startOpsServer(options: OpsServerOptions): Promise<OpsServer> {
  assertKnownOptions(options, OPS_SERVER_OPTIONS, 'startOpsServer');
  const host = options.host ?? '127.0.0.1';
  const headersTimeout = validateHeadersTimeoutMs(options.headersTimeoutMs, 'headersTimeoutMs');
  const { registry, health } = options;
  const hostServed = createHostCheck({ listenHost: host, allowedHosts: options.allowedHosts ?? [] });

  // `requireHostHeader: false`: an HTTP/1.1 request without Host gets the ops server's own 400
  // (`route`), not Node's bare one before any handler runs.
  const serverOptions = {
    requireHostHeader: false,
    connectionsCheckingInterval: TIMEOUT_SWEEP_MS,
    headersTimeout,
  };
  const server = createServer(serverOptions, (request, response) => {
    route(request, response).catch((error: unknown) => {
      if (!response.headersSent) send(response, 500, TEXT, `ops endpoint failed: ${String(error)}\n`);
      else response.destroy();
    });
  });
  answerClientErrors(server, {
    respond: (failure) => ({
      status: failure.status,
      contentType: TEXT,
      body: `${failure.message}\n`,
    }),
  });
  continueSoundRequests(server);

  async function route(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const headFault = requestHeadFault(request);
    if (headFault !== undefined) {
      send(response, headFault.status, TEXT, `${headFault.message}\n`);
      return;
    }
    // Before routing: a rebound name learns nothing, not even which paths exist.
    const hostHeader = request.headers.host;
    if (!hostServed(hostHeader)) {
      send(
        response,
        403,
        TEXT,
        hostHeader === undefined
          ? 'forbidden: the request has no Host header, so it names no host the ops endpoint serves; send one\n'
          : 'forbidden: this Host is not one the ops endpoint serves (DNS-rebinding guard); allow a name with --ops-allowed-host\n',
      );
      return;
    }
    const path = (request.url ?? '/').split('?')[0];
    if (path !== '/healthz' && path !== '/metrics') {
      send(response, 404, TEXT, 'not found: try /healthz or /metrics\n');
      return;
    }
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      response.setHeader('allow', 'GET, HEAD');
      send(response, 405, TEXT, 'method not allowed\n');
      return;
    }
    if (path === '/metrics') {
      send(response, 200, registry.contentType, await registry.metrics(), request.method === 'HEAD');
      return;
    }
    let report: HealthReport;
    try {
      report = await health();
    } catch (error) {
      report = { ok: false, error: error instanceof Error ? error.message : String(error) };
    }
    send(
      response,
      report.ok ? 200 : 503,
      'application/json',
      `${JSON.stringify(report)}\n`,
      request.method === 'HEAD',
    );
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;

  let closing: Promise<void> | undefined;
  return {
    address: formatHostPort(host, port),
    port,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        // Scrapers hold keep-alive connections; they must not delay shutdown.
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

function send(
  response: ServerResponse,
  status: number,
  contentType: string,
  body: string,
  headOnly = false,
): void {
  response.writeHead(status, {
    'content-type': contentType,
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
  });
  response.end(headOnly ? undefined : body);
}
