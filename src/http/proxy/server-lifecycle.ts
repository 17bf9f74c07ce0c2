import type { Server } from 'node:http';
import { formatHostPort } from '../../protocol/host-port.js';
import type { ClientErrorOptions } from '../../server/http-client-error.js';
import { createHttpServer, type HttpServer } from '../../server/http-server.js';
import type { ProxyRules } from '../rules/proxy-rules.js';
import type { UpgradedConnections } from './upgrade-tunnelling.js';
import type { UpstreamPool } from './upstream-pool.js';

/** How often a drain closes the keep-alive connections that went idle since the last look. */
const IDLE_SWEEP_MS = 50;

/**
 * The proxy's Node server from creation to the end of its drain: the client-facing timeouts (a
 * reload changes them), the listening address, and the graceful stop.
 */
export class ServerLifecycle {
  readonly server: Server;
  readonly #http: HttpServer;
  #draining = false;

  /** `clientErrors`: how the requests Node's server gives up on are answered and counted. */
  constructor(rules: ProxyRules, listenAt: { host: string; port: number }, clientErrors: ClientErrorOptions) {
    this.#http = createProxyHttpServer(listenAt, clientErrors);
    this.server = this.#http.server;
    this.applyTimeouts(rules);
  }

  get draining(): boolean {
    return this.#draining;
  }

  applyTimeouts(rules: ProxyRules): void {
    this.server.keepAliveTimeout = rules.server.keepAliveTimeoutMs;
    this.server.requestTimeout = rules.server.requestTimeoutMs;
    this.server.headersTimeout = rules.server.headersTimeoutMs;
  }

  /** Resolves with the `host:port` actually bound once the server accepts connections. */
  async listen(): Promise<{ address: string; port: number }> {
    const { bound } = await this.#http.listen();
    return { address: formatHostPort(bound.address, bound.port), port: bound.port };
  }

  /**
   * Refuses new connections, lets in-flight requests finish and closes keep-alive connections as
   * they go idle; tunnels stay open until either side closes them. After `drainTimeoutMs` what is
   * left is cut. Resolves with how many client connections had to be cut (a tunnel is one).
   */
  async drain(
    drainTimeoutMs: number,
    upgrades: UpgradedConnections,
    upstream: UpstreamPool,
  ): Promise<{ forcedConnections: number }> {
    const server = this.server;
    this.#draining = true;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    // Keep-alive connections go idle as their last response completes; close each as it does.
    const idleSweep = setInterval(() => server.closeIdleConnections(), IDLE_SWEEP_MS);
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), drainTimeoutMs);
    });
    // Tunnels stay open through the drain: the proxy cannot say goodbye inside a protocol it
    // only relays, the upstream can (a WebSocket close frame; in a sidecar pod it is stopping
    // too). The drain ends as soon as the last one closes, from either side, or idles out.
    const finished = await Promise.race([
      Promise.all([closed, upgrades.tunnelsClosed()]).then(() => 'drained' as const),
      deadline,
    ]);
    clearInterval(idleSweep);
    clearTimeout(timer);
    let forcedConnections = 0;
    if (finished === 'timeout') {
      // Client connections the server still holds, a tunnel's client side among them: each
      // tunnel counts once (its upstream side is not a client connection).
      forcedConnections = countConnections(server);
      server.closeAllConnections();
      upgrades.destroyAll();
      await closed;
      await upstream.destroy();
    } else {
      await upstream.close();
    }
    return { forcedConnections };
  }
}

/**
 * The proxy's server from the factory every Spillway server uses (src/server/http-server.ts),
 * with no request handler: the proxy listens for `request` and `checkContinue` itself, so it
 * decides before inviting a body. No `allowedHosts`: a reverse proxy serves whatever name its
 * clients use. Its timeouts come from the rules (`applyTimeouts`), its stop is the drain.
 */
function createProxyHttpServer(
  listenAt: { host: string; port: number },
  clientErrors: ClientErrorOptions,
): HttpServer {
  return createHttpServer({ ...listenAt, keepAlive: true, clientErrors });
}

function countConnections(server: Server): number {
  // `getConnections` is async and callback-based; the sockets the server still tracks suffice here.
  const connections = (server as unknown as { _connections?: number })._connections;
  return typeof connections === 'number' ? connections : 0;
}
