import { systemClock } from '../core/clock.js';
import type { Decision } from '../core/decision.js';

/**
 * The rate limit header fields of draft-ietf-httpapi-ratelimit-headers (the structured-field
 * syntax of drafts 08+):
 *
 * ```
 * RateLimit-Policy: "payments";q=100;w=60, "burst";q=10;w=1
 * RateLimit: "payments";r=23;t=5
 * ```
 *
 * Both are Structured Field Lists (RFC 9651) of Strings with integer parameters: `q` quota,
 * `w` window seconds, `r` remaining quota units, `t` seconds until the quota resets. Every number is
 * a non-negative integer on the wire: quota and remaining round down (a client is never told it
 * has more than it has), window and reset round up (never told it may retry sooner than it may).
 */
/**
 * What a policy (or proxy bucket) may be named: letters, digits, `.`, `_`, `:`, `-`, starting with
 * a letter or digit. Printable ASCII only, so the name the structured fields carry is the name in
 * the 429 body; the proxy's rules file and the middleware's options both enforce it.
 */
export const POLICY_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]*$/;

export interface RateLimitPolicy {
  /** The policy's name as clients see it, e.g. `payments`. Printable ASCII; other characters are dropped. */
  name: string;
  /** Quota units per window (requests, or cost units). */
  limit: number;
  /** The window the quota applies to, in seconds. */
  windowSec: number;
}

export interface RateLimitEntry {
  name: string;
  remaining: number;
  resetSec: number;
}

/** The largest integer a structured field may carry (RFC 9651 §3.3.1: 15 digits). */
const MAX_SF_INTEGER = 999_999_999_999_999;

/** `RateLimit-Policy: "payments";q=100;w=60` — one list member per policy, in the order given. */
export function formatRateLimitPolicy(policies: readonly RateLimitPolicy[]): string {
  return policies
    .map(
      (policy) =>
        `${sfString(policy.name)};q=${sfInteger(policy.limit, 'floor')};w=${sfInteger(policy.windowSec, 'ceil')}`,
    )
    .join(', ');
}

/** `RateLimit: "payments";r=23;t=5` — one list member per entry, in the order given. */
export function formatRateLimit(entries: readonly RateLimitEntry[]): string {
  return entries
    .map(
      (entry) =>
        `${sfString(entry.name)};r=${sfInteger(entry.remaining, 'floor')};t=${sfInteger(entry.resetSec, 'ceil')}`,
    )
    .join(', ');
}

/**
 * `Retry-After` in whole seconds (RFC 9110 delay-seconds): rounded up, and at least 1, because
 * this is only sent with a rejection and `Retry-After: 0` invites an immediate retry storm.
 * A non-finite or negative input gives 1. Rounding up allows for float noise, as `t` does: a
 * bucket refilled at 9/s that needs 9 tokens computes 1000.0000000000001 ms, which is 1 s.
 */
export function retryAfterSeconds(retryAfterMs: number): number {
  if (!(retryAfterMs > 0) || !Number.isFinite(retryAfterMs)) return 1;
  return Math.min(MAX_SF_INTEGER, Math.max(1, Math.ceil(retryAfterMs / 1000 - 1e-9)));
}

/**
 * The header fields for one request decided against one or more policies.
 *
 * - `RateLimit-Policy` lists every policy given.
 * - `RateLimit` lists each policy's remaining quota and reset: `r` is the decision's `remaining`
 *   capped at the policy's quota; `t` is the time until `resetAtMs` (measured against `nowMs`, default
 *   `systemClock.nowMs()`, the clock the local and global limiters read) and, for a rejected decision, at least its Retry-After.
 *   A decision with `limit: 0` carries no count (the global limiter before its first directive):
 *   its policy stays in `RateLimit-Policy` but it is left out of `RateLimit` rather than claim
 *   `r=0` while admitting.
 * - `Retry-After` only when some decision is rejected: the largest wait among the rejected ones,
 *   since every policy must allow before the request does.
 *
 * Pass only the decisions a client should see: shadow-mode buckets are left out by the caller.
 * Header names are in canonical case; Node's `setHeader` treats them case-insensitively.
 */
