import type { Decision } from '../core/decision.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import { admits, classifyDecision, decideWithLimiter, shownToClients } from './edge-decision.js';
import {
  appendListMembers,
  createRateLimitField,
  formatRateLimitPolicy,
  retryAfterSeconds,
} from './rate-limit-headers.js';
import {
  type MiddlewareSettings,
  middlewareSettings,
  type RateLimitMiddlewareOptions,
} from './rate-limit-options.js';
import { RATE_LIMITED_CACHE_CONTROL, rateLimitedJson } from './rate-limited-response.js';

export type { RateLimitMiddlewareOptions } from './rate-limit-options.js';

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

type MutableStats = { -readonly [K in keyof RateLimitStats]: RateLimitStats[K] };

/**
 * The framework-neutral body of the Express and Fastify middleware (src/http/express,
 * src/http/fastify): key and cost extraction with fallbacks, the decision, shadow mode, headers,
 * the 429 and the counters. Each framework supplies a small adapter for reading the peer and
 * writing the response; everything else is shared so both behave identically. The decision is
 * classified and shown as the proxy's is (`edge-decision.ts`).
 */
export function createRateLimitMiddleware<Req, Res>(
  options: RateLimitMiddlewareOptions<Req, Res>,
  adapter: FrameworkAdapter<Req, Res>,
): RateLimitMiddleware<Req, Res> {
  return new FrameworkRateLimit(middlewareSettings(options), adapter);
}

class FrameworkRateLimit<Req, Res> implements RateLimitMiddleware<Req, Res> {
  readonly stats: MutableStats = {
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
  readonly sync: boolean;
  readonly #settings: MiddlewareSettings<Req, Res>;
  readonly #adapter: FrameworkAdapter<Req, Res>;
  /** This policy's `RateLimit` member for a decision (rebuilt only when its numbers change). */
  readonly #rateLimitField: (decision: Decision, nowMs: number) => string | undefined;
  readonly #policyField: string;
  readonly #policyNames: string[];
  readonly #windowMs: number;
  readonly #countHookError = (): void => {
    this.stats.hookErrors++;
  };

  constructor(settings: MiddlewareSettings<Req, Res>, adapter: FrameworkAdapter<Req, Res>) {
    this.#settings = settings;
    this.#adapter = adapter;
    this.sync = settings.limiter.kind === 'sync';
    this.#rateLimitField = createRateLimitField(settings.policy);
    this.#policyField = formatRateLimitPolicy([settings.policy]);
    this.#policyNames = [settings.policy.name];
    this.#windowMs = settings.policy.windowSec * 1000;
  }

  /** Synchronous limiters decide inside this call, `next` included: no promise, no microtask. */
  readonly run: RateLimitRun<Req, Res> = (req, res, next) => {
    this.stats.requests++;
    if (this.#shouldSkip(req)) {
      this.stats.skipped++;
      next();
      return;
    }
    const key = this.#requestKey(req);
    const cost = this.#requestCost(req);
    if (this.sync) this.#decide(key, cost, req, res, next);
    else this.#decideLater(key, cost, req, res, next);
  };

  readonly clientAddress = (req: Req): string =>
    this.#settings.resolveAddress(this.#adapter.peerAddress(req) ?? '', this.#adapter.forwardedFor(req));

