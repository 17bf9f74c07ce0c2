import type { Clock } from '../core/clock.js';
import { systemClock } from '../core/clock.js';
import type { AsyncLimiter, Decision, SyncLimiter } from '../core/decision.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { describeValue } from '../core/validate.js';
import type { GlobalLimiter } from '../global/global-limiter.js';
import { type ClientAddressResolver, createClientAddressResolver } from './client-address.js';
import { type EdgeLimiter, toEdgeLimiter } from './limiter-adapter.js';
import { POLICY_NAME_PATTERN, type RateLimitPolicy } from './rate-limit-headers.js';

/** What the Express and Fastify middleware are configured with (`createRateLimitMiddleware`). */
export interface RateLimitMiddlewareOptions<Req, Res> {
  /** Any Spillway limiter: local (sync), Redis (async) or global (sync). */
  limiter: SyncLimiter | AsyncLimiter | GlobalLimiter;
  /** What clients are told in `RateLimit-Policy` and whose name appears in `RateLimit`. */
  policy: RateLimitPolicy;
  /**
   * The limiter key of a request. Default: the client address (see `trustedProxies`,
   * `ipv6PrefixLength`). A throw, a non-string or an empty string falls back to the client
   * address and is counted in `stats.keyFallbacks`; so is a key the limiter refuses as invalid
   * (too long), and so is a promise (an async function): the key is needed synchronously, so a
   * promise is never awaited, and its rejection is caught.
   */
  key?: (req: Req) => string;
  /**
   * Units this request costs. Default 1. A throw, or anything but a finite number >= 0 (a promise
   * included, its rejection caught), falls back to 1 and is counted in `stats.costFallbacks`. A
   * cost larger than the limiter can ever grant (above its capacity) is rejected with 429 and a
   * `Retry-After` of the policy's window.
   */
  cost?: (req: Req) => number;
  /** Proxies whose X-Forwarded-For is believed (CIDRs, addresses, `loopback`, `private`, `linklocal`). Default none. */
  trustedProxies?: string[];
  /** IPv6 clients are keyed by this prefix. Default 64. */
  ipv6PrefixLength?: number;
  /** IPv4 clients are keyed by this prefix. Default 32. */
  ipv4PrefixLength?: number;
  /**
   * `shadow`: decide and count (`stats.wouldLimit`) but admit every request and send no rate limit
   * header, so clients cannot tell. Default `enforce`.
   */
  mode?: 'enforce' | 'shadow';
  /**
   * Called on a rejection after the status (429) and headers are set. If it ends the response
   * itself (a custom body), the default JSON body is not sent. A throw is counted in
   * `stats.hookErrors` and the default body is sent. If it returns a promise (an async function),
   * the middleware waits for it to settle before deciding: the default body is sent only if the
   * response is still not ended then; a rejection is counted in `stats.hookErrors`.
   */
  onLimited?: (req: Req, res: Res, decision: Decision) => void;
  /** Send `RateLimit-Policy` and `RateLimit`. Default true. `Retry-After` is sent with every 429 regardless. */
  headers?: boolean;
  /**
   * `true` lets the request through without a decision (health checks...). A throw counts in
   * `stats.hookErrors` and the request is decided; so does a promise (an async function), which is
   * never awaited (its rejection is caught).
   */
  skip?: (req: Req) => boolean;
  /**
   * A limiter call that threw or gave something that is not a decision (a broken custom limiter),
   * bad input the fallbacks could not repair, or (see `stats.hookErrors`) a response the middleware
   * could not write. A limiter failure is admitted (fail open) and counted in `stats.limiterErrors`.
   * A throw or a rejected promise from this hook is counted in `stats.hookErrors`.
   */
  onError?: (error: unknown, req: Req) => void;
  /** Force the limiter's kind instead of detecting it (a custom synchronous limiter). See `toEdgeLimiter`. */
  limiterKind?: 'sync' | 'async';
  /** Epoch clock the `RateLimit` reset is measured against: the limiter's clock. Default the system clock. */
  clock?: Clock;
}

/** The options as the middleware runs with them: checked, defaults applied, the limiter wrapped. */
export interface MiddlewareSettings<Req, Res> {
  policy: RateLimitPolicy;
  limiter: EdgeLimiter;
  keyOf: ((req: Req) => string) | undefined;
  costOf: ((req: Req) => number) | undefined;
  skip: ((req: Req) => boolean) | undefined;
  onLimited: ((req: Req, res: Res, decision: Decision) => void) | undefined;
  onError: ((error: unknown, req: Req) => void) | undefined;
  shadow: boolean;
  headers: boolean;
  clock: Clock;
  resolveAddress: ClientAddressResolver;
}

/** Checks `options` (ERR_SPILLWAY_INVALID_OPTION naming the field) and applies the defaults. */
export function middlewareSettings<Req, Res>(
  options: RateLimitMiddlewareOptions<Req, Res>,
): MiddlewareSettings<Req, Res> {
  if (typeof options !== 'object' || options === null) {
    throw invalidOption('options', 'options must be an object');
  }
  const policy = validatePolicy(options.policy);
  const limiter = toEdgeLimiter(
    options.limiter,
    options.limiterKind === undefined ? {} : { kind: options.limiterKind },
  );
  const keyOf = optionalFunction('key', options.key);
  const costOf = optionalFunction('cost', options.cost);
  const skip = optionalFunction('skip', options.skip);
  const onLimited = optionalFunction('onLimited', options.onLimited);
  const onError = optionalFunction('onError', options.onError);
  const mode = options.mode ?? 'enforce';
  if (mode !== 'enforce' && mode !== 'shadow')
    throw invalidOption('mode', "mode must be 'enforce' or 'shadow'");
  const headers = options.headers ?? true;
  if (typeof headers !== 'boolean') throw invalidOption('headers', 'headers must be a boolean');
  const resolveAddress = createClientAddressResolver({
    trustedProxies: options.trustedProxies,
    ipv6PrefixLength: options.ipv6PrefixLength,
    ipv4PrefixLength: options.ipv4PrefixLength,
  });
  return {
    policy,
    limiter,
    keyOf,
    costOf,
    skip,
    onLimited,
    onError,
    shadow: mode === 'shadow',
    headers,
    clock: options.clock ?? systemClock,
    resolveAddress,
  };
}

function validatePolicy(policy: RateLimitPolicy): RateLimitPolicy {
  if (typeof policy !== 'object' || policy === null) {
    throw invalidOption('policy', 'policy must be { name, limit, windowSec }');
  }
  if (typeof policy.name !== 'string' || !POLICY_NAME_PATTERN.test(policy.name)) {
    throw invalidOption(
      'policy.name',
      `policy.name must be letters, digits, ".", "_", ":" or "-", starting with a letter or digit (the proxy's bucket names), got ${JSON.stringify(policy.name)}`,
    );
  }
  for (const field of ['limit', 'windowSec'] as const) {
    const value = policy[field];
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
      throw invalidOption(
        'policy',
        `policy.${field} must be a positive finite number, got ${describeValue(value)}`,
      );
    }
  }
  return { name: policy.name, limit: policy.limit, windowSec: policy.windowSec };
}

function optionalFunction<F>(field: string, value: F | undefined): F | undefined {
  if (value !== undefined && typeof value !== 'function')
    throw invalidOption(field, `${field} must be a function`);
  return value;
}

function invalidOption(field: string, message: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidOption, message, { field });
}
