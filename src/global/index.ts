// `spillway/global`: the data plane of the global rate limiter.
export type { BucketHandle, BucketMode } from './bucket-handle.js';
export { OVERFLOW_BUCKET_KEY } from './bucket-table.js';
export type { BurstGuardOptions } from './burst-guard.js';
export { DEFAULT_BURST_GUARD } from './burst-guard.js';
export { isNewerDirective } from './directive-order.js';
export type {
  BucketSnapshot,
  GlobalLimiter,
  GlobalLimiterOptions,
  GlobalLimiterSnapshot,
} from './global-limiter.js';
export {
  createGlobalLimiter,
  DEFAULT_GLOBAL_MAX_KEY_LENGTH,
  DEFAULT_IDLE_EXPIRY_MS,
  DEFAULT_INTERVAL_MS,
  DEFAULT_JITTER_RATIO,
  DEFAULT_LOCAL_RESCALE,
  DEFAULT_MAX_BUCKETS,
} from './global-limiter.js';
export {
  FLEET_LOCAL_Z,
  FLEET_MOVE_RATIO,
  localRescaleRatio,
  RESCALE_Z,
  type RescaleInputs,
} from './local-rescale.js';
export type { GlobalLimiterLogger, ReporterStats } from './reporter.js';
export { DEFAULT_CARRY_OVER_INTERVALS, MAX_REPORT_INTERVAL_MS, MIN_REPORT_INTERVAL_MS } from './reporter.js';
export type { StalePolicy } from './stale-policy.js';
export {
  DEFAULT_STALE_DECAY_MS,
  DEFAULT_STALE_HOLD_INTERVALS,
  directiveHeld,
  staleDropRatio,
} from './stale-policy.js';
