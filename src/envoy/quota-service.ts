import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { type Cancellable, type Scheduler, systemScheduler } from '../core/clock.js';
import {
  type RateLimitQuotaResponse,
  type RateLimitQuotaResponse_BucketAction,
  RateLimitQuotaResponseSchema,
  type RateLimitQuotaUsageReports,
} from '../gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import type { GlobalLimiter } from '../global/global-limiter.js';
import { DEFAULT_STALE_HOLD_INTERVALS } from '../global/stale-policy.js';
import type { CompiledRateLimits } from './descriptor-rules.js';
import {
  abandonAction,
  assignmentAction,
  type Strategy,
  type StrategyStyle,
  sameStrategy,
  shareStrategy,
} from './quota-assignment.js';
import { matchBucketId } from './quota-bucket-id.js';
import { QuotaStream, type StreamBucket, StreamRefusal } from './quota-stream.js';

export interface QuotaServiceOptions {
  /** The global limiter this process reports through; the streams' usage is recorded into it. */
  limiter: GlobalLimiter;
  /** The rules in force (read at each use: reloads apply to streams already open). */
  limits: () => CompiledRateLimits;
  scheduler?: Scheduler;
  /** The report interval of the loop. Default 1000. */
  intervalMs?: number;
  /** Default `token-bucket`: the strategy Envoy implements (it ignores requests_per_time_unit today). */
  style?: StrategyStyle;
  /**
   * Token bucket depth, in time at the Envoy's share (never under MIN_MAX_TOKENS). Default 100 ms: a
   * changed assignment starts a full bucket at the Envoy, so depth is admitted again at each change.
   */
  burstMs?: number;
  /** A new share within this fraction of the one assigned keeps the assignment (Envoy then keeps its tokens). Default 0.05. */
  tolerance?: number;
  /** Streams open at once; more are refused with RESOURCE_EXHAUSTED. Default 1,000. */
  maxStreams?: number;
  /** BucketIds per stream; a stream naming more is ended with RESOURCE_EXHAUSTED. Default 1,000. */
  maxBucketsPerStream?: number;
  /** A stream without a report this long is ended (DEADLINE_EXCEEDED). Default 60,000. */
  silentStreamMs?: number;
  /** A domain the file does not have: every bucket ALLOW_ALL and uncounted (`ok`), or the stream ends NOT_FOUND. */
  unknownDomain?: 'ok' | 'error';
}

/** One stream as its transport sees it: reports in, responses out through the callbacks given to `open`. */
export interface QuotaSession {
  receive(report: RateLimitQuotaUsageReports): void;
  /** The client went away (or half-closed): its usage stops counting, its share is given back. */
  close(): void;
}

export interface QuotaStats {
  streamsOpened: number;
  readonly streamsOpen: number;
  /** Streams ended by the server, by reason (invalid_time_elapsed, too_many_buckets, silent...). */
  readonly refused: Map<string, number>;
  /** Assignments sent, by strategy kind (allow, deny, token-bucket, per-time-unit). */
  readonly assignments: Map<string, number>;
  /** Assignments that changed the strategy (a new token bucket for the Envoy). */
  changes: number;
  abandons: number;
  readonly buckets: number;
}

export interface QuotaService {
  /** A new stream; `send` writes a response, `end` ends the stream (with the refusal's status when given). */
  open(
    send: (response: RateLimitQuotaResponse) => void,
    end: (refusal?: StreamRefusal) => void,
  ): QuotaSession;
  /** GlobalLimiterOptions.onWindowClose: records the streams' usage into the limiter's window. */
  onWindowClose(nowMs: number): void;
  /** Envoys speaking through this process (GlobalLimiterOptions.hostCount adds this process). */
  readonly streamCount: number;
  start(): void;
  stop(): void;
  readonly stats: QuotaStats;
}

interface Session {
  stream: QuotaStream;
  send: (response: RateLimitQuotaResponse) => void;
  end: (refusal?: StreamRefusal) => void;
  closed: boolean;
}

/** Per bucket key: the stream buckets counted into it, and the drop ratio smoothed over windows. */
interface KeyState {
  members: Set<StreamBucket>;
  smoothedRatio: number;
  ratioSeen: boolean;
}

/** Measured with the simulated Envoys of test/envoy/quota-service.test.ts (docs/envoy.md, "RLQS"). */
export const DEFAULT_QUOTA_BURST_MS = 100;
export const DEFAULT_QUOTA_TOLERANCE = 0.05;
/** Weight of the newest ratio in the smoothed one shares are sized from: a window's noise halves. */
const RATIO_SMOOTHING = 0.5;
/** What a stream with no recent usage of an over-limit bucket may still admit, as a fraction of the limit (all such streams together). */
const IDLE_SHARE_FRACTION = 0.01;

