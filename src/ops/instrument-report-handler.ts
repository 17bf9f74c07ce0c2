import { ErrorCode, isSpillwayError } from '../core/errors.js';
import type { ReportHandler } from '../transport/control-transport.js';
import type { ReceivedReportResult, SpillwayMetrics } from './metrics.js';

/**
 * Wraps a receiving tier's handler so each report's handling time and outcome land in
 * `spillway_report_handle_duration_seconds` and `spillway_reports_received_total`.
 */
export function instrumentReportHandler(handler: ReportHandler, metrics: SpillwayMetrics): ReportHandler {
  return async (request, context) => {
    const started = performance.now();
    let result: ReceivedReportResult = 'error';
    try {
      const response = await handler(request, context);
      result = 'ok';
      return response;
    } catch (error) {
      if (isSpillwayError(error, ErrorCode.InvalidReport)) result = 'invalid';
      throw error;
    } finally {
      metrics.observeReportReceived(result, (performance.now() - started) / 1000);
    }
  };
}
