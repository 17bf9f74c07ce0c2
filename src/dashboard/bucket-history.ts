import type { DashboardView } from './dashboard-view.js';

/** One bucket's series, aligned with `BucketHistoryColumns.atMs`; null where it was not reported. */
export interface BucketSeries {
  offeredRps: (number | null)[];
  admittedRps: (number | null)[];
  limitRps: (number | null)[];
  dropRatio: (number | null)[];
  wouldDropRps: (number | null)[];
}

/** Columns as uPlot takes them: one time axis, one array per series. */
export interface BucketHistoryColumns {
  atMs: number[];
  versions: number[];
  buckets: Record<string, BucketSeries>;
}

export interface BucketHistory {
  add(view: DashboardView): void;
  columns(): BucketHistoryColumns;
  readonly length: number;
}

interface Entry {
  atMs: number;
  version: number;
  values: Map<string, readonly [number, number, number, number, number]>;
}

/**
 * The last `capacity` ticks of the buckets the page shows, so a page opened now starts with
 * minutes of charts instead of an empty plot. Memory: capacity x the view's bucket cap; a
 * `columns()` answer: the newest tick's buckets x capacity points.
 */
export function createBucketHistory({ capacity = 300 }: { capacity?: number } = {}): BucketHistory {
  const ring: Entry[] = [];
  let next = 0;

  return {
    get length() {
      return ring.length;
    },
    add(view) {
      const values: Entry['values'] = new Map();
      for (const b of view.buckets) {
        values.set(b.key, [b.offeredRps, b.admittedRps, b.limitRps, b.dropRatio, b.wouldDropRps]);
      }
      const entry = { atMs: view.controller.nowMs, version: view.controller.version, values };
      if (ring.length < capacity) ring.push(entry);
      else {
        ring[next] = entry;
        next = (next + 1) % capacity;
      }
    },
    columns() {
      const ordered = ring.length < capacity ? ring : [...ring.slice(next), ...ring.slice(0, next)];
      // The buckets of the newest tick only (at most the view's cap, 100), each with its whole
      // series: what the page shows now. Every key seen over the ring would be up to capacity x
      // cap keys when keys churn (a template keyed by a client value), 30,000 series of 300 points
      // built and sent on the controller's event loop for one unauthenticated request.
      const keys = [...(ordered.at(-1)?.values.keys() ?? [])].sort();
      const buckets = Object.create(null) as Record<string, BucketSeries>;
      for (const key of keys) {
        const series: BucketSeries = {
          offeredRps: [],
          admittedRps: [],
          limitRps: [],
          dropRatio: [],
          wouldDropRps: [],
        };
        for (const entry of ordered) {
          const v = entry.values.get(key);
          series.offeredRps.push(v ? v[0] : null);
          series.admittedRps.push(v ? v[1] : null);
          series.limitRps.push(v ? v[2] : null);
          series.dropRatio.push(v ? v[3] : null);
          series.wouldDropRps.push(v ? v[4] : null);
        }
        buckets[key] = series;
      }
      return { atMs: ordered.map((e) => e.atMs), versions: ordered.map((e) => e.version), buckets };
    },
  };
}
