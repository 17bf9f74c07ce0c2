import type { Clock } from '../core/clock.js';
import { systemClock } from '../core/clock.js';
import type { AsyncLimiter, Decision, SyncLimiter } from '../core/decision.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import type { GlobalLimiter } from '../global/global-limiter.js';
import { createClientAddressResolver } from './client-address.js';
import { type EdgeLimiter, toEdgeLimiter } from './limiter-adapter.js';
import {
  formatRateLimit,
  formatRateLimitPolicy,
  type RateLimitPolicy,
  retryAfterSeconds,
} from './rate-limit-headers.js';
import { RATE_LIMITED_CACHE_CONTROL, rateLimitedJson } from './rate-limited-response.js';

/**
 * The framework-neutral body of the Express and Fastify middleware (src/http/express,
 * src/http/fastify): key and cost extraction with fallbacks, the decision, shadow mode, headers,
 * the 429 and the counters. Each framework supplies a small adapter for reading the peer and
 * writing the response; everything else is shared so both behave identically.
 */
export interface RateLimitMiddlewareOptions<Req, Res> {
  /** Any Spillway limiter: local (sync), Redis (async) or global (sync). */
  limiter: SyncLimiter | AsyncLimiter | GlobalLimiter;
  /** What clients are told in `RateLimit-Policy` and whose name appears in `RateLimit`. */
  policy: RateLimitPolicy;
  /**
   * The limiter key of a request. Default: the client address (see `trustedProxies`,
   * `ipv6PrefixLength`). A throw, a non-string or an empty string falls back to the client
   * address and is counted in `stats.keyFallbacks`; so is a key the limiter refuses as invalid
   * (too long).
   */
  key?: (req: Req) => string;
  /**
   * Units this request costs. Default 1. A throw, or anything but a finite number >= 0, falls back
   * to 1 and is counted in `stats.costFallbacks`.
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
   * `stats.hookErrors` and the default body is sent.
   */
  onLimited?: (req: Req, res: Res, decision: Decision) => void;
  /** Send `RateLimit-Policy` and `RateLimit`. Default true. `Retry-After` is sent with every 429 regardless. */
  headers?: boolean;
  /** `true` lets the request through without a decision (health checks...). A throw counts in `stats.hookErrors` and the request is decided. */
  skip?: (req: Req) => boolean;
  /**
   * A limiter call that threw (bad input the fallbacks could not repair, a broken custom limiter).
   * The request is admitted either way (fail open) and counted in `stats.limiterErrors`.
   */
  onError?: (error: unknown, req: Req) => void;
  /** Force the limiter's kind instead of detecting it (a custom synchronous limiter). See `toEdgeLimiter`. */
  limiterKind?: 'sync' | 'async';
  /** Epoch clock the `RateLimit` reset is measured against: the limiter's clock. Default the system clock. */
  clock?: Clock;
}

/** Counters since the middleware was created. Every request lands in exactly one of the first four outcomes. */
export interface RateLimitStats {
  /** Requests seen, skipped ones included. */
  readonly requests: number;
  /** Let through by `skip`, no decision. */
  readonly skipped: number;
  /** Decided and admitted (fail-open, shadow would-drops and limiter errors included). */
  readonly admitted: number;
  /** Rejected with 429 (enforce mode only; fail-closed included). */
  readonly limited: number;
  /** Would have been rejected: rejections in shadow mode, plus `reason: 'shadow'` decisions of shadow buckets. */
  readonly wouldLimit: number;
  /** Admitted because the store failed under a fail-open policy (`reason: 'fail-open'`). */
  readonly failOpen: number;
  /** Rejected because the store failed under a fail-closed policy (`reason: 'fail-closed'`). */
  readonly failClosed: number;
  /** Decided by a Redis limiter's local insurance limiter (`reason: 'insurance'`). */
  readonly insurance: number;
  /** The key function threw, returned no usable key, or returned one the limiter refused: client address used. */
  readonly keyFallbacks: number;
  /** The cost function threw or returned an invalid cost: cost 1 used. */
  readonly costFallbacks: number;
  /** The limiter threw after the fallbacks; the request was admitted. */
  readonly limiterErrors: number;
  /** `skip`, `onLimited` or `onError` threw, or (async limiters) the framework's continuation threw after the decision. */
  readonly hookErrors: number;
}

