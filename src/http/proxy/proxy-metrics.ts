import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { createReloadMetrics } from '../../ops/reload-metrics.js';
import type { KeyTableStats } from './proxy-backend.js';

/**
 * What the proxy counts as it happens (a few increments per request). Bucket labels are rule names
 * from the rules file, never rendered keys, so series stay bounded whatever clients send.
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
  | 'draining';

/** One bucket decision: `would_drop` is a shadow bucket's rejection (admitted), `error` a limiter that threw (admitted). */
export type DecisionResult = 'allowed' | 'rejected' | 'would_drop' | 'fail_open' | 'fail_closed' | 'error';

export interface ProxyMetrics {
  request(outcome: ProxyOutcome): void;
  decision(bucket: string, result: DecisionResult): void;
  upstreamHeadersSeconds(seconds: number): void;
  inFlight(delta: number): void;
  /** How many requests wait for a pooled connection, read at scrape time. */
  watchQueue(depth: () => number): void;
  reload(result: 'ok' | 'error'): void;
}

const UPSTREAM_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

const OUTCOMES: readonly ProxyOutcome[] = [
  'forwarded',
  'limited',
  'upstream_error',
  'upstream_timeout',
  'upstream_queue_timeout',
  'upstream_queue_full',
  'client_abort',
  'client_timeout',
  'bad_request',
  'answered_locally',
  'draining',
];
const RESULTS: readonly DecisionResult[] = [
  'allowed',
  'rejected',
  'would_drop',
  'fail_open',
  'fail_closed',
  'error',
];
const OUTCOME_INDEX = indexOf(OUTCOMES);
const RESULT_INDEX = indexOf(RESULTS);

function indexOf<T extends string>(values: readonly T[]): Readonly<Record<T, number>> {
  return Object.freeze(Object.fromEntries(values.map((value, index) => [value, index]))) as Record<T, number>;
}

/**
 * The per-request counters are plain numbers published at scrape time (prom-client's `collect`):
 * a labelled `inc` hashes its label object on every call (~200 ns measured here), which the
 * request path would pay once per request and once more per bucket decision.
 */
export function createProxyMetrics(registry: Registry): ProxyMetrics {
  const requestCounts = new Float64Array(OUTCOMES.length);
  new Counter({
    name: 'spillway_proxy_requests_total',
    help: 'Requests by outcome (forwarded, limited, upstream_error, upstream_timeout, upstream_queue_timeout, upstream_queue_full, client_abort, client_timeout, bad_request, answered_locally, draining).',
    labelNames: ['outcome'],
    registers: [registry],
    collect() {
      this.reset();
      // Every outcome from the start, at 0: a series that appears at 1 reads as no increase to
      // rate() and increase(), so the first of its kind would go unseen by an alert.
      for (let i = 0; i < OUTCOMES.length; i++) this.inc({ outcome: OUTCOMES[i]! }, requestCounts[i]);
    },
  });
  /** Per bucket (rule name: bounded by the rules file, never by what clients send), per result. */
  const decisionCounts = new Map<string, Float64Array>();
  new Counter({
    name: 'spillway_proxy_decisions_total',
    help: 'Bucket decisions by bucket (rule name) and result (allowed, rejected, would_drop, fail_open, fail_closed, error).',
    labelNames: ['bucket', 'result'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [bucket, counts] of decisionCounts) {
        for (let i = 0; i < RESULTS.length; i++) {
          if (counts[i]! > 0) this.inc({ bucket, result: RESULTS[i]! }, counts[i]);
        }
      }
    },
  });
  const upstream = new Histogram({
    name: 'spillway_proxy_upstream_headers_seconds',
    help: 'Time from a request sent whole to the upstream to its response headers, or to the headers deadline.',
    buckets: UPSTREAM_BUCKETS_S,
    registers: [registry],
  });
  let inFlight = 0;
  new Gauge({
    name: 'spillway_proxy_in_flight_requests',
    help: 'Requests (and upgraded connections) being served now.',
    registers: [registry],
    collect() {
      this.set(inFlight);
    },
  });
  let queueDepth = () => 0;
  new Gauge({
    name: 'spillway_proxy_upstream_queued_requests',
    help: 'Requests (and upgrades) waiting for a pooled upstream connection (at most upstream.maxQueued).',
    registers: [registry],
    collect() {
      this.set(queueDepth());
    },
  });
  const reloads = createReloadMetrics(registry, 'spillway_proxy_rules');
  return {
    request: (outcome) => {
      requestCounts[OUTCOME_INDEX[outcome]]!++;
    },
    decision: (bucket, result) => {
      let counts = decisionCounts.get(bucket);
      if (counts === undefined) {
        counts = new Float64Array(RESULTS.length);
        decisionCounts.set(bucket, counts);
      }
      counts[RESULT_INDEX[result]]!++;
    },
    upstreamHeadersSeconds: (seconds) => upstream.observe(seconds),
    inFlight: (delta) => {
      inFlight += delta;
    },
    watchQueue: (depth) => {
      queueDepth = depth;
    },
    reload: (result) => reloads.reloaded(result),
  };
}

/**
 * How full each local bucket's key table is, read at scrape time (nothing on the request path):
 * keys at `maxKeys` with evictions climbing means `backend.maxKeys` is too small for the real key
 * set, or someone is sending distinct keys (a cardinality attack; memory stays bounded either way).
 */
export function addProxyKeyMetrics(registry: Registry, keyTables: () => readonly KeyTableStats[]): void {
  // One read per scrape, shared by the three metrics (prom-client collects them synchronously).
  let cached: readonly KeyTableStats[] | undefined;
  const current = () => {
    if (!cached) {
      cached = keyTables();
      queueMicrotask(() => {
        cached = undefined;
      });
    }
    return cached;
  };
  new Gauge({
    name: 'spillway_proxy_bucket_keys',
    help: 'Keys held by a bucket of the local backend (at most backend.maxKeys).',
    labelNames: ['bucket'],
    registers: [registry],
    collect() {
      this.reset();
      for (const table of current()) this.set({ bucket: table.bucket }, table.keys);
    },
  });
  new Gauge({
    name: 'spillway_proxy_bucket_keys_max',
    help: 'Bound on the keys a bucket of the local backend holds (backend.maxKeys).',
    labelNames: ['bucket'],
    registers: [registry],
    collect() {
      this.reset();
      for (const table of current()) this.set({ bucket: table.bucket }, table.maxKeys);
    },
  });
  new Counter({
    name: 'spillway_proxy_bucket_key_evictions_total',
    help: 'Live keys a bucket of the local backend dropped because its table was full (their counts were lost).',
    labelNames: ['bucket'],
    registers: [registry],
    collect() {
      this.reset();
      for (const table of current()) this.inc({ bucket: table.bucket }, table.evictions);
    },
  });
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
