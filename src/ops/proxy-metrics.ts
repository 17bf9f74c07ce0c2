import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { KeyTableStats } from '../http/proxy/proxy-backend.js';
import type { DecisionResult, ProxyMetrics, ProxyOutcome } from '../http/proxy/proxy-metrics.js';
import { createReloadMetrics } from './reload-metrics.js';

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
  'upgrade_refused',
  'too_many_uploads',
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
 * a labelled `inc` hashes its label object on every call (docs/proxy.md, "Operations"), which
 * the request path would pay once per request and once more per bucket decision.
 */
export function createProxyMetrics(registry: Registry): ProxyMetrics {
  const requestCounts = new Float64Array(OUTCOMES.length);
  new Counter({
    name: 'spillway_proxy_requests_total',
    help: 'Requests by outcome (forwarded, limited, upstream_error, upstream_timeout, upstream_queue_timeout, upstream_queue_full, client_abort, client_timeout, bad_request, answered_locally, draining, upgrade_refused, too_many_uploads).',
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
