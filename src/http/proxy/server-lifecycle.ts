import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { TIMEOUT_SWEEP_MS } from '../../server/http-client-error.js';
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
  #draining = false;

  constructor(rules: ProxyRules) {
    this.server = createProxyHttpServer();
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
  async listen(port: number, host: string): Promise<{ address: string; port: number }> {
    const server = this.server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const bound = server.address() as AddressInfo;
    const address =
      bound.family === 'IPv6' ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`;
    return { address, port: bound.port };
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
 * The proxy's Node server, with the settings every Spillway server shares. An HTTP/1.1 request
 * without Host is answered and counted by the proxy (`requestHeadFault`), not with Node's bare 400
 * before the request event.
 */
function createProxyHttpServer(): Server {
  return createServer({
    keepAlive: true,
    connectionsCheckingInterval: TIMEOUT_SWEEP_MS,
    requireHostHeader: false,
  });
}

function countConnections(server: Server): number {
  // `getConnections` is async and callback-based; the sockets the server still tracks suffice here.
  const connections = (server as unknown as { _connections?: number })._connections;
  return typeof connections === 'number' ? connections : 0;
}
