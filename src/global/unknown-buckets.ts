import { keyFamily } from '../protocol/key-family.js';
import type { Bucket } from './bucket-handle.js';
import type { GlobalLimiterLogger } from './reporter.js';

/**
 * Buckets the control plane never answers: the controller sends a directive for every bucket it has
 * a rule for (ratio 0 included) in its first reply or two, so a bucket that offered load in
 * `UNANSWERED_REPLIES` replies from a controller generation and never got one is unknown upstream
 * (no rule of the limits file matches it, or a bound on buckets or template instances was reached):
 * it is not limited. Warned once per key family (`payments:caller=*`, key-family.ts), through the
 * limiter's logger, else as a process warning (`SPILLWAY_UNKNOWN_BUCKET`): a limit that silently
 * does not apply must reach someone.
 *
 * Memory: at most `MAX_WARNED_FAMILIES` families remembered; past it, one more line says warnings
 * stop, and further unknown buckets are only counted.
 */
export const UNANSWERED_REPLIES = 5;
export const MAX_WARNED_FAMILIES = 1_000;

export class UnknownBuckets {
  readonly #logger: GlobalLimiterLogger | undefined;
  readonly #reporterId: string;
  readonly #warned = new Set<string>();
  #full = false;
  /** Buckets found unknown, cumulative (one per bucket entry; a bucket expired and seen again counts again). */
  count = 0;

  constructor(logger: GlobalLimiterLogger | undefined, reporterId: string) {
    this.#logger = logger;
    this.#reporterId = reporterId;
  }

  /** A reply to a report that offered `bucket` load came from a controller generation, with no directive for it. */
  unanswered(bucket: Bucket): void {
    if (bucket.hasDirective || ++bucket.repliesWithoutDirective !== UNANSWERED_REPLIES) return;
    this.count++;
    const family = keyFamily(bucket.key);
    if (this.#warned.has(family) || this.#full) return;
    if (this.#warned.size >= MAX_WARNED_FAMILIES) {
      this.#full = true;
      this.#warn(
        { families: this.#warned.size },
        'global limiter: too many bucket families the control plane has no rule for; no more are logged (see spillway_buckets_without_rule_total)',
      );
      return;
    }
    this.#warned.add(family);
    this.#warn(
      { reporter: this.#reporterId, bucket: bucket.key, family, replies: UNANSWERED_REPLIES },
      `global limiter: bucket "${bucket.key}" got no directive in ${UNANSWERED_REPLIES} replies from the control plane: no rule of the controller's limits file matches it (or its bound on buckets or template instances was reached), so it is NOT limited; add a rule (e.g. template "${family}") or fix the key. Other keys of ${family} are not logged again`,
    );
  }

  #warn(fields: Record<string, unknown>, message: string): void {
    try {
      if (this.#logger) this.#logger.warn(fields, message);
      else process.emitWarning(message, { code: 'SPILLWAY_UNKNOWN_BUCKET' });
    } catch {
      // A broken logger must not stop the report loop.
    }
  }
}
