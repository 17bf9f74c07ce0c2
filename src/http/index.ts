// `spillway/http`: the pieces every edge shares (RateLimit header fields, client address keys,
// one adapter over every limiter) and the sidecar proxy. Framework middleware lives at
// `spillway/http/express` and `spillway/http/fastify`.
export type { ClientAddressOptions, ClientAddressResolver } from './client-address.js';
export {
  createClientAddressResolver,
  createTrustedProxyMatcher,
  DEFAULT_IPV4_PREFIX_LENGTH,
  DEFAULT_IPV6_PREFIX_LENGTH,
  UNKNOWN_CLIENT_ADDRESS,
} from './client-address.js';
export type { EdgeLimiter, EdgeLimiterOptions } from './limiter-adapter.js';
export { toEdgeLimiter } from './limiter-adapter.js';
export type { KeyTableStats, ProxyBackend, ProxyBackendOptions } from './proxy/proxy-backend.js';
export { createProxyBackend } from './proxy/proxy-backend.js';
export type { ProxyServer, ProxyServerOptions } from './proxy/proxy-server.js';
export { startProxyServer } from './proxy/proxy-server.js';
export type { RateLimitEntry, RateLimitPolicy } from './rate-limit-headers.js';
export {
  formatRateLimit,
  formatRateLimitPolicy,
  POLICY_NAME_PATTERN,
  rateLimitHeaders,
  retryAfterSeconds,
} from './rate-limit-headers.js';
export type { RateLimitedBody } from './rate-limited-response.js';
export {
  RATE_LIMITED_CACHE_CONTROL,
  RATE_LIMITED_CONTENT_TYPE,
  rateLimitedBody,
  rateLimitedJson,
} from './rate-limited-response.js';
export type { ProxyRules } from './rules/proxy-rules.js';
export { loadProxyRules, parseProxyRules } from './rules/proxy-rules.js';
