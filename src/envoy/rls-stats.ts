/**
 * What `spillway rls` counted, read by its /metrics at scrape time (src/ops/rls-metrics.ts). Per rule
 * as envoyproxy/ratelimit's stats are: hits (hits_addend units) within the limit, over it, and over
 * it in shadow mode (answered OK). A rule with `detailed_metric` (or `value_to_metric`) is counted
 * per bucket, its request values included, as the reference does; the number of series is bounded
 * (`maxSeries`), the rest counted under `(other)`.
 */
export interface RuleCounters {
  withinLimit: number;
  overLimit: number;
  /** Over the limit, answered OK: the rule (or the whole service) is in shadow mode. */
  shadowOverLimit: number;
}

export interface DomainCounters {
  /** ShouldRateLimit calls answered (refusals are counted apart). */
  requests: number;
  /** Of which answered OVER_LIMIT overall. */
  overLimit: number;
  /** Descriptors that matched no rule (answered OK with no limit). */
  unmatched: number;
}

export type RefusalReason =
  | 'empty_domain'
  | 'empty_descriptors'
  | 'too_many_descriptors'
  | 'invalid_descriptor'
  | 'unknown_domain'
  | 'malformed'
  | 'too_large'
  | 'internal';

/** Requests to domains the file does not have are counted under this domain label. */
export const UNKNOWN_DOMAIN_LABEL = '(unknown)';
export const OTHER_RULES_LABEL = '(other)';
export const DEFAULT_MAX_RULE_SERIES = 1_000;

export class RlsStats {
  readonly rules = new Map<string, RuleCounters>();
  readonly domains = new Map<string, DomainCounters>();
  readonly refused = new Map<RefusalReason, number>();
  /** Descriptors a backend could not decide (Redis down, a full local table) and its policy did. */
  backendFaults = 0;
  readonly #maxSeries: number;

  constructor(maxSeries = DEFAULT_MAX_RULE_SERIES) {
    this.#maxSeries = maxSeries;
  }

  rule(metricKey: string): RuleCounters {
    let counters = this.rules.get(metricKey);
    if (counters === undefined) {
      const key = this.rules.size < this.#maxSeries ? metricKey : OTHER_RULES_LABEL;
      counters = this.rules.get(key);
      if (counters === undefined) {
        counters = { withinLimit: 0, overLimit: 0, shadowOverLimit: 0 };
        this.rules.set(key, counters);
      }
    }
    return counters;
  }

  /** `domain` is a configured domain or UNKNOWN_DOMAIN_LABEL: the label set stays bounded. */
  domain(domain: string): DomainCounters {
    let counters = this.domains.get(domain);
    if (counters === undefined) {
      counters = { requests: 0, overLimit: 0, unmatched: 0 };
      this.domains.set(domain, counters);
    }
    return counters;
  }

  refuse(reason: RefusalReason): void {
    this.refused.set(reason, (this.refused.get(reason) ?? 0) + 1);
  }
}
