export type { CompiledLimits, ResolvedBucket } from './compile-limits.js';
export { compileLimits, matchBucket } from './compile-limits.js';
export type {
  BucketRule,
  BucketTuning,
  ConfigIssue,
  LimitsConfig,
  RatioPolicySpec,
} from './limits-config.js';
export {
  checkLimitsConfig,
  DEFAULT_INTERVAL_MS,
  DEFAULT_MAX_INSTANCES,
  DEFAULT_TTL_INTERVALS,
  formatConfigPath,
  loadLimitsConfig,
  MAX_BUCKET_KEY_BYTES,
  parseLimitsConfig,
} from './limits-config.js';