/** How a framework reads a request and writes a response. */
export interface FrameworkAdapter<Req, Res> {
  peerAddress(req: Req): string | undefined;
  forwardedFor(req: Req): string | string[] | undefined;
  /** A response header already set (by an earlier limiter or the app), or undefined; `name` is lower case. */
  getHeader(res: Res, name: string): string | number | readonly string[] | undefined;
  setHeader(res: Res, name: string, value: string): void;
  /** Set the status of a rejection (before `onLimited` runs). */
  setStatus(res: Res, statusCode: number): void;
  /** Whether the response was already ended (by `onLimited`, or the client went away). */
  ended(res: Res): boolean;
  /** End the response with a JSON body (`Content-Type: application/json; charset=utf-8`). */
  sendJson(res: Res, body: string): void;
}

/** Runs one request through the limiter; `next` continues the chain when the request is admitted. */
export type RateLimitRun<Req, Res> = (req: Req, res: Res, next: () => void) => void;

export interface RateLimitMiddleware<Req, Res> {
  run: RateLimitRun<Req, Res>;
  readonly stats: RateLimitStats;
  /** The key the middleware would use for `req` when no key function is given. */
  clientAddress(req: Req): string;
  /** Whether decisions are synchronous (local and global limiters): `next` runs before `run` returns. */
  readonly sync: boolean;
}

interface MutableStats {
  requests: number;
  skipped: number;
  admitted: number;
  limited: number;
  wouldLimit: number;
  failOpen: number;
  failClosed: number;
  insurance: number;
  keyFallbacks: number;
  costFallbacks: number;
  limiterErrors: number;
  hookErrors: number;
}

