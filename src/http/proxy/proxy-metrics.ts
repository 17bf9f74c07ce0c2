import type { DecisionResult } from '../edge-decision.js';

/** One bucket decision, classified as the middleware classifies its policy's. */
export type { DecisionResult } from '../edge-decision.js';

/**
 * What the proxy counts as it happens (a few increments per request); the Prometheus
 * implementation is ops/proxy-metrics.ts. Bucket labels are rule names from the rules file, never
 * rendered keys, so series stay bounded whatever clients send.
 */
export type ProxyOutcome =
  /** Every enforced bucket allowed; forwarded and answered by the upstream. */
  | 'forwarded'
  /** An enforced bucket rejected: 429 from the proxy. */
  | 'limited'
  /** The upstream refused or reset the connection: 502. */
  | 'upstream_error'
  /** The upstream did not connect or send headers in time: 504. */
  | 'upstream_timeout'
  /** No pooled upstream connection became free within `upstream.headersTimeoutMs`: 504, never sent. */
  | 'upstream_queue_timeout'
  /** Every pooled connection busy and `upstream.maxQueued` requests already waiting: 503, never sent. */
  | 'upstream_queue_full'
  /** The client went away before the response was complete; the upstream request was aborted (or never sent). */
  | 'client_abort'
  /** The request headers or the whole request did not arrive within `server.headersTimeoutMs` / `server.requestTimeoutMs` (408, Node's sweep), the request body paused longer than `server.bodyTimeoutMs` or came slower than `server.bodyMinBytesPerSec` (408 or a cut response), or the client took no response bytes for `server.sendTimeoutMs` (cut); upstream request aborted. */
  | 'client_timeout'
  /** The request could not be forwarded as sent (unparsable, headers too large, bad target, CONNECT, repeated key header): 4xx from the proxy. */
  | 'bad_request'
  /** Answered by the proxy itself, never forwarded: `OPTIONS *` (200 with `Allow`). */
  | 'answered_locally'
  /** An upgrade arriving while the proxy drains: 503 from the proxy, never forwarded (a tunnel would outlive the drain). */
  | 'draining'
  /** An upgrade to a protocol not in `server.upgradeProtocols` (h2c, …): 501 from the proxy, never forwarded. */
  | 'upgrade_refused'
  /** A request body from a client that already has `server.maxUploadsPerClient` in progress: 429 from the proxy, nothing read or decided. */
  | 'too_many_uploads';

export interface ProxyMetrics {
  request(outcome: ProxyOutcome): void;
  decision(bucket: string, result: DecisionResult): void;
  upstreamHeadersSeconds(seconds: number): void;
  inFlight(delta: number): void;
  /** How many requests wait for a pooled connection, read at scrape time. */
  watchQueue(depth: () => number): void;
  reload(result: 'ok' | 'error'): void;
}

/** For embedding without Prometheus. */
export const noProxyMetrics: ProxyMetrics = {
  request: () => {},
  decision: () => {},
  upstreamHeadersSeconds: () => {},
  inFlight: () => {},
  watchQueue: () => {},
  reload: () => {},
};
