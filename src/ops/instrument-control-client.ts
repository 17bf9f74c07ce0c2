import { ErrorCode, isSpillwayError } from '../core/errors.js';
import type { ControlClient } from '../transport/control-transport.js';
import type { SentReportResult, SpillwayMetrics } from './metrics.js';

/**
 * Wraps a ControlClient so every report's round trip and outcome land in
 * `spillway_report_duration_seconds` and `spillway_reports_total`. Behaviour is otherwise unchanged:
 * same results, same errors.
 */
export function instrumentControlClient(client: ControlClient, metrics: SpillwayMetrics): ControlClient {
  return {
    target: client.target,
    async report(request, options) {
      const started = performance.now();
      let result: SentReportResult = 'error';
      try {
        const response = await client.report(request, options);
        result = 'ok';
        return response;
      } catch (error) {
        if (isSpillwayError(error, ErrorCode.StoreTimeout)) result = 'timeout';
        else if (isSpillwayError(error, ErrorCode.StoreUnavailable))
          result = error.details?.refused === true ? 'refused' : 'unavailable';
        throw error;
      } finally {
        metrics.observeReportSent(client.target, result, (performance.now() - started) / 1000);
      }
    },
    ...(client.whenConnected ? { whenConnected: client.whenConnected.bind(client) } : {}),
    close: () => client.close(),
  };
}