export function createRateLimitMiddleware<Req, Res>(
  options: RateLimitMiddlewareOptions<Req, Res>,
  adapter: FrameworkAdapter<Req, Res>,
): RateLimitMiddleware<Req, Res> {
  if (typeof options !== 'object' || options === null) {
    throw invalidOption('options', 'options must be an object');
  }
  const policy = validatePolicy(options.policy);
  const edge: EdgeLimiter = toEdgeLimiter(
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
  const shadow = mode === 'shadow';
  const headers = options.headers ?? true;
  if (typeof headers !== 'boolean') throw invalidOption('headers', 'headers must be a boolean');
  const clock = options.clock ?? systemClock;
  const resolveAddress = createClientAddressResolver({
    trustedProxies: options.trustedProxies,
    ipv6PrefixLength: options.ipv6PrefixLength,
    ipv4PrefixLength: options.ipv4PrefixLength,
  });
  const stats: MutableStats = {
    requests: 0,
    skipped: 0,
    admitted: 0,
    limited: 0,
    wouldLimit: 0,
    failOpen: 0,
    failClosed: 0,
    insurance: 0,
    keyFallbacks: 0,
    costFallbacks: 0,
    limiterErrors: 0,
    hookErrors: 0,
  };

  const clientAddress = (req: Req): string =>
    resolveAddress(adapter.peerAddress(req) ?? '', adapter.forwardedFor(req));

  function requestKey(req: Req): string {
    if (keyOf === undefined) return clientAddress(req);
    let key: unknown;
    try {
      key = keyOf(req);
    } catch {
      key = undefined;
    }
    if (typeof key === 'string' && key.length > 0) return key;
    stats.keyFallbacks++;
    return clientAddress(req);
  }

  function requestCost(req: Req): number {
    if (costOf === undefined) return 1;
    let cost: unknown;
    try {
      cost = costOf(req);
    } catch {
      cost = undefined;
    }
    if (typeof cost === 'number' && cost >= 0 && cost < Number.POSITIVE_INFINITY) return cost;
    stats.costFallbacks++;
    return 1;
  }

  function reportError(error: unknown, req: Req): void {
    if (onError === undefined) return;
    try {
      onError(error, req);
    } catch {
      stats.hookErrors++;
    }
  }

  function limiterFailed(error: unknown, req: Req, next: () => void): void {
    stats.limiterErrors++;
    stats.admitted++;
    reportError(error, req);
    next();
  }

  /** A user key the limiter refused (too long for it): the client address is always acceptable. */
  function refusedUserKey(error: unknown, key: string, req: Req): string | undefined {
    if (keyOf === undefined || !isSpillwayError(error, ErrorCode.InvalidKey)) return undefined;
    const fallback = clientAddress(req);
    if (fallback === key) return undefined;
    stats.keyFallbacks++;
    return fallback;
  }

  function finish(decision: Decision, req: Req, res: Res, next: () => void): void {
    const reason = decision.reason;
    if (reason !== undefined) {
      if (reason === 'fail-open') stats.failOpen++;
      else if (reason === 'fail-closed') stats.failClosed++;
      else if (reason === 'insurance') stats.insurance++;
      else if (reason === 'shadow') stats.wouldLimit++;
    }
    if (decision.allowed) {
      stats.admitted++;
      // A fail-open decision carries no real count (remaining 0, reset now): no fields rather than
      // telling clients to back off while admitting them (the proxy does the same).
      if (headers && !shadow && reason !== 'fail-open') writeHeaders(res, decision);
      next();
      return;
    }
    if (shadow) {
      stats.wouldLimit++;
      stats.admitted++;
      next();
      return;
    }
    stats.limited++;
    reject(decision, req, res);
  }

  const rateLimitField = createRateLimitField(policy);
  const policyField = formatRateLimitPolicy([policy]);
  const policyNames = [policy.name];

  function writeHeaders(res: Res, decision: Decision): void {
    addListMembers(res, 'RateLimit-Policy', 'ratelimit-policy', policyField);
    const field = rateLimitField(decision, clock.nowMs());
    if (field !== undefined) addListMembers(res, 'RateLimit', 'ratelimit', field);
  }

  /**
   * Limiters can be stacked (a per-client one, then a per-route one), and the app may have set the
   * field itself: both fields are Lists, so this policy's members are added to what is there.
   * Replacing it would tell the client it has this policy's quota while an earlier one is at zero.
   * The usual response has no field yet and costs one lookup, by the lower-case `key` the
   * frameworks store fields under (lower-casing it again then returns the same string).
   */
  function addListMembers(res: Res, name: string, key: string, members: string): void {
    const existing = adapter.getHeader(res, key);
    adapter.setHeader(res, name, existing === undefined ? members : appendMembers(existing, members));
  }

  function reject(decision: Decision, req: Req, res: Res): void {
    if (adapter.ended(res)) return;
    const retryAfterSec = retryAfterSeconds(decision.retryAfterMs);
    adapter.setStatus(res, 429);
    if (headers) writeHeaders(res, decision);
    adapter.setHeader(res, 'Retry-After', String(retryAfterSec));
    adapter.setHeader(res, 'Cache-Control', RATE_LIMITED_CACHE_CONTROL);
    if (onLimited !== undefined) {
      try {
        onLimited(req, res, decision);
      } catch {
        stats.hookErrors++;
      }
      if (adapter.ended(res)) return;
    }
    adapter.sendJson(res, rateLimitedJson(policyNames, retryAfterSec));
  }

  function shouldSkip(req: Req): boolean {
    if (skip === undefined) return false;
    try {
      return skip(req) === true;
    } catch {
      stats.hookErrors++;
      return false;
    }
  }

  let run: RateLimitRun<Req, Res>;
  if (edge.kind === 'sync') {
    const limit = edge.limit;
    // No promise, no microtask: `next` runs inside this call.
    run = (req, res, next) => {
      stats.requests++;
      if (shouldSkip(req)) {
        stats.skipped++;
        next();
        return;
      }
      const key = requestKey(req);
      const cost = requestCost(req);
      let decision: Decision;
      try {
        decision = limit(key, cost);
      } catch (error) {
        const fallback = refusedUserKey(error, key, req);
        if (fallback === undefined) {
          limiterFailed(error, req, next);
          return;
        }
        try {
          decision = limit(fallback, cost);
        } catch (retryError) {
          limiterFailed(retryError, req, next);
          return;
        }
      }
      finish(decision, req, res, next);
    };
  } else {
    const limit = edge.limit;
    run = (req, res, next) => {
      stats.requests++;
      if (shouldSkip(req)) {
        stats.skipped++;
        next();
        return;
      }
      const key = requestKey(req);
      const cost = requestCost(req);
      // Whatever throws after the decision (the framework's continuation included) is counted and
      // passed to onError, never left as an unhandled rejection that would take the process down.
      const continuationFailed = (error: unknown) => {
        stats.hookErrors++;
        reportError(error, req);
      };
      limit(key, cost)
        .then(
          (decision) => finish(decision, req, res, next),
          (error: unknown) => {
            const fallback = refusedUserKey(error, key, req);
            if (fallback === undefined) {
              limiterFailed(error, req, next);
              return;
            }
            return limit(fallback, cost).then(
              (decision) => finish(decision, req, res, next),
              (retryError: unknown) => limiterFailed(retryError, req, next),
            );
          },
        )
        .catch(continuationFailed);
    };
  }

  return { run, stats, clientAddress, sync: edge.kind === 'sync' };
}

/**
 * The `RateLimit` field of one policy's decision, exactly as `rateLimitHeaders` writes it (a
 * property test holds them equal), without its per-call arrays and objects: the field is rebuilt
 * only when the rounded remaining or reset changes, which for the global limiter (remaining is the
 * bucket's limit, reset now) is once per directive. `undefined` for a decision with no count
 * (`limit: 0`, the global limiter before its first directive).
 */
export function createRateLimitField(
  policy: RateLimitPolicy,
): (decision: Decision, nowMs: number) => string | undefined {
  let lastRemaining = Number.NaN;
  let lastResetSec = Number.NaN;
  let lastField = '';
  return (decision, nowMs) => {
    let resetMs = Math.max(0, decision.resetAtMs - nowMs);
    let remaining = 0;
    if (!decision.allowed) {
      resetMs = Math.max(resetMs, retryAfterSeconds(Math.max(0, decision.retryAfterMs)) * 1000);
    } else {
      if (decision.limit === 0) return undefined;
      remaining = Math.floor(Math.min(Math.max(0, decision.remaining), policy.limit));
    }
    // The same rounding as the shared formatter: remaining down, reset up (float noise forgiven).
    const resetSec = Math.ceil(resetMs / 1000 - 1e-9);
    if (remaining !== lastRemaining || resetSec !== lastResetSec) {
      lastField = formatRateLimit([{ name: policy.name, remaining, resetSec }]);
      lastRemaining = remaining;
      lastResetSec = resetSec;
    }
    return lastField;
  };
}

/** `members` added to a List field's value (a string, or one string per field line). */
function appendMembers(existing: string | number | readonly string[], members: string): string {
  let text = '';
  if (typeof existing === 'object') {
    for (const line of existing) {
      if (line.trim() !== '') text = text === '' ? line : `${text}, ${line}`;
    }
  } else {
    text = String(existing);
  }
  return text.trim() === '' ? members : `${text}, ${members}`;
}

function validatePolicy(policy: RateLimitPolicy): RateLimitPolicy {
  if (typeof policy !== 'object' || policy === null) {
    throw invalidOption('policy', 'policy must be { name, limit, windowSec }');
  }
  if (typeof policy.name !== 'string' || policy.name.length === 0) {
    throw invalidOption('policy', 'policy.name must be a non-empty string');
  }
  for (const field of ['limit', 'windowSec'] as const) {
    const value = policy[field];
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
      throw invalidOption('policy', `policy.${field} must be a positive finite number, got ${String(value)}`);
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
