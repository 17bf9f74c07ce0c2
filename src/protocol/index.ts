// `spillway/protocol`: what every tier of the control protocol shares: a report's bounds (what a
// sender defaults to, what a receiver accepts) and the checks a receiver runs before any state.
export { acknowledgingId } from './acknowledging-id.js';
export { formatHostPort } from './host-port.js';
export { keyFamily } from './key-family.js';
export {
  MAX_ACKNOWLEDGED_BY_BYTES,
  MAX_REPORT_WINDOW_MS,
  RECEIVER_MAX_BUCKETS_PER_REPORT,
  RECEIVER_MAX_KEY_BYTES,
  RECEIVER_MAX_RATE_PER_SEC,
  SENDER_MAX_BUCKETS_PER_REPORT,
} from './report-bounds.js';
export { trustedHostCount } from './trusted-host-count.js';
export type { ReportLimits } from './validate-report.js';
export { validateReport } from './validate-report.js';
