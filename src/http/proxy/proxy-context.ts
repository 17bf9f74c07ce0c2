import type { ActiveRules } from './active-rules.js';
import type { ClientConnections } from './client-connections.js';
import type { ClientUploads } from './client-uploads.js';
import type { ProxyMetrics } from './proxy-metrics.js';
import type { RequestDecider } from './request-decision.js';
import type { ServerLifecycle } from './server-lifecycle.js';
import type { UpgradedConnections } from './upgrade-tunnelling.js';
import type { UpstreamHealth } from './upstream-health.js';
import type { UpstreamPool } from './upstream-pool.js';

export interface ProxyLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** What the parts of one proxy server share, built by `startProxyServer`. */
export interface ProxyContext {
  readonly metrics: ProxyMetrics;
  readonly logger: ProxyLogger | undefined;
  /** The rules a request arriving now is served under; a reload replaces them. */
  rules: ActiveRules;
  readonly decider: RequestDecider;
  readonly upstream: UpstreamPool;
  readonly connections: ClientConnections;
  /** Request bodies in progress per client (`server.maxUploadsPerClient`), across reloads. */
  readonly uploads: ClientUploads;
  readonly upgrades: UpgradedConnections;
  readonly lifecycle: ServerLifecycle;
  /** Upstream failures, logged a streak at a time, for /healthz. */
  readonly upstreamHealth: UpstreamHealth;
}
