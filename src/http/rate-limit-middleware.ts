import type { Clock } from '../core/clock.js';
import { systemClock } from '../core/clock.js';
import type { AsyncLimiter, Decision, SyncLimiter } from '../core/decision.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import { describeValue } from '../core/validate.js';
import type { GlobalLimiter } from '../global/global-limiter.js';
import { createClientAddressResolver } from './client-address.js';
import { type EdgeLimiter, toEdgeLimiter } from './limiter-adapter.js';
import {
  formatRateLimit,
  formatRateLimitPolicy,
  POLICY_NAME_PATTERN,
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
  /** The limiter threw after the fallbacks, or returned no decision; the request was admitted. */
  readonly limiterErrors: number;
  /**
   * `skip`, `onLimited` or `onError` threw or rejected, `skip` returned a promise, the rate limit
   * fields could not be written (the app had already sent the headers; the request is still
   * admitted), or (async limiters) the framework's continuation threw after the decision.
   */
  readonly hookErrors: number;
  /**
   * Admitted by an async (Redis) decision that came after the client had gone (or the response had
   * ended): the chain was not continued, as nothing would read its response.
   */
  readonly clientGone: number;
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
  /**
   * Called on a rejection before `onLimited` runs, for frameworks where a response being sent is
   * not yet `ended` (Fastify runs async `onSend` hooks first): lets `ended` see the send.
   */
  answering?(res: Res): void;
  /** End the response with a JSON body (`Content-Type: application/json; charset=utf-8`). */
  sendJson(res: Res, body: string): void;
}

/**
 * Runs one request through the limiter; `next` continues the chain when the request is admitted.
 * `next(error)` hands the framework an error the middleware could not answer itself (async
 * limiters: a rejection whose 429 could not be written).
 */
