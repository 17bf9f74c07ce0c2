import { type Cancellable, type Scheduler, systemScheduler } from '../core/clock.js';
import type { AsyncLimiter, Decision, StoreFault, SyncLimiter } from '../core/decision.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertCost, assertKey, DEFAULT_MAX_KEY_LENGTH, describeValue } from '../core/validate.js';
import { type LuaScript, runLuaScript } from './lua-script.js';
import { RedisClockOffset } from './redis-clock-offset.js';
import type { RedisScriptClient } from './redis-script-client.js';

/** What a Redis limiter decides when Redis does not answer in time or answers with an error. */
export type FailPolicy = 'open' | 'closed';

export interface RedisLimiterCommonOptions {
  redis: RedisScriptClient;
  /** Key prefix, default `spillway`. Use one prefix per limit definition: same prefix + key = same state. */
  prefix?: string;
  /** Upper bound on one call, default 100 ms; past it the fault policy decides. Enforced here, whatever the client's own timeouts. */
  timeoutMs?: number;
  /** Default `open`: a broken Redis admits traffic (logged and counted) rather than failing every request. */
  failPolicy?: FailPolicy;
  /** A local limiter that decides while Redis is unreachable, instead of the fail policy. */
  insurance?: SyncLimiter;
  /** pino-compatible. Faults are logged at most once per 10 s per limiter, with a count of those suppressed. */
  logger?: { warn(obj: object, msg: string): void };
  /** Longest accepted key, default DEFAULT_MAX_KEY_LENGTH. */
  maxKeyLength?: number;
  /**
   * Timers and clock for the per-call timeout (and its deadline sent to Redis, converted to the
   * Redis clock) and log throttling. Never used for limiting decisions.
   */
  scheduler?: Scheduler;
}

/** Every option the Redis limiters share, for `optionNames` of each factory's own options. */
export const REDIS_COMMON_OPTIONS = {
  redis: true,
  prefix: true,
  timeoutMs: true,
  failPolicy: true,
  insurance: true,
  logger: true,
  maxKeyLength: true,
  scheduler: true,
} as const satisfies { readonly [K in keyof Required<RedisLimiterCommonOptions>]: true };

/** Counters since construction. `calls` counts calls that passed validation. */
export interface RedisLimiterStats {
  readonly calls: number;
  readonly timeouts: number;
  readonly errors: number;
  readonly failOpen: number;
  readonly failClosed: number;
  readonly insurance: number;
  readonly noscriptReloads: number;
  /**
   * Replies saying the script reached Redis after the call's deadline and changed nothing (a
   * paused Redis running its backlog). Nearly all come after their caller was answered by the
   * fault policy; one that comes while its caller still waits is retried once.
   */
  readonly expired: number;
}

export interface RedisLimiter extends AsyncLimiter {
  /**
   * Decide one call of `cost` (default 1) for `key`. Throws only on invalid input (before any Redis
   * command); a Redis fault resolves with the fail policy's or insurance limiter's decision.
   */
  limit(key: string, cost?: number): Promise<Decision>;
  readonly stats: RedisLimiterStats;
}

/** retryAfterMs of a fail-closed decision: long enough not to hammer a struggling Redis. */
export const FAIL_CLOSED_RETRY_AFTER_MS = 1000;
const LOG_INTERVAL_MS = 10_000;
const DEFAULT_TIMEOUT_MS = 100;

/** What differs between the algorithms; the call path around the script is shared. */
export interface RedisAlgorithm {
  /** `fixed-window`, `sliding-log`...: used in logs. */
  name: string;
  script: LuaScript;
  /** The decision's `limit` (window limit or bucket capacity); also the largest cost accepted. */
  limit: number;
  /** Window counters count whole requests; the token bucket accepts fractional cost. */
  integerCost: boolean;
  /** Every Redis key the script touches for `key`, built with redisKey() so they share a hash tag. */
  keys(prefix: string, key: string): string[];
  /**
   * ARGV: configuration and cost, never a time (the script decides on Redis TIME). The call path
   * appends one more argument to the (new) array returned, the call's deadline in Redis time
   * (see RedisClockOffset).
   */
  args(cost: number): (string | number)[];
  /** The script replies `remaining` multiplied by this (token bucket: millionths); default 1. */
  remainingScale?: number;
}

interface ResolvedCommon {
  redis: RedisScriptClient;
  prefix: string;
  timeoutMs: number;
  failPolicy: FailPolicy;
  insurance: SyncLimiter | undefined;
  logger: { warn(obj: object, msg: string): void } | undefined;
  maxKeyLength: number;
  scheduler: Scheduler;
}

