/**
 * The 429 every Spillway edge sends: the sidecar proxy (src/http/proxy) and the Express and
 * Fastify middleware answer a rejection with the same body and the same fields, so a client
 * cannot tell which one stands in front of a service.
 *
 * ```
 * HTTP/1.1 429 Too Many Requests
 * RateLimit-Policy: "payments";q=20;w=1
 * RateLimit: "payments";r=0;t=1
 * Retry-After: 1
 * Content-Type: application/json; charset=utf-8
 * Cache-Control: no-store
 *
 * {"error":"rate_limited","message":"rate limit exceeded: payments","policies":["payments"],"retryAfterSeconds":1}
 * ```
 *
 * The field names are the proxy's, which were documented first; clients parse them. (A type, not
 * an interface, so it is a `Record<string, unknown>` to the proxy's JSON writer.)
 */
export type RateLimitedBody = {
  error: 'rate_limited';
  /** `rate limit exceeded: <policy>, <policy>` */
  message: string;
  /** The names of the policies that rejected the request, in the order they were decided. */
  policies: string[];
  /** Whole seconds, equal to the `Retry-After` field. */
  retryAfterSeconds: number;
};

/** `Content-Type` of the 429 body. */
export const RATE_LIMITED_CONTENT_TYPE = 'application/json; charset=utf-8';

/**
 * `Cache-Control` of a 429: a rejection is about one moment and one client, and a cache that
 * stored it would serve it to others and after the quota is back.
 */
export const RATE_LIMITED_CACHE_CONTROL = 'no-store';

export function rateLimitedBody(policies: readonly string[], retryAfterSeconds: number): RateLimitedBody {
  return {
    error: 'rate_limited',
    message: `rate limit exceeded: ${policies.join(', ')}`,
    policies: [...policies],
    retryAfterSeconds,
  };
}

/** The body as sent: its JSON and a newline. */
export function rateLimitedJson(policies: readonly string[], retryAfterSeconds: number): string {
  return `${JSON.stringify(rateLimitedBody(policies, retryAfterSeconds))}\n`;
}