export type RateLimitRun<Req, Res> = (req: Req, res: Res, next: (error?: Error) => void) => void;

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
  clientGone: number;
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
    clientGone: 0,
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
    if (isThenable(key)) key.then(undefined, ignoreRejection);
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
    if (isThenable(cost)) cost.then(undefined, ignoreRejection);
    stats.costFallbacks++;
    return 1;
  }

  const countHookError = (): void => {
    stats.hookErrors++;
  };

  function reportError(error: unknown, req: Req): void {
    if (onError === undefined) return;
    let result: unknown;
    try {
      result = onError(error, req);
    } catch {
      stats.hookErrors++;
      return;
    }
    if (isThenable(result)) result.then(undefined, countHookError);
  }

  /**
   * A limiter call that threw. A cost above what the limiter can ever grant (`InvalidCost`: the
   * middleware passes only finite costs >= 0, so the limiter refused its size) is a rejection, not
   * a failure: admitting it would let any request past the limit by asking for more than it holds.
   */
  function limiterThrew(error: unknown, req: Req, res: Res, next: () => void): void {
    if (isSpillwayError(error, ErrorCode.InvalidCost)) {
      finish(costExceeded(), req, res, next);
      return;
    }
    limiterFailed(error, req, next);
  }

  function limiterFailed(error: unknown, req: Req, next: () => void): void {
    stats.limiterErrors++;
    stats.admitted++;
    reportError(error, req);
    next();
  }

  const windowMs = policy.windowSec * 1000;
  /** The rejection of a cost the limiter can never grant: come back after a policy window. */
  function costExceeded(): Decision {
    return {
      allowed: false,
      limit: policy.limit,
      remaining: 0,
      resetAtMs: clock.nowMs() + windowMs,
      retryAfterMs: windowMs,
    };
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
    if (!isDecision(decision)) {
      limiterFailed(
        new SpillwayError(ErrorCode.InvalidOption, 'the limiter returned something that is not a decision', {
          field: 'limiter',
        }),
        req,
        next,
      );
      return;
    }
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
      if (headers && !shadow && reason !== 'fail-open') {
        // Headers the app already sent (res.flushHeaders()) cannot take the fields: the request
        // is admitted all the same, the failure counted and reported.
        try {
          writeHeaders(res, decision);
        } catch (error) {
          stats.hookErrors++;
          reportError(error, req);
        }
      }
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
      adapter.answering?.(res);
      let result: unknown;
      try {
        result = onLimited(req, res, decision);
      } catch {
        stats.hookErrors++;
      }
      // The response itself is no promise to wait for, though Fastify's `reply` is thenable (it
      // settles when the reply ends): `return reply.header(...)` has not answered.
      if (result !== res && isThenable(result)) {
        // An async hook (`await log(); res.status(429).json(...)`) answers later: wait for it,
        // then send the default body only if it did not.
        result.then(
          () => sendDefaultLater(res, retryAfterSec),
          () => {
            stats.hookErrors++;
            sendDefaultLater(res, retryAfterSec);
          },
        );
        return;
      }
      if (adapter.ended(res)) return;
    }
    adapter.sendJson(res, rateLimitedJson(policyNames, retryAfterSec));
  }

  /** The default 429 body after an async `onLimited` settled; never throws (it runs in a promise reaction). */
  function sendDefaultLater(res: Res, retryAfterSec: number): void {
    try {
      if (!adapter.ended(res)) adapter.sendJson(res, rateLimitedJson(policyNames, retryAfterSec));
    } catch {
      stats.hookErrors++;
    }
  }

  function shouldSkip(req: Req): boolean {
    if (skip === undefined) return false;
    let result: unknown;
    try {
      result = skip(req);
    } catch {
      stats.hookErrors++;
      return false;
    }
    if (result === true) return true;
    if (isThenable(result)) {
      // A promise cannot be awaited without making every decision async: treated as a throw.
      stats.hookErrors++;
      result.then(undefined, ignoreRejection);
    }
    return false;
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
          limiterThrew(error, req, res, next);
          return;
        }
        try {
          decision = limit(fallback, cost);
        } catch (retryError) {
          limiterThrew(retryError, req, res, next);
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
      // Whether the framework's continuation was called: a throw after it is the framework's (or
      // the app's), a throw before it is the middleware's own (a 429 it could not write), and the
      // request must still be answered.
      let continued = false;
      const proceed = (): void => {
        continued = true;
        // The client left while the decision was pending: the handler's work would be for nobody
        // (the proxy does not forward such a request either). The decision was still counted.
        if (adapter.ended(res)) {
          stats.clientGone++;
          return;
        }
        next();
      };
      // Whatever throws after the decision is counted once and passed to onError, never left as an
      // unhandled rejection that would take the process down; a throw before the continuation hands
      // the error to it (`next(error)`: the framework's error response) rather than leave the
      // request hanging.
      const failed = (error: unknown): void => {
        stats.hookErrors++;
        reportError(error, req);
        if (continued || adapter.ended(res)) return;
        continued = true;
        try {
          next(error instanceof Error ? error : new Error(String(error)));
        } catch {
          // Counted above; the framework's error path failing too must not escape either.
        }
      };
      limit(key, cost)
        .then(
          (decision) => finish(decision, req, res, proceed),
          (error: unknown) => {
            const fallback = refusedUserKey(error, key, req);
            if (fallback === undefined) {
              limiterThrew(error, req, res, proceed);
              return;
            }
            return limit(fallback, cost).then(
              (decision) => finish(decision, req, res, proceed),
              (retryError: unknown) => limiterThrew(retryError, req, res, proceed),
            );
          },
        )
        .catch(failed);
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
    // `|| 0`: a NaN reset counts as 0 (Math.max alone would pass it on), so a rejection's t is
    // still at least its Retry-After.
    const untilResetMs = decision.resetAtMs - nowMs;
    let resetMs = Math.max(0, untilResetMs || 0);
    let remaining = 0;
    if (!decision.allowed) {
      resetMs = Math.max(resetMs, retryAfterSeconds(decision.retryAfterMs) * 1000);
    } else {
      if (decision.limit === 0) return undefined;
      const left = decision.remaining;
      remaining = Math.floor(Math.min(Math.max(0, left || 0), policy.limit));
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

/** What a limiter must return to be believed: `allowed` a boolean, and the numbers the fields read. */
function isDecision(value: unknown): value is Decision {
  if (typeof value !== 'object' || value === null) return false;
  const decision = value as Decision;
  return (
    typeof decision.allowed === 'boolean' &&
    typeof decision.limit === 'number' &&
    typeof decision.remaining === 'number' &&
    typeof decision.resetAtMs === 'number' &&
    typeof decision.retryAfterMs === 'number'
  );
}

/** Whether a hook returned a promise (an async function). */
function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    ((typeof value === 'object' && value !== null) || typeof value === 'function') &&
    typeof (value as PromiseLike<unknown>).then === 'function'
  );
}

/** The rejection of a promise whose failure is already counted (a key, cost or skip that returned one). */
function ignoreRejection(): void {}

function optionalFunction<F>(field: string, value: F | undefined): F | undefined {
  if (value !== undefined && typeof value !== 'function')
    throw invalidOption(field, `${field} must be a function`);
  return value;
}

function invalidOption(field: string, message: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidOption, message, { field });
}