function invalidOption(field: string, message: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidOption, message, { field });
}

/** Checks the options shared by every Redis limiter; runs at construction, before any Redis command. */
export function resolveCommonOptions(o: RedisLimiterCommonOptions): ResolvedCommon {
  if (typeof o !== 'object' || o === null) throw invalidOption('options', 'options must be an object');
  const redis = o.redis;
  if (
    typeof redis !== 'object' ||
    redis === null ||
    typeof redis.evalsha !== 'function' ||
    typeof redis.eval !== 'function'
  ) {
    throw invalidOption('redis', 'redis must be a RedisScriptClient (wrap ioredis with ioredisAdapter())');
  }
  const prefix = o.prefix ?? 'spillway';
  if (typeof prefix !== 'string' || prefix.length === 0 || /[{}]/.test(prefix)) {
    throw invalidOption(
      'prefix',
      'prefix must be a non-empty string without { or } (they would move the hash tag)',
    );
  }
  const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  // At most what a Node timer holds (2^31 - 1 ms): past it the timer fires after 1 ms, in a loop.
  if (
    typeof timeoutMs !== 'number' ||
    !Number.isFinite(timeoutMs) ||
    timeoutMs <= 0 ||
    timeoutMs > 2_147_483_647
  ) {
    throw invalidOption(
      'timeoutMs',
      `timeoutMs must be a positive number of ms up to 2147483647, got ${describeValue(timeoutMs)}`,
    );
  }
  const failPolicy = o.failPolicy ?? 'open';
  if (failPolicy !== 'open' && failPolicy !== 'closed') {
    throw invalidOption(
      'failPolicy',
      `failPolicy must be 'open' or 'closed', got ${describeValue(failPolicy)}`,
    );
  }
  if (o.insurance !== undefined && typeof o.insurance?.limit !== 'function') {
    throw invalidOption('insurance', 'insurance must be a synchronous limiter with limit(key, cost)');
  }
  if (o.logger !== undefined && typeof o.logger?.warn !== 'function') {
    throw invalidOption('logger', 'logger must have warn(obj, msg)');
  }
  const maxKeyLength = o.maxKeyLength ?? DEFAULT_MAX_KEY_LENGTH;
  if (typeof maxKeyLength !== 'number' || !Number.isSafeInteger(maxKeyLength) || maxKeyLength <= 0) {
    throw invalidOption(
      'maxKeyLength',
      `maxKeyLength must be a positive integer, got ${describeValue(maxKeyLength)}`,
    );
  }
  return {
    redis,
    prefix,
    timeoutMs,
    failPolicy,
    insurance: o.insurance,
    logger: o.logger,
    maxKeyLength,
    scheduler: o.scheduler ?? systemScheduler,
  };
}

/** Reply, error or timeout, whichever settles a call first. */
enum Settled {
  Pending,
  Reply,
  Error,
  Timeout,
}

/**
 * One call in flight. It doubles as the `{ aborted }` signal handed to runLuaScript(): once the
 * timeout has answered the caller, a NOSCRIPT error must not be followed by an EVAL.
 */
class PendingCall {
  state = Settled.Pending;
  value: unknown;
  aborted = false;
  /** Whether the script already came back "expired" once while the caller was waiting. */
  retried = false;
  resolve: (() => void) | undefined;
  constructor(
    /** When the script was last sent (local clock); a clock sample's start. */
    public sentMs: number,
    readonly deadlineMs: number,
    readonly keys: string[],
    readonly cost: number,
  ) {}
}

/** The scripts' first reply element when Redis TIME was past the call's deadline. */
const EXPIRED = -1;
/**
 * One reply in this many is a clock sample (and every "expired" one): reading the local clock for
 * each receipt time is a noticeable share of the call path's own CPU (docs/redis-limiters.md,
 * "Cost per call"), and samples this frequent add nothing an estimate over 10 s windows needs.
 */
const CLOCK_SAMPLE_EVERY = 8;

/**
 * The call path every Redis limiter shares: validate, run the script with EVALSHA/EVAL under a
 * timeout, parse the reply, and on a fault decide by insurance or policy (counted and logged).
 */