export function rateLimitHeaders(
  decisions: readonly { policy: RateLimitPolicy; decision: Decision }[],
  nowMs: number = systemClock.nowMs(),
): Record<string, string> {
  const headers: Record<string, string> = {};
  if (decisions.length === 0) return headers;
  // Built as strings in one pass (no per-call arrays): the proxy calls this for every request.
  let policyField = '';
  let limitField = '';
  let retryAfterMs = -1;
  for (let i = 0; i < decisions.length; i++) {
    const { policy, decision } = decisions[i]!;
    const text = policyText(policy);
    policyField = i === 0 ? text.member : `${policyField}, ${text.member}`;
    // `|| 0`: a NaN (a broken custom limiter) counts as 0; Math.max alone would pass it on.
    const untilResetMs = decision.resetAtMs - nowMs;
    let resetMs = Math.max(0, untilResetMs || 0);
    if (!decision.allowed) {
      const waitMs = Math.max(0, decision.retryAfterMs || 0);
      retryAfterMs = Math.max(retryAfterMs, waitMs);
      resetMs = Math.max(resetMs, retryAfterSeconds(waitMs) * 1000);
    } else if (decision.limit === 0) {
      continue;
    }
    const remaining = sfInteger(
      decision.allowed ? Math.min(Math.max(0, decision.remaining), policy.limit) : 0,
      'floor',
    );
    const member = text.rateLimitMember(remaining, sfInteger(resetMs / 1000, 'ceil'));
    limitField = limitField === '' ? member : `${limitField}, ${member}`;
  }
  headers['RateLimit-Policy'] = policyField;
  if (limitField !== '') headers.RateLimit = limitField;
  if (retryAfterMs >= 0) headers['Retry-After'] = String(retryAfterSeconds(retryAfterMs));
  return headers;
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
export function appendListMembers(existing: string | number | readonly string[], members: string): string {
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

/**
 * One policy's formatted text. `rateLimitMember` keeps its last `RateLimit` member: for the global
 * limiter (remaining is the bucket's limit) and for any bucket under light load the rounded
 * numbers repeat request after request, and the string need not be rebuilt.
 */
class PolicyText {
  /** The policy's name as an sf-string. */
  readonly sfName: string;
  /** Its `RateLimit-Policy` member. */
  readonly member: string;
  #lastRemaining = -1;
  #lastResetSec = -1;
  #lastMember = '';

  constructor(
    readonly name: string,
    readonly limit: number,
    readonly windowSec: number,
  ) {
    this.sfName = sfString(name);
    this.member = `${this.sfName};q=${sfInteger(limit, 'floor')};w=${sfInteger(windowSec, 'ceil')}`;
  }

  /** Integers, already rounded. */
  rateLimitMember(remaining: number, resetSec: number): string {
    if (remaining !== this.#lastRemaining || resetSec !== this.#lastResetSec) {
      this.#lastMember = `${this.sfName};r=${remaining};t=${resetSec}`;
      this.#lastRemaining = remaining;
      this.#lastResetSec = resetSec;
    }
    return this.#lastMember;
  }
}

/**
 * A policy's formatted text, kept per policy object: a caller's policies are its configuration,
 * the same objects request after request. Checked against the policy's fields on every use, so a
 * policy object changed in place is formatted afresh rather than served stale.
 */
const policyTexts = new WeakMap<RateLimitPolicy, PolicyText>();

function policyText(policy: RateLimitPolicy): PolicyText {
  const cached = policyTexts.get(policy);
  if (
    cached !== undefined &&
    cached.name === policy.name &&
    cached.limit === policy.limit &&
    cached.windowSec === policy.windowSec
  ) {
    return cached;
  }
  const text = new PolicyText(policy.name, policy.limit, policy.windowSec);
  policyTexts.set(policy, text);
  return text;
}

/** An sf-string: printable ASCII only, with `"` and `\` escaped; anything else is dropped. */
function sfString(value: string): string {
  let out = '"';
  for (let i = 0; i < value.length; i++) {
    const code = value.charCodeAt(i);
    if (code < 0x20 || code > 0x7e) continue;
    if (code === 0x22 || code === 0x5c) out += '\\';
    out += value[i];
  }
  return `${out}"`;
}

function sfInteger(value: number, rounding: 'floor' | 'ceil'): number {
  if (!Number.isFinite(value)) return value > 0 ? MAX_SF_INTEGER : 0;
  // Subtracting a tiny epsilon before ceil keeps 5.0000000001 s (float noise from ms arithmetic) at 5.
  const rounded = rounding === 'floor' ? Math.floor(value) : Math.ceil(value - 1e-9);
  return Math.min(MAX_SF_INTEGER, Math.max(0, rounded));
}
