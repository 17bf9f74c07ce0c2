// `spillway/envoy`: Envoy's rate limit service (RLS) and quota service (RLQS) over Spillway's
// limiters, from envoyproxy/ratelimit's configuration file. See docs/envoy.md.
export {
  escapeComponent,
  instanceKey,
  MAX_BUCKET_KEY_BYTES,
  overrideKey,
  templateOf,
} from './bucket-key.js';
export type {
  CompiledDomain,
  CompiledRateLimits,
  DescriptorMatch,
  DescriptorRule,
} from './descriptor-rules.js';
export { compileRateLimits, globMatch, matchDescriptor } from './descriptor-rules.js';
export type { EnvoyGrpcServer, EnvoyGrpcServerOptions, QuotaStreamHandler } from './envoy-grpc-server.js';
export {
  DEFAULT_ENVOY_MAX_MESSAGE_BYTES,
  SHOULD_RATE_LIMIT_PATH,
  STREAM_RATE_LIMIT_QUOTAS_PATH,
  startEnvoyGrpcServer,
} from './envoy-grpc-server.js';
export { limitsFromRateLimits, OVERRIDE_LIMIT_RPS } from './envoy-limits.js';
export { createGlobalBackend } from './global-backend.js';
export { createLocalBackend, DEFAULT_LOCAL_MAX_KEYS, type LocalBackendOptions } from './local-backend.js';
export type { Strategy, StrategyOptions, StrategyStyle } from './quota-assignment.js';
export { MIN_MAX_TOKENS, shareStrategy } from './quota-assignment.js';
export { bucketIdPairs, canonicalBucketId, matchBucketId } from './quota-bucket-id.js';
export { MAX_PENDING_RESPONSE_BYTES, quotaStreamHandler } from './quota-grpc.js';
export type { QuotaService, QuotaServiceOptions, QuotaSession, QuotaStats } from './quota-service.js';
export { createQuotaService, DEFAULT_QUOTA_BURST_MS, DEFAULT_QUOTA_TOLERANCE } from './quota-service.js';
export { StreamRefusal } from './quota-stream.js';
export type { RateLimitService, RateLimitServiceOptions } from './rate-limit-service.js';
export { createRateLimitService } from './rate-limit-service.js';
export type {
  DescriptorSpec,
  RateLimitDomainSpec,
  RateLimitSpec,
  RateLimitUnitName,
} from './ratelimit-config.js';
export { loadRateLimitConfig, parseRateLimitConfig, UNIT_SECONDS } from './ratelimit-config.js';
export { createRedisBackend, type RedisBackendOptions } from './redis-backend.js';
export { DEFAULT_REQUEST_BOUNDS, type RequestBounds, RequestRefusal } from './request-bounds.js';
export type { DescriptorOutcome, RlsBackend, WindowLimit } from './rls-backend.js';
export { RlsStats } from './rls-stats.js';
