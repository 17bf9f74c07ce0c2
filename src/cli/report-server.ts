import { instrumentReportHandler } from '../ops/instrument-report-handler.js';
import type { Logger } from '../ops/logger.js';
import type { SpillwayMetrics } from '../ops/metrics.js';
import type { ReportHandler } from '../transport/control-transport.js';
import {
  type GrpcControlServer,
  type GrpcControlServerOptions,
  startGrpcControlServer,
} from '../transport/grpc-control-server.js';

/** A tier that receives reports (the aggregator, the controller). */
export interface ReportReceiver {
  handleReport: ReportHandler;
  /** Counts a report the transport refused before the handler ran, by its error code. */
  countRefusal(code: string): void;
}

export interface ReportServerOptions
  extends Pick<GrpcControlServerOptions, 'host' | 'port' | 'authToken' | 'zoneTokens' | 'tls'> {
  metrics: SpillwayMetrics;
  logger: Logger;
}

/**
 * Serves `receiver`'s reports over gRPC: each one counted and timed, a report refused before the
 * handler (undecodable, over bounds, no token) counted both in the process's metrics and by the
 * receiver with the reports it refuses, a handler failure logged.
 */
export function serveReports(
  receiver: ReportReceiver,
  options: ReportServerOptions,
): Promise<GrpcControlServer> {
  const { metrics, logger, ...server } = options;
  return startGrpcControlServer({
    ...server,
    handler: instrumentReportHandler(receiver.handleReport, metrics),
    onRefused: ({ result, code }) => {
      metrics.countReportRefused(result);
      if (code !== undefined) receiver.countRefusal(code);
    },
    onError: (error, { peer }) => logger.error({ peer, err: String(error) }, 'report handler failed'),
  });
}
