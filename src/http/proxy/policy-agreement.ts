import type { GlobalLimiter } from '../../global/global-limiter.js';
import type { ProxyBucket } from '../rules/proxy-rules.js';

/**
 * With the global backend the controller's limits file decides a bucket's limit; a rule's own
 * `limit` / `windowSec` only fill `RateLimit-Policy` (q, w). When they disagree with the directives
 * the limiter holds, clients are told a quota that is not the one enforced: this says so, once per
 * rule and controller limit (a template's overrides differ on purpose, and are named as a likely
 * cause). Reads the limiter's snapshot every `checkEveryMs`, never the request path.
 *
 * Memory: the (rule, limit) pairs warned about, at most `MAX_WARNINGS`; then it stops.
 */
export interface PolicyAgreementOptions {
  limiter: GlobalLimiter;
  /** The rules in force now (they change on reload). */
  buckets: () => readonly ProxyBucket[];
  logger: { warn(obj: object, msg: string): void } | undefined;
  /** Default 5 s. */
  checkEveryMs?: number;
}

const MAX_WARNINGS = 100;
/** Limits within this fraction of each other agree (float noise in limit / windowSec). */
const TOLERANCE = 1e-6;

/** Starts the checks; returns a function that stops them. */
export function watchPolicyAgreement(options: PolicyAgreementOptions): () => void {
  const warned = new Set<string>();
  const check = (): void => {
    if (warned.size >= MAX_WARNINGS) return;
    const buckets = options.buckets().filter((b) => !b.shadow);
    if (buckets.length === 0) return;
    for (const held of options.limiter.snapshot().buckets) {
      if (held.directiveAgeMs === undefined) continue;
      const rule = buckets.find((b) => b.key.matches(held.key));
      if (rule === undefined) continue;
      const { name, limit, windowSec } = rule.config;
      const ruleRps = limit / windowSec;
      if (Math.abs(ruleRps - held.limitRps) <= TOLERANCE * Math.max(ruleRps, held.limitRps)) continue;
      const id = `${name}\u0000${held.limitRps}`;
      if (warned.has(id)) continue;
      warned.add(id);
      options.logger?.warn(
        {
          bucket: name,
          key: held.key,
          ruleLimit: limit,
          ruleWindowSec: windowSec,
          controllerLimitRps: held.limitRps,
        },
        `proxy: bucket "${name}" says ${limit} per ${windowSec} s (${ruleRps}/s) in RateLimit-Policy, but the controller limits "${held.key}" to ${held.limitRps}/s: clients are told a quota that is not enforced. Make the rule's limit / windowSec equal the limits file's limitRps (or this key has an override there)`,
      );
      if (warned.size >= MAX_WARNINGS) return;
    }
  };
  const timer = setInterval(check, options.checkEveryMs ?? 5_000);
  timer.unref();
  return () => clearInterval(timer);
}
