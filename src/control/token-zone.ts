import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { ReportRequest } from '../gen/spillway/v1/control_pb.js';
import type { ReportContext } from '../transport/control-transport.js';

/**
 * Zone binding by token, on the receiving side. When the transport authenticated a report with a
 * zone's token (`context.tokenZone`, see the gRPC server's `zoneTokens`), the report must claim
 * that zone: otherwise ERR_SPILLWAY_INVALID_REPORT (field `zone`), before it touches any state.
 */
export function checkTokenZone(request: ReportRequest, context: ReportContext): void {
  const bound = context.tokenZone;
  if (bound === undefined || request.zone === bound) return;
  const claimed = request.zone.slice(0, 64);
  throw new SpillwayError(
    ErrorCode.InvalidReport,
    `report claims zone "${claimed}" but its token is bound to zone ${bound}`,
    { field: 'zone', zone: claimed },
  );
}

/**
 * The key a receiving tier tracks a reporter under: its id, scoped by its token's zone. A holder of
 * one zone's token reusing the id of another zone's reporter gets an entry of its own instead of
 * replacing (or squatting) that reporter's. Unscoped ids come from shared-token or unauthenticated
 * reporters, which may claim any zone anyway, so an id containing the separator gains nothing.
 */
export function reporterKey(request: ReportRequest, context: ReportContext): string {
  return context.tokenZone === undefined
    ? request.reporterId
    : `${context.tokenZone}\u0000${request.reporterId}`;
}