export function createRedisLimiter(
  options: RedisLimiterCommonOptions,
  algorithm: RedisAlgorithm,
): RedisLimiter {
  const common = resolveCommonOptions(options);
  const { redis, prefix, timeoutMs, failPolicy, insurance, logger, maxKeyLength, scheduler } = common;
  const stats = {
    calls: 0,
    timeouts: 0,
    errors: 0,
    failOpen: 0,
    failClosed: 0,
    insurance: 0,
    noscriptReloads: 0,
    expired: 0,
  };
  const redisClock = new RedisClockOffset();
  let replies = 0;
  const remainingScale = algorithm.remainingScale ?? 1;
  const onReload = () => {
    stats.noscriptReloads++;
  };
  let lastLogMs = Number.NEGATIVE_INFINITY;
  let suppressedLogs = 0;

  function logFault(fault: StoreFault, error: unknown, decidedBy: string): void {
    if (!logger) return;
    const nowMs = scheduler.nowMs();
    if (nowMs - lastLogMs < LOG_INTERVAL_MS) {
      suppressedLogs++;
      return;
    }
    const suppressed = suppressedLogs;
    lastLogMs = nowMs;
    suppressedLogs = 0;
    try {
      logger.warn(
        {
          limiter: algorithm.name,
          prefix,
          storeFault: fault,
          decidedBy,
          timeoutMs,
          err: error instanceof Error ? error.message : error === undefined ? undefined : String(error),
          suppressed,
          stats: { ...stats },
        },
        `spillway: Redis ${algorithm.name} limiter store ${fault === 'timeout' ? 'timed out' : 'failed'}; decided by ${decidedBy}`,
      );
    } catch {
      // A broken logger must not turn a store fault into a thrown limit() call.
    }
  }

  function faultDecision(key: string, cost: number, fault: StoreFault, error: unknown): Decision {
    if (fault === 'timeout') stats.timeouts++;
    else stats.errors++;
    if (insurance) {
      try {
        const decision = insurance.limit(key, cost);
        stats.insurance++;
        logFault(fault, error, 'insurance');
        return { ...decision, reason: 'insurance', storeFault: fault };
      } catch (insuranceError) {
        // e.g. a cost the (smaller) insurance limit rejects as invalid: fall back to the policy.
        logFault(fault, insuranceError, `fail-${failPolicy} (insurance threw)`);
      }
    } else {
      logFault(fault, error, `fail-${failPolicy}`);
    }
    const nowMs = Math.floor(scheduler.nowMs());
    if (failPolicy === 'open') {
      stats.failOpen++;
      return {
        allowed: true,
        limit: algorithm.limit,
        remaining: 0,
        resetAtMs: nowMs,
        retryAfterMs: 0,
        reason: 'fail-open',
        storeFault: fault,
      };
    }
    stats.failClosed++;
    return {
      allowed: false,
      limit: algorithm.limit,
      remaining: 0,
      resetAtMs: nowMs + FAIL_CLOSED_RETRY_AFTER_MS,
      retryAfterMs: FAIL_CLOSED_RETRY_AFTER_MS,
      reason: 'fail-closed',
      storeFault: fault,
    };
  }

  // Calls in flight, in deadline order: every call gets the same timeoutMs, so arrival order is
  // deadline order and one timer, armed for the oldest unsettled call, serves them all (instead
  // of a timer set and cleared per call). It is not cancelled when the last call settles: it fires
  // once more, finds nothing due and is not armed again (system timers are unref'd).
  let inFlight: PendingCall[] = [];
  let head = 0;
  let live = 0;
  let timer: Cancellable | undefined;

  function settle(call: PendingCall, state: Settled, value: unknown): void {
    if (call.state !== Settled.Pending) return;
    call.state = state;
    call.value = value;
    live--;
    call.resolve?.();
    if (live === 0) {
      inFlight = [];
      head = 0;
    }
  }

  function expireDue(): void {
    timer = undefined;
    const nowMs = scheduler.nowMs();
    while (head < inFlight.length) {
      const call = inFlight[head]!;
      if (call.state === Settled.Pending && call.deadlineMs > nowMs) break;
      head++;
      if (call.state === Settled.Pending) {
        call.aborted = true;
        settle(call, Settled.Timeout, undefined);
      }
    }
    if (head >= inFlight.length) {
      inFlight = [];
      head = 0;
      return;
    }
    if (head > 1024 && head * 2 > inFlight.length) {
      inFlight = inFlight.slice(head);
      head = 0;
    }
    timer = scheduler.setTimeout(expireDue, inFlight[head]!.deadlineMs - nowMs);
  }

  /**
   * Sends the script with the call's deadline on the Redis clock as last estimated: a script that
   * starts later changes nothing, so a call answered by the fault policy is not also counted when
   * a paused Redis resumes. Until a reply has shown the Redis clock the deadline is 0, none.
   * Never rejects: whichever of reply, error and timeout comes first settles the call, and a reply
   * or error arriving after the timeout is dropped (the handlers attached here also keep a late
   * rejection from being reported as unhandled).
   */
  function send(call: PendingCall): void {
    const args = algorithm.args(call.cost);
    args.push(redisClock.serverDeadlineMs(call.deadlineMs));
    runLuaScript(redis, algorithm.script, call.keys, args, onReload, call).then(
      (reply) => {
        if (onReply(call, reply)) send(call);
      },
      (error: unknown) => settle(call, Settled.Error, error),
    );
  }

  /**
   * Learns the Redis clock from replies, late ones too. Returns true when the script came back
   * "expired" while its caller is still waiting: the clock estimate was too low (a Redis clock
   * stepped forward, a Cluster node ahead of the others), the script changed nothing, and the call
   * is worth sending again with the estimate this reply corrected, once.
   */
  function onReply(call: PendingCall, reply: unknown): boolean {
    if (Array.isArray(reply) && reply.length === 5) {
      const expired = Number(reply[0]) === EXPIRED;
      if (!expired && replies++ % CLOCK_SAMPLE_EVERY !== 0) {
        settle(call, Settled.Reply, reply);
        return false;
      }
      const receivedMs = scheduler.nowMs();
      redisClock.observe(call.sentMs, Number(reply[4]) / 1000, receivedMs);
      if (expired) {
        stats.expired++;
        if (call.state !== Settled.Pending) return false;
        if (!call.retried && receivedMs < call.deadlineMs) {
          call.retried = true;
          call.sentMs = receivedMs;
          return true;
        }
        settle(call, Settled.Timeout, undefined);
        return false;
      }
    }
    settle(call, Settled.Reply, reply);
    return false;
  }

  async function limit(key: string, cost = 1): Promise<Decision> {
    assertKey(key, maxKeyLength);
    assertCost(cost, algorithm.limit);
    if (algorithm.integerCost && !Number.isInteger(cost)) {
      throw new SpillwayError(
        ErrorCode.InvalidCost,
        `cost must be a whole number for a ${algorithm.name} limiter, got ${cost}`,
        { field: 'cost' },
      );
    }
    stats.calls++;
    const nowMs = scheduler.nowMs();
    const call = new PendingCall(nowMs, nowMs + timeoutMs, algorithm.keys(prefix, key), cost);
    inFlight.push(call);
    live++;
    if (timer === undefined) timer = scheduler.setTimeout(expireDue, timeoutMs);
    // send() is shared, not a closure made here per call: a closure per call costs (docs/redis-limiters.md).
    send(call);
    if (call.state === Settled.Pending) {
      await new Promise<void>((resolve) => {
        call.resolve = resolve;
      });
    }
    if (call.state === Settled.Timeout) return faultDecision(key, cost, 'timeout', undefined);
    if (call.state === Settled.Error) return faultDecision(key, cost, 'error', call.value);
    const decision = parseReply(call.value, algorithm.limit, remainingScale);
    if (!decision)
      return faultDecision(key, cost, 'error', new Error(`unexpected script reply ${String(call.value)}`));
    return decision;
  }

  return { limit, stats };
}

/**
 * Scripts reply `{allowed, remaining, reset_at_ms, retry_after_ms, now_us}` as integers (or decimal
 * strings); onReply() has taken `now_us` and the "expired" reply. A reply without `now_us` (a test
 * double, a hand-written client) is still a decision; it just teaches the clock estimate nothing.
 */
function parseReply(reply: unknown, limit: number, remainingScale: number): Decision | undefined {
  if (!Array.isArray(reply) || (reply.length !== 4 && reply.length !== 5)) return undefined;
  const allowed = Number(reply[0]);
  if (allowed !== 0 && allowed !== 1) return undefined;
  const remaining = Number(reply[1]) / remainingScale;
  const resetAtMs = Number(reply[2]);
  const retryAfterMs = Number(reply[3]);
  if (
    !Number.isFinite(allowed) ||
    !Number.isFinite(remaining) ||
    !Number.isFinite(resetAtMs) ||
    !Number.isFinite(retryAfterMs)
  ) {
    return undefined;
  }
  return {
    allowed: allowed === 1,
    limit,
    remaining: Math.max(0, remaining),
    resetAtMs,
    retryAfterMs: Math.max(0, retryAfterMs),
  };
}