/**
 * Envoy's rate limit quota service over the global rate limiter. Each stream is a data plane that
 * enforces for itself and reports num_requests_allowed/denied per BucketId; this process speaks
 * for all of its streams as one host of the loop: their offered and allowed rates are recorded
 * into its limiter's report windows (the same sums as any host's Report, to the aggregator and
 * controller), and the controller's ratio for a bucket comes back as each Envoy's assignment: its
 * own offered rate x (1 - ratio). See docs/envoy.md.
 */
export function createQuotaService(options: QuotaServiceOptions): QuotaService {
  const { limiter } = options;
  const scheduler = options.scheduler ?? systemScheduler;
  const intervalMs = options.intervalMs ?? 1000;
  const style = options.style ?? 'token-bucket';
  const burstMs = options.burstMs ?? DEFAULT_QUOTA_BURST_MS;
  const tolerance = options.tolerance ?? DEFAULT_QUOTA_TOLERANCE;
  const maxStreams = options.maxStreams ?? 1_000;
  const maxBucketsPerStream = options.maxBucketsPerStream ?? 1_000;
  const silentStreamMs = options.silentStreamMs ?? 60_000;
  const unknownDomain = options.unknownDomain ?? 'ok';

  const sessions = new Set<Session>();
  const keys = new Map<string, KeyState>();
  let nextStreamId = 1;
  let lastCloseMs = scheduler.nowMs();
  let limitsSeen: CompiledRateLimits | undefined;
  let limitsVersion = 0;
  let sweepTimer: Cancellable | undefined;
  const stats: QuotaStats = {
    streamsOpened: 0,
    get streamsOpen() {
      return sessions.size;
    },
    refused: new Map(),
    assignments: new Map(),
    changes: 0,
    abandons: 0,
    get buckets() {
      let count = 0;
      for (const session of sessions) count += session.stream.buckets.size;
      return count;
    },
  };
  const count = (map: Map<string, number>, key: string) => map.set(key, (map.get(key) ?? 0) + 1);

  const currentLimits = (): CompiledRateLimits => {
    const limits = options.limits();
    if (limits !== limitsSeen) {
      limitsSeen = limits;
      limitsVersion++;
    }
    return limits;
  };

  /** (Re)resolve a bucket against the rules in force; keeps key membership in step. */
  const resolve = (session: Session, bucket: StreamBucket): void => {
    const limits = currentLimits();
    if (bucket.limitsVersion === limitsVersion) return;
    leave(bucket);
    bucket.limitsVersion = limitsVersion;
    const domain = limits.domains.get(session.stream.domain!);
    const match = domain === undefined ? undefined : matchBucketId(domain, bucket.pairs);
    if (match === undefined) bucket.target = { kind: 'unmatched' };
    else if (match.rule.unlimited) bucket.target = { kind: 'unlimited' };
    else {
      bucket.target = { kind: 'rule', rule: match.rule, key: match.bucketKey };
      let state = keys.get(match.bucketKey);
      if (state === undefined) {
        state = { members: new Set(), smoothedRatio: 0, ratioSeen: false };
        keys.set(match.bucketKey, state);
      }
      state.members.add(bucket);
    }
  };

  const leave = (bucket: StreamBucket): void => {
    if (bucket.target.kind !== 'rule') return;
    const state = keys.get(bucket.target.key);
    state?.members.delete(bucket);
    if (state?.members.size === 0) keys.delete(bucket.target.key);
  };

  /** Reported recently enough for its rates to stand for its traffic now. */
  const fresh = (bucket: StreamBucket, nowMs: number) =>
    nowMs - bucket.lastReportMs <= 2 * Math.max(bucket.lastElapsedMs, intervalMs);

  /** How long an assignment holds: the stale policy's hold, in the longer of the loop's and this Envoy's intervals. */
  const timeToLiveMs = (bucket: StreamBucket) =>
    DEFAULT_STALE_HOLD_INTERVALS * Math.max(intervalMs, bucket.lastElapsedMs);

  const strategyFor = (bucket: StreamBucket): Strategy => {
    const target = bucket.target;
    if (target.kind !== 'rule') return { kind: 'allow' };
    if (target.rule.requestsPerUnit === 0) return { kind: 'deny' };
    const state = keys.get(target.key);
    const snapshot = limiter.peek(target.key);
    if (target.rule.shadowMode || snapshot === undefined || snapshot.mode === 'shadow')
      return { kind: 'allow' };
    const ratio = state?.ratioSeen ? state.smoothedRatio : snapshot.effectiveRatio;
    if (!(ratio > 0)) return { kind: 'allow' };
    const members = state?.members.size ?? 1;
    const floorRps = (IDLE_SHARE_FRACTION * target.rule.limitRps) / members;
    const shareRps = Math.max(floorRps, bucket.offeredRps * (1 - ratio));
    const assigned = bucket.assigned;
    if (
      assigned !== undefined &&
      (assigned.kind === 'token-bucket' || assigned.kind === 'per-time-unit') &&
      Math.abs(shareRps - assigned.shareRps) <= tolerance * assigned.shareRps
    ) {
      return assigned;
    }
    return shareStrategy(shareRps, { style, burstMs });
  };

  const assign = (bucket: StreamBucket, nowMs: number): RateLimitQuotaResponse_BucketAction => {
    const strategy = strategyFor(bucket);
    if (!sameStrategy(bucket.assigned, strategy)) {
      if (bucket.assigned !== undefined) stats.changes++;
      bucket.assigned = strategy;
      bucket.assignedAtMs = nowMs;
    }
    count(stats.assignments, strategy.kind);
    return assignmentAction(bucket.bucketId, strategy, timeToLiveMs(bucket));
  };

  const endSession = (session: Session, refusal?: StreamRefusal): void => {
    if (session.closed) return;
    session.closed = true;
    sessions.delete(session);
    for (const bucket of session.stream.buckets.values()) leave(bucket);
    if (refusal) count(stats.refused, refusal.reason);
    session.end(refusal);
  };

  const sweep = (): void => {
    const nowMs = scheduler.nowMs();
    for (const session of [...sessions]) {
      const stream = session.stream;
      const lastMs = stream.lastReportMs ?? stream.openedMs;
      if (nowMs - lastMs > silentStreamMs) {
        endSession(
          session,
          new StreamRefusal(
            status.DEADLINE_EXCEEDED,
            `no usage report for ${silentStreamMs} ms; a data plane reopens the stream to report`,
            'silent',
          ),
        );
        continue;
      }
      const abandoned: RateLimitQuotaResponse_BucketAction[] = [];
      for (const bucket of stream.buckets.values()) {
        if (nowMs - bucket.lastReportMs <= timeToLiveMs(bucket)) continue;
        leave(bucket);
        stream.buckets.delete(bucket.id);
        abandoned.push(abandonAction(bucket.bucketId));
        stats.abandons++;
      }
      if (abandoned.length > 0)
        session.send(create(RateLimitQuotaResponseSchema, { bucketAction: abandoned }));
    }
    sweepTimer = scheduler.setTimeout(sweep, intervalMs);
  };

  return {
    open(send, end) {
      const session: Session = {
        stream: new QuotaStream(nextStreamId++, scheduler.nowMs(), maxBucketsPerStream),
        send,
        end,
        closed: false,
      };
      stats.streamsOpened++;
      if (sessions.size >= maxStreams) {
        session.closed = true;
        count(stats.refused, 'too_many_streams');
        end(
          new StreamRefusal(
            status.RESOURCE_EXHAUSTED,
            `${maxStreams} streams are open, the most this process takes`,
            'too_many_streams',
          ),
        );
        return { receive() {}, close() {} };
      }
      sessions.add(session);
      return {
        receive(report) {
          if (session.closed) return;
          const nowMs = scheduler.nowMs();
          try {
            const touched = session.stream.receive(report, nowMs);
            if (!currentLimits().domains.has(session.stream.domain!) && unknownDomain === 'error') {
              throw new StreamRefusal(
                status.NOT_FOUND,
                `rate limit domain '${session.stream.domain}' is not configured`,
                'unknown_domain',
              );
            }
            const actions = touched.map((bucket) => {
              resolve(session, bucket);
              return assign(bucket, nowMs);
            });
            session.send(create(RateLimitQuotaResponseSchema, { bucketAction: actions }));
          } catch (error) {
            if (!(error instanceof StreamRefusal)) throw error;
            endSession(session, error);
          }
        },
        close() {
          endSession(session);
        },
      };
    },

    onWindowClose(nowMs) {
      const windowS = Math.max(0, nowMs - lastCloseMs) / 1000;
      lastCloseMs = nowMs;
      for (const [key, state] of keys) {
        let offeredRps = 0;
        let admittedRps = 0;
        for (const bucket of state.members) {
          if (!fresh(bucket, nowMs)) continue;
          offeredRps += bucket.offeredRps;
          admittedRps += bucket.admittedRps;
        }
        if (offeredRps > 0) limiter.record(key, offeredRps * windowS, admittedRps * windowS);
        const snapshot = limiter.peek(key);
        if (snapshot !== undefined && snapshot.directiveAgeMs !== undefined) {
          state.smoothedRatio = state.ratioSeen
            ? RATIO_SMOOTHING * snapshot.effectiveRatio + (1 - RATIO_SMOOTHING) * state.smoothedRatio
            : snapshot.effectiveRatio;
          state.ratioSeen = true;
        }
      }
    },

    get streamCount() {
      return sessions.size;
    },

    start() {
      sweepTimer ??= scheduler.setTimeout(sweep, intervalMs);
    },

    stop() {
      sweepTimer?.cancel();
      sweepTimer = undefined;
      for (const session of [...sessions]) endSession(session);
    },

    stats,
  };
}
