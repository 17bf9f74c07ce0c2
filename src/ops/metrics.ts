import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

/**
 * Prometheus metrics for one Spillway process, on a registry of its own (never prom-client's global
 * default, so embedding Spillway in an app that has its own metrics cannot collide or double count).
 *
 * Every name starts with `spillway_` and means the same in every process (docs/operations.md lists
 * them). Values that live in a component's state (per-bucket counts, ratios, ages) are read from its
 * `snapshot()` when Prometheus scrapes, through `addSnapshotMetrics`: nothing is recorded on the
 * request path. Only the report RPCs, about once a second, are observed as they happen.
 */
/** `proxy` is `spillway proxy` and `rls` is `spillway rls`: data-plane hosts too, told apart from `spillway host` and libraries. */
export type Component = 'host' | 'proxy' | 'aggregator' | 'controller' | 'rls';

/** Outcome of a report sent to a parent tier. */
export type SentReportResult = 'ok' | 'timeout' | 'unavailable' | 'refused' | 'error';
/** Outcome of a report received from a child tier. */
export type ReceivedReportResult = 'ok' | 'invalid' | 'unauthenticated' | 'error';

export interface MetricsOptions {
  component: Component;
  /** The process identity (`--id`), exported as `spillway_info{component,id}`. */
  id: string;
  /** Node's process metrics (CPU, memory, event loop lag, GC) on the same registry, default true. */
  processMetrics?: boolean;
}

/** A series value read from a snapshot: label values and the number. */
export type Sample = readonly [labels: Record<string, string>, value: number];

export interface SnapshotMetricDefinition<S> {
  name: string;
  help: string;
  /** `counter` values must be cumulative since the component started (they are exported as they are). */
  type: 'counter' | 'gauge';
  labelNames?: readonly string[];
  samples(snapshot: S): Iterable<Sample>;
}

export interface SpillwayMetrics {
  readonly registry: Registry;
  readonly component: Component;
  readonly id: string;
  observeReportSent(parent: string, result: SentReportResult, durationSeconds: number): void;
  observeReportReceived(result: ReceivedReportResult, durationSeconds: number): void;
  /** A report its transport refused before any handling (undecodable, over bounds, no token). */
  countReportRefused(result: 'invalid' | 'unauthenticated'): void;
  /** A connection to a parent was replaced after reports timed out in a row. */
  countReconnect(parent: string): void;
  /**
   * Registers metrics whose values come from `takeSnapshot()` at scrape time. One scrape takes one
   * snapshot however many metrics read it, so the series in a scrape are mutually consistent.
   * Series of buckets missing from the snapshot disappear (evicted buckets do not linger).
   */
  addSnapshotMetrics<S>(takeSnapshot: () => S, definitions: readonly SnapshotMetricDefinition<S>[]): void;
}

/** Report round trips are ~1 ms on a LAN and bounded by the report timeout (seconds). */
const REPORT_DURATION_BUCKETS_S = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
];

/**
 * Garbage collection pauses, finer than prom-client's default buckets (1 ms, 10 ms, 100 ms...): a
 * busy proxy stops its event loop for young-generation collections of one to a few ms, several
 * times a second (bench/results/proxy-gc.md), and every request arriving meanwhile waits; the
 * defaults put 2 ms and 9 ms in one bucket. scripts/profile-proxy.ts reads these.
 */
export const GC_PAUSE_BUCKETS_S = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1];

export function createMetrics(options: MetricsOptions): SpillwayMetrics {
  const registry = new Registry();
  const { component, id } = options;
  if (options.processMetrics ?? true)
    collectDefaultMetrics({ register: registry, prefix: 'spillway_', gcDurationBuckets: GC_PAUSE_BUCKETS_S });

  new Gauge({
    name: 'spillway_info',
    help: 'Always 1; labels identify the process.',
    labelNames: ['component', 'id'],
    registers: [registry],
  }).set({ component, id }, 1);

  const reportsSent = new Counter({
    name: 'spillway_reports_total',
    help: 'Reports sent to a parent tier, by parent address and result (ok, timeout, unavailable: no answer, refused: the parent said no, error).',
    labelNames: ['parent', 'result'],
    registers: [registry],
  });
  const reportDuration = new Histogram({
    name: 'spillway_report_duration_seconds',
    help: 'Round trip of reports sent to a parent tier, failures included.',
    labelNames: ['parent'],
    buckets: REPORT_DURATION_BUCKETS_S,
    registers: [registry],
  });
  const reconnects = new Counter({
    name: 'spillway_control_reconnects_total',
    help: 'Connections to a parent tier replaced after reports to it timed out in a row (a partition or a stuck connection).',
    labelNames: ['parent'],
    registers: [registry],
  });
  const reportsReceived = new Counter({
    name: 'spillway_reports_received_total',
    help: 'Reports received from child tiers, by result (ok, invalid, unauthenticated, error).',
    labelNames: ['result'],
    registers: [registry],
  });
  const reportHandleDuration = new Histogram({
    name: 'spillway_report_handle_duration_seconds',
    help: 'Time to handle a received report and compute its reply.',
    buckets: REPORT_DURATION_BUCKETS_S,
    registers: [registry],
  });

  return {
    registry,
    component,
    id,
    observeReportSent(parent, result, durationSeconds) {
      reportsSent.inc({ parent, result });
      reportDuration.observe({ parent }, durationSeconds);
    },
    countReconnect(parent) {
      reconnects.inc({ parent });
    },
    observeReportReceived(result, durationSeconds) {
      reportsReceived.inc({ result });
      reportHandleDuration.observe(durationSeconds);
    },
    countReportRefused(result) {
      reportsReceived.inc({ result });
    },
    addSnapshotMetrics(takeSnapshot, definitions) {
      let cached: { snapshot: ReturnType<typeof takeSnapshot> } | undefined;
      // prom-client calls every metric's collect() synchronously within one scrape; the cache lives
      // until the next microtask, i.e. exactly one scrape.
      const current = () => {
        if (!cached) {
          cached = { snapshot: takeSnapshot() };
          queueMicrotask(() => {
            cached = undefined;
          });
        }
        return cached.snapshot;
      };
      for (const definition of definitions) {
        const series = {
          name: definition.name,
          help: definition.help,
          labelNames: [...(definition.labelNames ?? [])],
          registers: [registry],
        };
        const samples = () => definition.samples(current());
        if (definition.type === 'counter') {
          new Counter({
            ...series,
            collect() {
              this.reset();
              for (const [labels, value] of samples())
                this.inc(labels, Number.isFinite(value) && value > 0 ? value : 0);
            },
          });
        } else {
          new Gauge({
            ...series,
            collect() {
              this.reset();
              for (const [labels, value] of samples()) if (Number.isFinite(value)) this.set(labels, value);
            },
          });
        }
      }
    },
  };
}
