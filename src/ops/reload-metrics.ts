import { Counter, Gauge, type Registry } from 'prom-client';

/** How a process counts the reloads of the file it serves from (the controller's limits, the proxy's rules). */
export interface ReloadMetrics {
  reloaded(result: 'ok' | 'error'): void;
}

/**
 * Three series under `prefix` (`spillway_config` for the controller's limits file,
 * `spillway_proxy_rules` for the proxy's rules file):
 *
 * - `<prefix>_reloads_total{result}`: both results exported from the start at 0, so the first
 *   failed reload is an increase `rate()` sees;
 * - `<prefix>_last_reload_successful`: 1 or 0, the outcome of the newest reload. A failed reload
 *   keeps the previous file in force, and only this gauge says whether it still is the newest
 *   outcome: counters cannot order an error against a later success (the pattern of Prometheus'
 *   own `prometheus_config_last_reload_successful`; the alert rules in deploy/prometheus/ use it);
 * - `<prefix>_last_success_timestamp_seconds`: when the file in force was loaded.
 *
 * The process loaded its file at start, so the gauges start at 1 and now.
 */
export function createReloadMetrics(
  registry: Registry,
  prefix: 'spillway_config' | 'spillway_proxy_rules',
): ReloadMetrics {
  const file = prefix === 'spillway_config' ? 'Limits file' : 'Rules file';
  const reloads = new Counter({
    name: `${prefix}_reloads_total`,
    help: `${file} reloads, by result (ok, error: the previous file stays in force).`,
    labelNames: ['result'],
    registers: [registry],
  });
  for (const result of ['ok', 'error'] as const) reloads.inc({ result }, 0);
  const lastSuccessful = new Gauge({
    name: `${prefix}_last_reload_successful`,
    help: `1 if the newest ${file.toLowerCase()} reload succeeded (or none was tried since start), 0 if it failed.`,
    registers: [registry],
  });
  lastSuccessful.set(1);
  const lastSuccessAt = new Gauge({
    name: `${prefix}_last_success_timestamp_seconds`,
    help: `When the ${file.toLowerCase()} in force was loaded (epoch seconds).`,
    registers: [registry],
  });
  lastSuccessAt.set(Date.now() / 1000);
  return {
    reloaded(result) {
      reloads.inc({ result });
      lastSuccessful.set(result === 'ok' ? 1 : 0);
      if (result === 'ok') lastSuccessAt.set(Date.now() / 1000);
    },
  };
}
