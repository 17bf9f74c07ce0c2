// `spillway/http/fastify`: rate limiting plugin and onRequest hook for Fastify 5. Needs Fastify's types only.

export type { RateLimitPolicy } from '../rate-limit-headers.js';
export type { RateLimitStats } from '../rate-limit-middleware.js';
export type { FastifyRateLimit, FastifyRateLimitHook, FastifyRateLimitOptions } from './rate-limit.js';
export { fastifyRateLimit } from './rate-limit.js';
