// `spillway/http/express`: rate limiting middleware for Express 5. Needs Express's types only.

export type { RateLimitPolicy } from '../rate-limit-headers.js';
export type { RateLimitStats } from '../rate-limit-middleware.js';
export type { ExpressRateLimit, ExpressRateLimitOptions } from './rate-limit.js';
export { expressRateLimit } from './rate-limit.js';
