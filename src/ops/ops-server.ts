import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { assertKnownOptions, optionNames } from '../core/validate.js';
import { requestHeadFault } from '../server/http-client-error.js';
import { createHttpServer } from '../server/http-server.js';

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
  const { registry, health } = options;
  const http = createHttpServer({
    host: options.host,
    port: options.port,
    allowedHosts: options.allowedHosts ?? [],
    headersTimeoutMs: options.headersTimeoutMs,
    clientErrors: {
      respond: (failure) => ({
        status: failure.status,
        contentType: TEXT,
        body: `${failure.message}\n`,
      }),
    },
    handle: (request, response) => {
      route(request, response).catch((error: unknown) => {
        if (!response.headersSent) send(response, 500, TEXT, `ops endpoint failed: ${String(error)}\n`);
        else response.destroy();
      });
    },
  });

  async function route(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const headFault = requestHeadFault(request);
    if (headFault !== undefined) {
      send(response, headFault.status, TEXT, `${headFault.message}\n`);
      return;
    }
    // Before routing: a rebound name learns nothing, not even which paths exist.
    const hostHeader = request.headers.host;
    if (!http.servesHost(hostHeader)) {
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

  const { address, port } = await http.listen();
  return { address, port, close: http.close };
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
