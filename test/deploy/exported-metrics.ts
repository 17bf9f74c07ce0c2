import { addAggregatorMetrics } from '../../src/ops/aggregator-metrics.js';
import { addControllerMetrics } from '../../src/ops/controller-metrics.js';
import { addLimiterMetrics } from '../../src/ops/limiter-metrics.js';
import { createMetrics } from '../../src/ops/metrics.js';
import { addProxyKeyMetrics, createProxyMetrics } from '../../src/ops/proxy-metrics.js';
import { createReloadMetrics } from '../../src/ops/reload-metrics.js';
import { addQuotaMetrics, addRlsMetrics } from '../../src/ops/rls-metrics.js';

/**
 * Every metric name a Spillway process can export, read from a registry built by the same functions
 * the processes call (nothing is scraped: the snapshots are never taken), so a renamed or removed
 * metric fails the dashboards and alert rules that still name it. Histograms appear once, by base
 * name; `isExported` accepts their `_bucket`, `_sum` and `_count` series too.
 */
export function exportedMetricNames(): ReadonlySet<string> {
  const metrics = createMetrics({ component: 'controller', id: 'names' });
  const neverScraped = () => {
    throw new Error('only names are read');
  };
  addLimiterMetrics(metrics, { snapshot: neverScraped });
  addAggregatorMetrics(metrics, { snapshot: neverScraped });
  addControllerMetrics(metrics, { snapshot: neverScraped });
  createProxyMetrics(metrics.registry);
  addProxyKeyMetrics(metrics.registry, neverScraped);
  createReloadMetrics(metrics.registry, 'spillway_config');
  addRlsMetrics(metrics, neverScraped as never);
  addQuotaMetrics(metrics, neverScraped as never);
  return new Set(metrics.registry.getMetricsAsArray().map((metric) => metric.name));
}

export function isExported(names: ReadonlySet<string>, series: string): boolean {
  return names.has(series) || names.has(series.replace(/_(bucket|sum|count)$/, ''));
}
