import { status } from '@grpc/grpc-js';
import type {
  BucketId,
  RateLimitQuotaUsageReports,
} from '../gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import type { DescriptorRule } from './descriptor-rules.js';
import type { Strategy } from './quota-assignment.js';
import { bucketIdPairs, canonicalBucketId } from './quota-bucket-id.js';

/** Longest time_elapsed believed: a data plane reports every few seconds, not once an hour. */
export const MAX_TIME_ELAPSED_MS = 3_600_000;
/** Highest rate believed from one report (offered units per second). */
export const MAX_REPORTED_RPS = 1e9;
/** A bucket's rates are measured over its newest reports spanning at least this long. */
export const RATE_WINDOW_MS = 6_000;
/**
 * Less time than this says nothing about a rate: a data plane's first report of a bucket comes at
 * its first request, a millisecond after the bucket began (one request in 1 ms is not 1,000/s).
 */
export const MIN_RATE_SPAN_MS = 250;
const MAX_SAMPLES = 16;

/** What a bucket of a stream resolves to in the limits file. */
export type BucketTarget =
  | { kind: 'rule'; rule: DescriptorRule; key: string }
  | { kind: 'unlimited' }
  /** No rule for it (or an unknown domain): allowed, not counted. */
  | { kind: 'unmatched' };

interface UsageSample {
  elapsedMs: number;
  offered: number;
  admitted: number;
}

/** One BucketId as one stream (one Envoy) reports it. */
export class StreamBucket {
  readonly id: string;
  readonly bucketId: BucketId;
  readonly pairs: [string, string][];
  /** The limits version `target` was resolved against. */
  limitsVersion = -1;
  target: BucketTarget = { kind: 'unmatched' };
  readonly #samples: UsageSample[] = [];
  /** Offered (allowed + denied) and allowed units per second over the newest reports. */
  offeredRps = 0;
  admittedRps = 0;
  lastReportMs: number;
  lastElapsedMs = 0;
  /** The strategy last sent, and when. */
  assigned: Strategy | undefined;
  assignedAtMs = 0;

  constructor(id: string, bucketId: BucketId, pairs: [string, string][], nowMs: number) {
    this.id = id;
    this.bucketId = bucketId;
    this.pairs = pairs;
    this.lastReportMs = nowMs;
  }

  addSample(sample: UsageSample, nowMs: number): void {
    this.#samples.push(sample);
    if (this.#samples.length > MAX_SAMPLES) this.#samples.shift();
    this.lastReportMs = nowMs;
    this.lastElapsedMs = sample.elapsedMs;
    let elapsedMs = 0;
    let offered = 0;
    let admitted = 0;
    for (let i = this.#samples.length - 1; i >= 0 && elapsedMs < RATE_WINDOW_MS; i--) {
      const s = this.#samples[i]!;
      elapsedMs += s.elapsedMs;
      offered += s.offered;
      admitted += s.admitted;
    }
    if (elapsedMs >= MIN_RATE_SPAN_MS) {
      this.offeredRps = (offered * 1000) / elapsedMs;
      this.admittedRps = (admitted * 1000) / elapsedMs;
    }
  }
}

/** A stream ended by the server with a gRPC status; `reason` labels the refusal metric. */
export class StreamRefusal extends Error {
  constructor(
    readonly grpcStatus: status,
    message: string,
    readonly reason: string,
  ) {
    super(message);
    this.name = 'StreamRefusal';
  }
}

/**
 * One Envoy's RLQS stream: its domain (named by its first report), the buckets it reported and
 * their usage. Reports are validated as rlqs.proto says (a domain first, at least one usage, a
 * BucketId and a time_elapsed on each) and against bounds that keep a broken or hostile client
 * from growing memory: `maxBuckets` BucketIds per stream, believable time_elapsed and counts. A
 * report breaking them ends the stream with the status in the StreamRefusal thrown.
 */
export class QuotaStream {
  readonly id: number;
  domain: string | undefined;
  readonly buckets = new Map<string, StreamBucket>();
  readonly openedMs: number;
  lastReportMs: number | undefined;
  readonly #maxBuckets: number;

  constructor(id: number, nowMs: number, maxBuckets: number) {
    this.id = id;
    this.openedMs = nowMs;
    this.#maxBuckets = maxBuckets;
  }

  /** Takes one report's usage; returns the buckets it named, in order. Throws StreamRefusal. */
  receive(report: RateLimitQuotaUsageReports, nowMs: number): StreamBucket[] {
    if (this.domain === undefined) {
      if (report.domain === '')
        throw invalid('the first report of a stream must name its domain', 'no_domain');
      this.domain = report.domain;
    } else if (report.domain !== '' && report.domain !== this.domain) {
      throw invalid(
        `a stream keeps its domain ('${this.domain}'); open another for '${report.domain}'`,
        'domain_change',
      );
    }
    const usages = report.bucketQuotaUsages;
    if (usages.length === 0)
      throw invalid('a report needs at least one bucket_quota_usages entry', 'empty_report');
    const touched: StreamBucket[] = [];
    for (let i = 0; i < usages.length; i++) {
      const usage = usages[i]!;
      const at = `bucket_quota_usages[${i}]`;
      const pairs = bucketIdPairs(usage.bucketId);
      if ('problem' in pairs) throw invalid(`${at}: ${pairs.problem}`, 'invalid_bucket_id');
      const elapsed = usage.timeElapsed;
      if (elapsed === undefined) throw invalid(`${at}.time_elapsed is required`, 'invalid_time_elapsed');
      const elapsedMs = Number(elapsed.seconds) * 1000 + elapsed.nanos / 1e6;
      if (
        elapsed.seconds < 0n ||
        elapsed.nanos < 0 ||
        elapsed.nanos >= 1e9 ||
        !(elapsedMs <= MAX_TIME_ELAPSED_MS)
      ) {
        throw invalid(
          `${at}.time_elapsed must be between 0 and ${MAX_TIME_ELAPSED_MS / 1000} s, got ${elapsed.seconds}s ${elapsed.nanos}ns`,
          'invalid_time_elapsed',
        );
      }
      const admitted = Number(usage.numRequestsAllowed);
      const offered = admitted + Number(usage.numRequestsDenied);
      if (offered > (MAX_REPORTED_RPS * Math.max(elapsedMs, 1)) / 1000) {
        throw invalid(
          `${at}: ${offered} requests in ${elapsedMs} ms is not a believable rate`,
          'invalid_counts',
        );
      }
      const id = canonicalBucketId(pairs.pairs);
      let bucket = this.buckets.get(id);
      if (bucket === undefined) {
        if (this.buckets.size >= this.#maxBuckets) {
          throw new StreamRefusal(
            status.RESOURCE_EXHAUSTED,
            `this stream reports more than ${this.#maxBuckets} buckets; reopen it with fewer`,
            'too_many_buckets',
          );
        }
        bucket = new StreamBucket(id, usage.bucketId!, pairs.pairs, nowMs);
        this.buckets.set(id, bucket);
      }
      bucket.addSample({ elapsedMs, offered, admitted }, nowMs);
      touched.push(bucket);
    }
    this.lastReportMs = nowMs;
    return touched;
  }
}

function invalid(message: string, reason: string): StreamRefusal {
  return new StreamRefusal(status.INVALID_ARGUMENT, message, reason);
}
