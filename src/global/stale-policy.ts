import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, describeValue } from '../core/validate.js';

/**
 * What a host does with a bucket's drop ratio once its directive's TTL has passed (the control
 * plane stopped answering, or stopped computing). Every policy fails open eventually or at once;
 * none makes a request wait for the control plane.
 *
 * - `hold-then-decay` (default): keep the last ratio for `holdMs` (a few lost reports are normal),
 *   then fall linearly to 0 over `decayMs`, so a long outage ends with nothing dropped.
 * - `hold`: keep the last ratio until a new directive arrives. For buckets where overload is worse
 *   than a stale limit.
 * - `open`: drop the ratio to 0 at the first stale moment.
 */
export type StalePolicy =
  | { kind?: 'hold-then-decay'; holdMs: number; decayMs: number }
  | { kind: 'hold' }
  | { kind: 'open' };

/** Default decay after the hold: long enough to ride out a controller restart, short enough to fail open. */
export const DEFAULT_STALE_DECAY_MS = 10_000;

/** How many intervals the default policy holds a stale ratio: two lost reports in a row are not an outage. */
export const DEFAULT_STALE_HOLD_INTERVALS = 3;

export function validateStalePolicy(policy: StalePolicy): StalePolicy {
  if (typeof policy !== 'object' || policy === null) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'stalePolicy must be an object', {
      field: 'stalePolicy',
    });
  }
  if (policy.kind === 'hold' || policy.kind === 'open') {
    assertKnownOptions(policy, ['kind'], `stalePolicy { kind: '${policy.kind}' }`);
    return policy;
  }
  if (policy.kind !== undefined && policy.kind !== 'hold-then-decay') {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `stalePolicy.kind must be 'hold-then-decay', 'hold' or 'open', got ${describeValue(policy.kind)}`,
      { field: 'stalePolicy.kind' },
    );
  }
  assertKnownOptions(policy, ['kind', 'holdMs', 'decayMs'], "stalePolicy { kind: 'hold-then-decay' }");
  for (const field of ['holdMs', 'decayMs'] as const) {
    const value = policy[field];
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
      throw new SpillwayError(
        ErrorCode.InvalidOption,
        `stalePolicy.${field} must be a finite number >= 0, got ${describeValue(value)}`,
        { field: `stalePolicy.${field}` },
      );
    }
  }
  return policy;
}

/**
 * The ratio a host applies at `nowMs` for a directive of `dropRatio` that goes stale at
 * `expiresAtMs`. Evaluated by the reporter tick and when a directive arrives, never per request.
 */
export function staleDropRatio(
  policy: StalePolicy,
  dropRatio: number,
  expiresAtMs: number,
  nowMs: number,
): number {
  if (nowMs < expiresAtMs) return dropRatio;
  if (policy.kind === 'hold') return dropRatio;
  if (policy.kind === 'open') return 0;
  const decayStartMs = expiresAtMs + policy.holdMs;
  if (nowMs < decayStartMs) return dropRatio;
  if (policy.decayMs <= 0) return 0;
  const remaining = 1 - (nowMs - decayStartMs) / policy.decayMs;
  return remaining > 0 ? dropRatio * remaining : 0;
}

/** Whether the directive still counts as the host's view of the limit (fresh, or stale but held). */
export function directiveHeld(policy: StalePolicy, expiresAtMs: number, nowMs: number): boolean {
  if (nowMs < expiresAtMs) return true;
  if (policy.kind === 'hold') return true;
  if (policy.kind === 'open') return false;
  return nowMs < expiresAtMs + policy.holdMs;
}
