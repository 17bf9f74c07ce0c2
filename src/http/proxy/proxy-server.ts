import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ProxyRules } from '../rules/proxy-rules.js';
import { activateRules } from './active-rules.js';
import { ClientConnections } from './client-connections.js';
import { ClientUploads } from './client-uploads.js';
import type { ProxyBackend } from './proxy-backend.js';
import type { ProxyContext, ProxyLogger } from './proxy-context.js';
import { noProxyMetrics, type ProxyMetrics } from './proxy-metrics.js';
import { assertProxyServerOptionNames } from './proxy-options.js';
import { RequestDecider } from './request-decision.js';
import { refuseConnect, serveRequest } from './serve-request.js';
import { ServerLifecycle } from './server-lifecycle.js';
import { serveUpgrade, UpgradedConnections } from './upgrade-tunnelling.js';
import { UpstreamHealth, type UpstreamHealthReport } from './upstream-health.js';
import { UpstreamPool } from './upstream-pool.js';

export type { ProxyLogger } from './proxy-context.js';

export interface ProxyServerOptions {
  rules: ProxyRules;
  backend: ProxyBackend;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port; read `port`). */
  port?: number;
  metrics?: ProxyMetrics;
  logger?: ProxyLogger;
}

export interface ProxyServer {
  /** `host:port` actually bound. */
  readonly address: string;
  readonly port: number;
  /** Requests and upgraded connections being served. */
  readonly inFlight: number;
  readonly draining: boolean;
  /**
   * The queue for pooled upstream connections (`UpstreamQueue`): `waiting`, requests and upgrades
   * that still want one (at most `upstream.maxQueued`); `held`, the entries it holds, those
   * answered or abandoned while they waited included (swept out once they are half of it).
   */
  readonly upstreamQueue: { readonly waiting: number; readonly held: number };
  /** Whether the upstream answers, as the proxy last found it (upstream-health.ts). */
  readonly upstreamHealth: UpstreamHealthReport;
  /**
   * Apply new rules to requests that arrive from now on (in-flight ones finish under the old).
   * Throws (and changes nothing) when a bucket's limiter cannot be built. Upstream URL, pool size
   * and connect timeout changes need a restart; the other timeouts and everything else apply.
   */
  setRules(rules: ProxyRules): void;
  /**
   * Graceful stop: refuse new connections, let in-flight requests finish, close idle keep-alive
   * connections as they go idle, leave tunnels (upgraded connections) open until either side
   * closes them. After `drainTimeoutMs`, remaining connections and tunnels are cut. Resolves with
   * how many client connections had to be cut (a tunnel is one).
   */
  close(options?: { drainTimeoutMs?: number }): Promise<{ forcedConnections: number }>;
}

/**
 * The sidecar reverse proxy: each request is decided against every matching bucket BEFORE it is
 * forwarded; allowed requests stream to the upstream through a pooled undici client and the
 * response streams back, with RateLimit fields added; rejected ones get a 429 from here.
 * See docs/proxy.md; its parts, in this folder:
 *
 * - `request-decision.ts`: the buckets a request matches, decided and combined into a verdict.
 * - `serve-request.ts`, `exchange.ts`: a request from its arrival to its response, forwarded
 *   through `upstream-pool.ts` (the pool and its queue) with its body (read ahead when small,
 *   `request-body.ts`; at most `server.maxUploadsPerClient` per client, `client-uploads.ts`) and
 *   its response streamed.
 * - `upgrade-tunnelling.ts`: upgrades (WebSocket) and the tunnels they become.
 * - `client-connections.ts`: per connection, the requests in the proxy's hands, and whose a
 *   client error is.
 * - `server-lifecycle.ts`: the Node server, its timeouts, listening and the drain.
 */
export async function startProxyServer(options: ProxyServerOptions): Promise<ProxyServer> {
  assertProxyServerOptionNames(options);
  const metrics = options.metrics ?? noProxyMetrics;
  const logger = options.logger;
  const backend = options.backend;
  const rules = activateRules(options.rules, backend);
  const upstream = new UpstreamPool(options.rules.upstream);
  metrics.watchQueue(() => upstream.queue.depth);
  const connections = new ClientConnections(metrics);
  const listenAt = { host: options.host ?? '127.0.0.1', port: options.port ?? 0 };
  const context: ProxyContext = {
    metrics,
    logger,
    rules,
    decider: new RequestDecider(metrics, logger),
    upstream,
    connections,
    uploads: new ClientUploads(),
    upgrades: new UpgradedConnections(),
    lifecycle: new ServerLifecycle(options.rules, listenAt, connections.clientErrorOptions()),
    upstreamHealth: new UpstreamHealth(logger),
  };
  const server = context.lifecycle.server;
  server.on('request', (req: IncomingMessage, res: ServerResponse) => serveRequest(context, req, res, false));
  // Decide before telling a client to send its body: a rejected upload is never transferred.
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) =>
    serveRequest(context, req, res, true),
  );
  server.on(
    'upgrade',
    (req: IncomingMessage, socket: Duplex, head: Buffer) => void serveUpgrade(context, req, socket, head),
  );
  server.on('connect', (_req: IncomingMessage, socket: Duplex) => refuseConnect(metrics, socket));
  const { address, port } = await context.lifecycle.listen();

  return {
    address,
    port,
    get inFlight() {
      return connections.inFlight;
    },
    get draining() {
      return context.lifecycle.draining;
    },
    get upstreamHealth() {
      return context.upstreamHealth.report();
    },
    get upstreamQueue() {
      return { waiting: upstream.queue.depth, held: upstream.queue.held };
    },
    setRules(next) {
      const activated = activateRules(next, backend);
      if (!upstream.reconfigure(next.upstream)) {
        const { url, connections, connectTimeoutMs } = next.upstream;
        logger?.warn(
          { url, connections, connectTimeoutMs },
          'proxy: upstream url, connections and connectTimeoutMs apply after a restart; keeping the current ones',
        );
      }
      context.lifecycle.applyTimeouts(next);
      context.rules = activated;
      // Requests still deciding under the old rules hold their limiters; only the backend lets go.
      backend.keepOnly(new Set(next.buckets.map((bucket) => bucket.config.name)));
    },
    close({ drainTimeoutMs = 10_000 } = {}) {
      return context.lifecycle.drain(drainTimeoutMs, context.upgrades, upstream);
    },
  };
}
