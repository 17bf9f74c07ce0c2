import type { QuotaStats } from '../envoy/quota-service.js';
import type { RlsStats } from '../envoy/rls-stats.js';
import type { Sample, SpillwayMetrics } from './metrics.js';

/**
 * `spillway rls`'s own series, read from its counters at scrape time: ShouldRateLimit answers per
 * configured domain (`(unknown)` for the rest, so a client cannot add labels), hits per rule as
 * envoyproxy/ratelimit's stats count them (per bucket for rules with `detailed_metric`, bounded),
 * refusals by reason and backend faults.
 */
export function addRlsMetrics(metrics: SpillwayMetrics, stats: RlsStats): void {
  metrics.addSnapshotMetrics(
    () => stats,
    [
      {
        name: 'spillway_rls_requests_total',
        help: 'ShouldRateLimit calls answered, by domain ((unknown): a domain the file does not have).',
        type: 'counter',
        labelNames: ['domain'],
        samples: (s) => [...s.domains].map(([domain, c]): Sample => [{ domain }, c.requests]),
      },
      {
        name: 'spillway_rls_over_limit_total',
        help: 'ShouldRateLimit calls answered OVER_LIMIT, by domain.',
        type: 'counter',
        labelNames: ['domain'],
        samples: (s) => [...s.domains].map(([domain, c]): Sample => [{ domain }, c.overLimit]),
      },
      {
        name: 'spillway_rls_descriptors_unmatched_total',
        help: 'Descriptors no rule matched (answered OK with no limit), by domain.',
        type: 'counter',
        labelNames: ['domain'],
        samples: (s) => [...s.domains].map(([domain, c]): Sample => [{ domain }, c.unmatched]),
      },
      {
        name: 'spillway_rls_rule_hits_total',
        help:
          'Hits (hits_addend units) per rule: within_limit, over_limit, or shadow_over_limit (over, answered OK). ' +
          'Rules with detailed_metric are counted per bucket; (other) holds what is past the series bound.',
        type: 'counter',
        labelNames: ['rule', 'result'],
        samples: (s) =>
          [...s.rules].flatMap(([rule, c]): Sample[] => [
            [{ rule, result: 'within_limit' }, c.withinLimit],
            [{ rule, result: 'over_limit' }, c.overLimit],
            [{ rule, result: 'shadow_over_limit' }, c.shadowOverLimit],
          ]),
      },
      {
        name: 'spillway_rls_refused_total',
        help: 'Calls refused with a gRPC error, by reason (empty_domain, too_many_descriptors, malformed...).',
        type: 'counter',
        labelNames: ['reason'],
        samples: (s) => [...s.refused].map(([reason, count]): Sample => [{ reason }, count]),
      },
      {
        name: 'spillway_rls_backend_faults_total',
        help: 'Descriptors the backend could not count (Redis down or slow, a full local table); its fault policy answered.',
        type: 'counter',
        samples: (s) => [[{}, s.backendFaults]],
      },
    ],
  );
}

/** RLQS (StreamRateLimitQuotas) series of `spillway rls`, read from the quota service's counters. */
export function addQuotaMetrics(metrics: SpillwayMetrics, stats: QuotaStats): void {
  metrics.addSnapshotMetrics(
    () => stats,
    [
      {
        name: 'spillway_rlqs_streams',
        help: 'RLQS streams open now (one per Envoy).',
        type: 'gauge',
        samples: (s) => [[{}, s.streamsOpen]],
      },
      {
        name: 'spillway_rlqs_streams_opened_total',
        help: 'RLQS streams opened.',
        type: 'counter',
        samples: (s) => [[{}, s.streamsOpened]],
      },
      {
        name: 'spillway_rlqs_streams_refused_total',
        help: 'RLQS streams ended by this process with an error status, by reason (invalid_time_elapsed, too_many_buckets, silent...).',
        type: 'counter',
        labelNames: ['reason'],
        samples: (s) => [...s.refused].map(([reason, count]): Sample => [{ reason }, count]),
      },
      {
        name: 'spillway_rlqs_buckets',
        help: 'BucketIds tracked over every open stream.',
        type: 'gauge',
        samples: (s) => [[{}, s.buckets]],
      },
      {
        name: 'spillway_rlqs_assignments_total',
        help: 'Quota assignments sent, by strategy (allow, deny, token-bucket, per-time-unit).',
        type: 'counter',
        labelNames: ['strategy'],
        samples: (s) => [...s.assignments].map(([strategy, count]): Sample => [{ strategy }, count]),
      },
      {
        name: 'spillway_rlqs_assignment_changes_total',
        help: "Assignments that changed an Envoy's strategy (it starts a new, full token bucket).",
        type: 'counter',
        samples: (s) => [[{}, s.changes]],
      },
      {
        name: 'spillway_rlqs_abandons_total',
        help: 'Buckets abandoned: not reported past their assignment TTL.',
        type: 'counter',
        samples: (s) => [[{}, s.abandons]],
      },
    ],
  );
}
