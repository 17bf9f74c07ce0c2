import { type ReportRequest, Tier } from '../gen/spillway/v1/control_pb.js';

/**
 * How many data-plane hosts a receiver takes a report to stand for: `host_count` from an
 * aggregator (the sum of its hosts), and 1 from anything else, whatever it claims. The reporter cap
 * divides a child's offered rate by this number, so a host that sent a large `host_count` would
 * otherwise lift its own cap with it (docs/security.md).
 */
export function trustedHostCount(request: ReportRequest): number {
  return request.tier === Tier.AGGREGATOR ? request.hostCount : 1;
}
