import { instrumentControlClient } from '../ops/instrument-control-client.js';
import type { Logger } from '../ops/logger.js';
import type { SpillwayMetrics } from '../ops/metrics.js';
import type { ControlClient } from '../transport/control-transport.js';
import {
  createGrpcControlClient,
  type GrpcClientTlsOptions,
  type GrpcControlClientOptions,
} from '../transport/grpc-control-client.js';
import { createWorkerControlClient } from '../transport/worker-control-client.js';

/** A report thread not running by then fails startup (it loads in well under a second). */
const WORKER_START_TIMEOUT_MS = 30_000;

export interface ParentClientsOptions {
  authToken?: string;
  tls?: GrpcClientTlsOptions;
  /** The reporting interval: the longest a parent back from an outage may wait to be found. */
  intervalMs: number;
  metrics: SpillwayMetrics;
  logger: Logger;
  /**
   * Where each client's gRPC work runs. `worker` (processes that serve requests: host, proxy):
   * on a worker thread per client, so a report never stalls the request thread's event loop
   * (createWorkerControlClient); `caller` (the aggregator, which serves no requests): on this thread.
   */
  thread: 'worker' | 'caller';
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
 *
 * With `thread: 'worker'` it resolves once every worker thread runs, so the first report's deadline
 * is not spent starting one; a thread that cannot start fails the process's startup.
 */
export async function createParentClients(
  targets: readonly string[],
  options: ParentClientsOptions,
): Promise<ControlClient[]> {
  const { metrics, logger } = options;
  const grpcOptions: GrpcControlClientOptions = {
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
  };
  if (options.thread === 'caller') {
    return targets.map((target) =>
      instrumentControlClient(createGrpcControlClient(target, grpcOptions), metrics),
    );
  }
  const clients = targets.map((target) =>
    createWorkerControlClient(target, {
      ...grpcOptions,
      onWorkerError(error) {
        logger.warn(
          { parent: target, err: error.message },
          'the report thread died; reports in flight failed, the next report starts a new one',
        );
      },
    }),
  );
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      Promise.all(clients.map((client) => client.whenReady())),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`report threads not running after ${WORKER_START_TIMEOUT_MS} ms`)),
          WORKER_START_TIMEOUT_MS,
        );
      }),
    ]);
  } catch (error) {
    for (const client of clients) client.close();
    throw error;
  } finally {
    clearTimeout(timer);
  }
  return clients.map((client) => instrumentControlClient(client, metrics));
}
