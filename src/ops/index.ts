// `spillway/ops`: what a Spillway process needs to be operated: metrics, the ops endpoint, logs.
export { addAggregatorMetrics } from './aggregator-metrics.js';
export { addControllerMetrics } from './controller-metrics.js';
export { instrumentControlClient } from './instrument-control-client.js';
export { instrumentReportHandler } from './instrument-report-handler.js';
export type { LimiterMetricsOptions } from './limiter-metrics.js';
export { addLimiterMetrics, DEFAULT_MAX_BUCKET_SERIES } from './limiter-metrics.js';
export type { LoggerOptions, LogLevel } from './logger.js';
export { createLogger, LOG_LEVELS, logListening, parseLogLevel } from './logger.js';
export type {
  Component,
  MetricsOptions,
  ReceivedReportResult,
  Sample,
  SentReportResult,
  SnapshotMetricDefinition,
  SpillwayMetrics,
} from './metrics.js';
export { createMetrics } from './metrics.js';
export type { HealthReport, OpsServer, OpsServerOptions } from './ops-server.js';
export { startOpsServer } from './ops-server.js';
