import {
  type BucketRule,
  DEFAULT_INTERVAL_MS,
  DEFAULT_MAX_INSTANCES,
  DEFAULT_TTL_INTERVALS,
  type LimitsConfig,
} from '../config/limits-config.js';
import { overrideRuleId, templateOf } from './bucket-key.js';
import type { CompiledRateLimits } from './descriptor-rules.js';

/**
 * A request's own limit (`RateLimitDescriptor.limit`) is not in the file, so the controller cannot
 * compute its ratio. It tracks such buckets under a limit no fleet reaches and sends their
 * fleet-wide offered rate back; each `spillway rls` applies the request's limit to that rate.
 */
export const OVERRIDE_LIMIT_RPS = 1e12;

/**
 * The limits the controller enforces for an envoyproxy/ratelimit file: one bucket rule per
 * `rate_limit` (unlimited ones excepted), named as `spillway rls` names its buckets
 * (src/envoy/bucket-key.ts), at requests_per_unit / unit seconds, in shadow mode where the file
 * says `shadow_mode`. Plus, per domain, the template request limits count under.
 */
export function limitsFromRateLimits(compiled: CompiledRateLimits): LimitsConfig {
  const buckets: BucketRule[] = [];
  for (const rule of compiled.rules) {
    if (rule.unlimited) continue;
    const mode = rule.shadowMode ? 'shadow' : 'enforce';
    if (rule.variableLevels === 0) {
      buckets.push({ key: rule.id, limitRps: rule.limitRps, mode, scope: 'global' });
    } else {
      buckets.push({
        template: templateOf(rule.id),
        limitRps: rule.limitRps,
        mode,
        scope: 'global',
        overrides: {},
        maxInstances: DEFAULT_MAX_INSTANCES,
      });
    }
  }
  for (const domain of compiled.domains.keys()) {
    buckets.push({
      template: templateOf(overrideRuleId(domain)),
      limitRps: OVERRIDE_LIMIT_RPS,
      mode: 'enforce',
      scope: 'global',
      overrides: {},
      maxInstances: DEFAULT_MAX_INSTANCES,
    });
  }
  return {
    version: 1,
    intervalMs: DEFAULT_INTERVAL_MS,
    ttlMs: DEFAULT_INTERVAL_MS * DEFAULT_TTL_INTERVALS,
    buckets,
  };
}
