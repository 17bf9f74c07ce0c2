import { assertKnownOptions, optionNames } from '../core/validate.js';
import type { RateLimitPolicy } from './rate-limit-headers.js';
import type { RateLimitMiddlewareOptions } from './rate-limit-middleware.js';

/**
 * The option names the Express and Fastify middleware know, checked when one is built: a typo is an
 * error that names it (`trustedProxy`: did you mean `trustedProxies`?), never an option silently
 * left at its default (X-Forwarded-For then never trusted, every client behind the balancer in one
 * bucket).
 */
const MIDDLEWARE_OPTIONS = optionNames<RateLimitMiddlewareOptions<unknown, unknown>>({
  limiter: true,
  policy: true,
  key: true,
  cost: true,
  trustedProxies: true,
  ipv6PrefixLength: true,
  ipv4PrefixLength: true,
  mode: true,
  onLimited: true,
  headers: true,
  skip: true,
  onError: true,
  limiterKind: true,
  clock: true,
});

const POLICY_FIELDS = optionNames<RateLimitPolicy>({ name: true, limit: true, windowSec: true });

/** Throws ERR_SPILLWAY_INVALID_OPTION for a field of the options, or of their `policy`, that `where` does not know. */
export function assertMiddlewareOptionNames(options: unknown, where: string): void {
  assertKnownOptions(options, MIDDLEWARE_OPTIONS, where);
  const policy = (options as { policy?: unknown } | null | undefined)?.policy;
  assertKnownOptions(policy, POLICY_FIELDS, `${where} policy`);
}
