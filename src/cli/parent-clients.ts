import { instrumentControlClient } from '../ops/instrument-control-client.js';
import type { Logger } from '../ops/logger.js';
import type { SpillwayMetrics } from '../ops/metrics.js';
import type { ControlClient } from '../transport/control-transport.js';
import { createGrpcControlClient, type GrpcClientTlsOptions } from '../transport/grpc-control-client.js';

export interface ParentClientsOptions {
  authToken?: string;
  tls?: GrpcClientTlsOptions;
  /** The reporting interval: the longest a parent back from an outage may wait to be found. */
  intervalMs: number;
  metrics: SpillwayMetrics;
  logger: Logger;
}

/**
 * The gRPC clients a host, proxy or aggregator reports to its parents with, one per target, all
 * configured alike:
 *
 * - reconnect backoff capped at one interval, so a parent back from an outage is found within an
 *   interval (grpc-js's default backoff grows to seconds while it is down; docs/reliability.md);
 * - a connection whose reports time out twice in a row is replaced (a partition that drops
 *   packets otherwise leaves the old connection waiting on TCP's retransmission backoff); each
 *   replacement is logged and counted in `spillway_control_reconnects_total{parent}`;
 * - every report counted and timed (`spillway_reports_total`, `spillway_report_duration_seconds`).
 */
export function createParentClients(
  targets: readonly string[],
  options: ParentClientsOptions,
): ControlClient[] {
  const { metrics, logger } = options;
  return targets.map((target) =>
    instrumentControlClient(
      createGrpcControlClient(target, {
        authToken: options.authToken,
        ...(options.tls ? { tls: options.tls } : {}),
        channelOptions: { 'grpc.max_reconnect_backoff_ms': Math.max(250, options.intervalMs) },
        onReconnect(event) {
          metrics.countReconnect(event.target);
          logger.warn(
            {
              parent: event.target,
              timeouts: event.timeouts,
              wasReady: event.wasReady,
              replacementsSinceSuccess: event.replacementsSinceSuccess,
            },
            'reports to a parent timed out in a row; replacing the connection',
          );
        },
      }),
      metrics,
    ),
  );
}