  #requestKey(req: Req): string {
    const keyOf = this.#settings.keyOf;
    if (keyOf === undefined) return this.clientAddress(req);
    let key: unknown;
    try {
      key = keyOf(req);
    } catch {
      key = undefined;
    }
    if (typeof key === 'string' && key.length > 0) return key;
    if (isThenable(key)) key.then(undefined, ignoreRejection);
    this.stats.keyFallbacks++;
    return this.clientAddress(req);
  }

  #requestCost(req: Req): number {
    const costOf = this.#settings.costOf;
    if (costOf === undefined) return 1;
    let cost: unknown;
    try {
      cost = costOf(req);
    } catch {
      cost = undefined;
    }
    if (typeof cost === 'number' && cost >= 0 && cost < Number.POSITIVE_INFINITY) return cost;
    if (isThenable(cost)) cost.then(undefined, ignoreRejection);
    this.stats.costFallbacks++;
    return 1;
  }

  #reportError(error: unknown, req: Req): void {
    const onError = this.#settings.onError;
    if (onError === undefined) return;
    let result: unknown;
    try {
      result = onError(error, req);
    } catch {
      this.stats.hookErrors++;
      return;
    }
    if (isThenable(result)) result.then(undefined, this.#countHookError);
  }

  /**
   * The decision for `key`, asked again with the client address when the limiter refuses a user
   * key; synchronous for a synchronous limiter (`next` runs inside this call).
   */
  #decide(key: string, cost: number, req: Req, res: Res, next: () => void): void | Promise<void> {
    const decided = (decision: Decision): void => this.#finish(decision, req, res, next);
    return decideWithLimiter(this.#settings.limiter, key, cost, decided, (error) => {
      const fallback = this.#refusedUserKey(error, key, req);
      if (fallback === undefined) return this.#limiterThrew(error, req, res, next);
      return decideWithLimiter(this.#settings.limiter, fallback, cost, decided, (retryError) =>
        this.#limiterThrew(retryError, req, res, next),
      );
    });
  }

  /**
   * A limiter call that threw. A cost above what the limiter can ever grant (`InvalidCost`: the
   * middleware passes only finite costs >= 0, so the limiter refused its size) is a rejection, not
   * a failure: admitting it would let any request past the limit by asking for more than it holds.
   */
  #limiterThrew(error: unknown, req: Req, res: Res, next: () => void): void {
    if (isSpillwayError(error, ErrorCode.InvalidCost)) {
      this.#finish(this.#costExceeded(), req, res, next);
      return;
    }
    this.#limiterFailed(error, req, next);
  }

  #limiterFailed(error: unknown, req: Req, next: () => void): void {
    this.stats.limiterErrors++;
    this.stats.admitted++;
    this.#reportError(error, req);
    next();
  }

  /** The rejection of a cost the limiter can never grant: come back after a policy window. */
  #costExceeded(): Decision {
    return {
      allowed: false,
      limit: this.#settings.policy.limit,
      remaining: 0,
      resetAtMs: this.#settings.clock.nowMs() + this.#windowMs,
      retryAfterMs: this.#windowMs,
    };
  }

  /** A user key the limiter refused (too long for it): the client address is always acceptable. */
  #refusedUserKey(error: unknown, key: string, req: Req): string | undefined {
    if (this.#settings.keyOf === undefined || !isSpillwayError(error, ErrorCode.InvalidKey)) return undefined;
    const fallback = this.clientAddress(req);
    if (fallback === key) return undefined;
    this.stats.keyFallbacks++;
    return fallback;
  }

  #finish(decision: Decision, req: Req, res: Res, next: () => void): void {
    if (!isDecision(decision)) {
      this.#limiterFailed(
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
      if (reason === 'fail-open') this.stats.failOpen++;
      else if (reason === 'fail-closed') this.stats.failClosed++;
      else if (reason === 'insurance') this.stats.insurance++;
      else if (reason === 'shadow') this.stats.wouldLimit++;
    }
    const result = classifyDecision(decision, this.#settings.shadow);
    if (!admits(result)) {
      this.stats.limited++;
      this.#reject(decision, req, res);
      return;
    }
    this.stats.admitted++;
    // Shadow mode's rejection, admitted.
    if (!decision.allowed) this.stats.wouldLimit++;
    if (this.#settings.headers && shownToClients(result, this.#settings.shadow)) {
      // Headers the app already sent (res.flushHeaders()) cannot take the fields: the request
      // is admitted all the same, the failure counted and reported.
      try {
        this.#writeHeaders(res, decision);
      } catch (error) {
        this.stats.hookErrors++;
        this.#reportError(error, req);
      }
    }
    next();
  }

  #writeHeaders(res: Res, decision: Decision): void {
    this.#addListMembers(res, 'RateLimit-Policy', 'ratelimit-policy', this.#policyField);
    const field = this.#rateLimitField(decision, this.#settings.clock.nowMs());
    if (field !== undefined) this.#addListMembers(res, 'RateLimit', 'ratelimit', field);
  }

  /**
   * Limiters can be stacked (a per-client one, then a per-route one), and the app may have set the
   * field itself: both fields are Lists, so this policy's members are added to what is there.
   * Replacing it would tell the client it has this policy's quota while an earlier one is at zero.
   * The usual response has no field yet and costs one lookup, by the lower-case `key` the
   * frameworks store fields under (lower-casing it again then returns the same string).
   */
  #addListMembers(res: Res, name: string, key: string, members: string): void {
    const existing = this.#adapter.getHeader(res, key);
    this.#adapter.setHeader(
      res,
      name,
      existing === undefined ? members : appendListMembers(existing, members),
    );
  }

  #reject(decision: Decision, req: Req, res: Res): void {
    if (this.#adapter.ended(res)) return;
    const retryAfterSec = retryAfterSeconds(decision.retryAfterMs);
    this.#adapter.setStatus(res, 429);
    if (this.#settings.headers) this.#writeHeaders(res, decision);
    this.#adapter.setHeader(res, 'Retry-After', String(retryAfterSec));
    this.#adapter.setHeader(res, 'Cache-Control', RATE_LIMITED_CACHE_CONTROL);
    const onLimited = this.#settings.onLimited;
    if (onLimited !== undefined) {
      this.#adapter.answering?.(res);
      let result: unknown;
      try {
        result = onLimited(req, res, decision);
      } catch {
        this.stats.hookErrors++;
      }
      // The response itself is no promise to wait for, though Fastify's `reply` is thenable (it
      // settles when the reply ends): `return reply.header(...)` has not answered.
      if (result !== res && isThenable(result)) {
        // An async hook (`await log(); res.status(429).json(...)`) answers later: wait for it,
        // then send the default body only if it did not.
        result.then(
          () => this.#sendDefaultLater(res, retryAfterSec),
          () => {
            this.stats.hookErrors++;
            this.#sendDefaultLater(res, retryAfterSec);
          },
        );
        return;
      }
      if (this.#adapter.ended(res)) return;
    }
    this.#adapter.sendJson(res, rateLimitedJson(this.#policyNames, retryAfterSec));
  }

  /** The default 429 body after an async `onLimited` settled; never throws (it runs in a promise reaction). */
  #sendDefaultLater(res: Res, retryAfterSec: number): void {
    try {
      if (!this.#adapter.ended(res))
        this.#adapter.sendJson(res, rateLimitedJson(this.#policyNames, retryAfterSec));
    } catch {
      this.stats.hookErrors++;
    }
  }

  #shouldSkip(req: Req): boolean {
    const skip = this.#settings.skip;
    if (skip === undefined) return false;
    let result: unknown;
    try {
      result = skip(req);
    } catch {
      this.stats.hookErrors++;
      return false;
    }
    if (result === true) return true;
    if (isThenable(result)) {
      // A promise cannot be awaited without making every decision async: treated as a throw.
      this.stats.hookErrors++;
      result.then(undefined, ignoreRejection);
    }
    return false;
  }

  /**
   * An async decision: the continuation runs in a promise reaction, where a throw must still reach
   * `onError` and a request not yet continued must still be answered.
   */
  #decideLater(key: string, cost: number, req: Req, res: Res, next: (error?: Error) => void): void {
    // Whether the framework's continuation was called: a throw after it is the framework's (or
    // the app's), a throw before it is the middleware's own (a 429 it could not write), and the
    // request must still be answered.
    let continued = false;
    const proceed = (): void => {
      continued = true;
      // The client left while the decision was pending: the handler's work would be for nobody
      // (the proxy does not forward such a request either). The decision was still counted.
      if (this.#adapter.ended(res)) {
        this.stats.clientGone++;
        return;
      }
      next();
    };
    // Whatever throws after the decision is counted once and passed to onError, never left as an
    // unhandled rejection that would take the process down; a throw before the continuation hands
    // the error to it (`next(error)`: the framework's error response) rather than leave the
    // request hanging.
    const failed = (error: unknown): void => {
      this.stats.hookErrors++;
      this.#reportError(error, req);
      if (continued || this.#adapter.ended(res)) return;
      continued = true;
      try {
        next(error instanceof Error ? error : new Error(String(error)));
      } catch {
        // Counted above; the framework's error path failing too must not escape either.
      }
    };
    (this.#decide(key, cost, req, res, proceed) as Promise<void>).catch(failed);
  }
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
