import { create } from '@bufbuild/protobuf';
import type { Cancellable, Random, Scheduler } from '../core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import {
  type BucketUsage,
  BucketUsageSchema,
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  Tier,
} from '../gen/spillway/v1/control_pb.js';
import { acknowledgingId } from '../protocol/acknowledging-id.js';
import { MAX_REPORT_WINDOW_MS } from '../protocol/report-bounds.js';
import type { ControlClient } from '../transport/control-transport.js';
import type { Bucket } from './bucket-handle.js';
import type { BucketTable } from './bucket-table.js';
import { UnknownBuckets } from './unknown-buckets.js';

export interface GlobalLimiterLogger {
  warn(obj: object, msg: string): void;
  info?(obj: object, msg: string): void;
}

/** Bounds on what the control plane may ask for, so a bad reply cannot stop or flood reporting. */
export const MIN_REPORT_INTERVAL_MS = 50;
export const MAX_REPORT_INTERVAL_MS = 600_000;

/**
 * Default bound on how far back a report's window reaches after failures, in intervals: enough to
 * bridge a failover, short enough that an outage's old traffic does not steer the controller.
 */
export const DEFAULT_CARRY_OVER_INTERVALS = 5;

export interface ReporterConfig {
  reporterId: string;
  zone: string;
  region: string;
  clients: readonly ControlClient[];
  scheduler: Scheduler;
  random: Random;
  table: BucketTable;
  intervalMs: number;
  jitterRatio: number;
  /** undefined: half the current interval. */
  reportTimeoutMs: number | undefined;
  maxBucketsPerReport: number;
  /** undefined: DEFAULT_CARRY_OVER_INTERVALS of the current interval. */
  carryOverMaxMs: number | undefined;
  idleExpiryMs: number;
  logger: GlobalLimiterLogger | undefined;
  /** See GlobalLimiterOptions.onWindowClose. */
  onWindowClose?: ((nowMs: number) => void) | undefined;
  /** See GlobalLimiterOptions.hostCount; undefined: 1. */
  hostCount?: (() => number) | undefined;
}

export interface ReporterStats {
  /** Reports handed to a client (successes and failures). */
  reportsSent: number;
  reportsSucceeded: number;
  reportsFailed: number;
  /** Times a failure moved reporting to the next client. */
  failovers: number;
  consecutiveFailures: number;
  /** Ticks that found the previous report still in flight and sent nothing. */
  reportsSkippedInFlight: number;
  /**
   * Reports sent at once because a parent's connection came back after reports failed (the
   * interval restarts from them, so they replace a timer report rather than add one).
   */
  reportsOnReconnect: number;
  /** Buckets left for a later report because a report was full. */
  bucketsDeferred: number;
  directivesApplied: number;
  /** Directives older than (or equal to) the one held. */
  directivesOutdated: number;
  /** Directives for buckets this host does not know. */
  directivesUnknown: number;
  /**
   * Buckets the control plane has no rule for: they offered load in several replies from a
   * controller generation and never got a directive (unknown-buckets.ts). Cumulative.
   */
  bucketsWithoutRule: number;
  clientIndex: number;
  clientTarget: string | undefined;
  sequence: number;
  intervalMs: number;
  inFlight: boolean;
  /** Epoch of the last reply (0 before any). */
  lastEpoch: number;
  /** Highest directive version applied in `lastEpoch`. */
  lastVersion: number;
  lastReportAtMs: number | undefined;
  lastSuccessAtMs: number | undefined;
}

/**
 * The host's side of the feedback loop. Every interval (jittered so a fleet does not report in
 * lockstep) it snapshots and resets each bucket's window counts, sends ONE batched report to the
 * current client, and applies the directives in the reply.
 *
 * Flush triggers: the interval timer, `flush()`, or, after reports failed, the connection of a
 * client coming back (`whenConnected`, once per reconnect; the interval restarts from that report).
 * At most one report is in flight; a tick that finds one still running sends nothing and its
 * counts wait for the next tick. A failed report (rejection, timeout) moves to the next client
 * (round robin) and its counts stay pending: the next report covers both windows, with the window
 * start of the failed one, so rates stay exact.
 * `carryOverMaxMs` bounds how far back that window may reach. Nothing here can block or fail a
 * decision: the hot path only ever reads the fields this loop writes.
 */
export class Reporter {
  readonly #config: ReporterConfig;
  readonly #scheduler: Scheduler;
  readonly #table: BucketTable;
  #intervalMs: number;
  #timer: Cancellable | undefined;
  #inFlight: Promise<void> | undefined;
  #started = false;
  #stopped = false;
  /** Start of the window the next snapshot closes. */
  #lastSnapshotMs: number;
  /** Start of the window the next report covers: the end of the last acknowledged report. */
  #reportStartMs: number;
  #sequence = 0;
  #clientIndex = 0;
  #lastEpoch = 0n;
  #lastVersion = 0n;
  #lastReportAtMs: number | undefined;
  #lastSuccessAtMs: number | undefined;
  /**
   * Who acknowledged the last acknowledged report (its reply's responder id) and that report's
   * window end: sent with every report, so that an aggregator this host moves to can tell how long
   * the one it left still counts it (ReportRequest.acknowledged_by).
   */
  #acknowledgedBy = '';
  #acknowledgedWindowEndMs = 0n;
  #overflowSeen = 0;
  readonly #stats = {
    reportsSent: 0,
    reportsSucceeded: 0,
    reportsFailed: 0,
    failovers: 0,
    consecutiveFailures: 0,
    reportsSkippedInFlight: 0,
    reportsOnReconnect: 0,
    bucketsDeferred: 0,
    directivesApplied: 0,
    directivesOutdated: 0,
    directivesUnknown: 0,
  };
  readonly #candidates: Bucket[] = [];
  readonly #unknown: UnknownBuckets;
  /** Per client: waiting for its connection to come back after a failed report (`whenConnected`). */
  readonly #reconnectWatches: (Cancellable | undefined)[];

  constructor(config: ReporterConfig) {
    this.#config = config;
    this.#scheduler = config.scheduler;
    this.#table = config.table;
    this.#intervalMs = config.intervalMs;
    const nowMs = config.scheduler.nowMs();
    this.#lastSnapshotMs = nowMs;
    this.#reportStartMs = nowMs;
    this.#reconnectWatches = config.clients.map(() => undefined);
    this.#unknown = new UnknownBuckets(config.logger, config.reporterId);
  }

  get intervalMs(): number {
    return this.#intervalMs;
  }

  get timeoutMs(): number {
    return this.#config.reportTimeoutMs ?? Math.max(1, Math.floor(this.#intervalMs / 2));
  }

  start(): void {
    if (this.#started || this.#stopped) return;
    this.#started = true;
    this.#schedule();
  }

  async stop(finalReport: boolean): Promise<void> {
    if (this.#stopped) return;
    this.#timer?.cancel();
    this.#timer = undefined;
    for (const [index, watch] of this.#reconnectWatches.entries()) {
      watch?.cancel();
      this.#reconnectWatches[index] = undefined;
    }
    if (finalReport) await this.flush();
    this.#stopped = true;
  }

  /** Snapshot and send now (after any report in flight); resolves when that report settles. */
  async flush(): Promise<void> {
    while (this.#inFlight) await this.#inFlight;
    if (this.#stopped) return;
    const nowMs = this.#scheduler.nowMs();
    this.#refresh(nowMs);
    this.#report(nowMs);
    while (this.#inFlight) await this.#inFlight;
  }

  stats(): ReporterStats {
    const client = this.#config.clients[this.#clientIndex];
    return {
      ...this.#stats,
      bucketsWithoutRule: this.#unknown.count,
      clientIndex: this.#clientIndex,
      clientTarget: client?.target,
      sequence: this.#sequence,
      intervalMs: this.#intervalMs,
      inFlight: this.#inFlight !== undefined,
      lastEpoch: Number(this.#lastEpoch),
      lastVersion: Number(this.#lastVersion),
      lastReportAtMs: this.#lastReportAtMs,
      lastSuccessAtMs: this.#lastSuccessAtMs,
    };
  }

  #schedule(): void {
    const jitter = this.#config.jitterRatio * (2 * this.#config.random() - 1);
    this.#timer = this.#scheduler.setTimeout(() => this.#tick(), this.#intervalMs * (1 + jitter));
  }

  #tick(): void {
    if (this.#stopped) return;
    this.#schedule();
    try {
      const nowMs = this.#scheduler.nowMs();
      this.#refresh(nowMs);
      if (this.#inFlight) this.#stats.reportsSkippedInFlight++;
      else this.#report(nowMs);
    } catch (error) {
      this.#config.logger?.warn({ err: error }, 'global limiter report tick failed');
    }
  }

  /** Stale policy and guard refill for every bucket; expiry of idle ones. Lazy: once per tick, never per call. */
  #refresh(nowMs: number): void {
    for (const bucket of this.#table.map.values()) {
      if (bucket.hasDirective) bucket.refresh(nowMs);
    }
    this.#table.sweep(nowMs, this.#config.idleExpiryMs);
  }

  #report(nowMs: number): void {
    const table = this.#table;
    const windowStartMs = this.#lastSnapshotMs;
    this.#config.onWindowClose?.(nowMs);
    for (const bucket of table.map.values()) bucket.snapshotWindow(windowStartMs, nowMs);
    table.overflow.snapshotWindow(windowStartMs, nowMs);
    table.overflow.clearPending();
    this.#lastSnapshotMs = nowMs;
    this.#noteOverflow();

    const clients = this.#config.clients;
    if (clients.length === 0) {
      for (const bucket of table.map.values()) bucket.clearPending();
      this.#reportStartMs = nowMs;
      return;
    }
    const carryOverMaxMs = this.#config.carryOverMaxMs ?? DEFAULT_CARRY_OVER_INTERVALS * this.#intervalMs;
    // Never a window receivers refuse: past it a host would be refused for good.
    this.#reportStartMs = Math.max(
      this.#reportStartMs,
      nowMs - Math.min(carryOverMaxMs, MAX_REPORT_WINDOW_MS),
    );
    const reportStartMs = this.#reportStartMs;

    const candidates = this.#candidates;
    candidates.length = 0;
    for (const bucket of table.map.values()) {
      if (bucket.hasPending || bucket.directiveFresh(nowMs)) candidates.push(bucket);
    }
    const max = this.#config.maxBucketsPerReport;
    if (candidates.length > max) {
      // Oldest pending counts first, so a deferred bucket is not deferred again.
      candidates.sort(byReportPriority);
      this.#stats.bucketsDeferred += candidates.length - max;
      candidates.length = max;
    }
    const spanMs = nowMs - reportStartMs;
    const measuresRate = spanMs >= this.#intervalMs / 2;
    const usage: BucketUsage[] = [];
    for (const bucket of candidates) {
      // Counts older than this report's window (deferred, or beyond the carry-over bound) are
      // scaled to it: the receiver turns counts into rates with the window length.
      if (bucket.hasPending && bucket.pendingSinceMs < reportStartMs) {
        const pendingSpanMs = nowMs - bucket.pendingSinceMs;
        bucket.scalePending(pendingSpanMs > 0 ? spanMs / pendingSpanMs : 0, reportStartMs);
      }
      // The rate the controller will see from this host; a window cut short by a flush is too
      // short to measure one, and would size the burst guard from noise.
      if (measuresRate) {
        bucket.measuredOfferedRps((bucket.pendingOffered * 1000) / spanMs);
        // Local rescale follows the host's newest rate even if the reply brings no newer directive.
        if (bucket.hasDirective && bucket.context.localRescale) bucket.refresh(nowMs);
      }
      usage.push(
        create(BucketUsageSchema, {
          bucket: bucket.key,
          offered: bucket.pendingOffered,
          admitted: bucket.pendingAdmitted,
          wouldDrop: bucket.pendingWouldDrop,
          heldEpoch: bucket.hasDirective ? bucket.epoch : 0n,
        }),
      );
    }
    const included = candidates.slice();
    candidates.length = 0;

    this.#sequence++;
    const request = create(ReportRequestSchema, {
      reporterId: this.#config.reporterId,
      tier: Tier.HOST,
      zone: this.#config.zone,
      region: this.#config.region,
      sequence: BigInt(this.#sequence),
      windowStartMs: BigInt(Math.round(reportStartMs)),
      windowEndMs: BigInt(Math.round(nowMs)),
      buckets: usage,
      hostCount: this.#hostCount(),
      acknowledgedBy: this.#acknowledgedBy,
      acknowledgedWindowEndMs: this.#acknowledgedWindowEndMs,
    });
    const clientIndex = this.#clientIndex;
    const client = clients[clientIndex]!;
    this.#stats.reportsSent++;
    this.#lastReportAtMs = nowMs;
    const inFlight = this.#send(client, request).then((outcome) => {
      if (this.#inFlight === inFlight) this.#inFlight = undefined;
      // Never rejects: a malformed reply from a broken client must not surface as an unhandled
      // rejection (which would end the process) or stop the loop.
      try {
        if (outcome instanceof SpillwayError) this.#onFailure(client, clientIndex, outcome);
        else this.#onSuccess(outcome, included, nowMs);
      } catch (error) {
        this.#config.logger?.warn(
          { err: error, target: client.target },
          'global limiter could not apply a reply',
        );
      }
    });
    this.#inFlight = inFlight;
  }

  /** Settles with the reply or an error, never rejects; also bounds a client that breaks its timeout contract. */
  #send(client: ControlClient, request: ReportRequest): Promise<ReportResponse | SpillwayError> {
    const timeoutMs = this.timeoutMs;
    return new Promise((resolve) => {
      const graceMs = Math.max(50, timeoutMs * 0.1);
      const guard = this.#scheduler.setTimeout(() => {
        resolve(
          new SpillwayError(ErrorCode.StoreTimeout, `no reply from ${client.target} within ${timeoutMs} ms`, {
            target: client.target,
            timeoutMs,
          }),
        );
      }, timeoutMs + graceMs);
      const settle = (outcome: ReportResponse | SpillwayError): void => {
        guard.cancel();
        resolve(outcome);
      };
      try {
        Promise.resolve(client.report(request, { timeoutMs })).then(settle, (error: unknown) =>
          settle(asTransportError(client.target, error)),
        );
      } catch (error) {
        settle(asTransportError(client.target, error));
      }
    });
  }

  #onSuccess(response: ReportResponse, included: readonly Bucket[], sentAtMs: number): void {
    this.#stats.reportsSucceeded++;
    if (this.#stats.consecutiveFailures > 0) {
      this.#config.logger?.info?.(
        {
          failures: this.#stats.consecutiveFailures,
          target: this.#config.clients[this.#clientIndex]?.target,
        },
        'global limiter reports recovered',
      );
    }
    this.#stats.consecutiveFailures = 0;
    // Buckets this reply should have answered: they offered load and hold no directive yet.
    const unanswered =
      response.epoch > 0n ? included.filter((b) => !b.hasDirective && b.pendingOffered > 0) : [];
    for (const bucket of included) bucket.clearPending();
    this.#reportStartMs = Math.max(this.#reportStartMs, sentAtMs);
    this.#acknowledgedBy = acknowledgingId(response.responderId);
    this.#acknowledgedWindowEndMs = BigInt(Math.round(sentAtMs)); // the report's window end
    const nowMs = this.#scheduler.nowMs();
    this.#lastSuccessAtMs = nowMs;
    if (this.#stopped) return;

    const intervalMs = response.reportIntervalMs;
    if (intervalMs > 0) {
      this.#intervalMs = Math.min(MAX_REPORT_INTERVAL_MS, Math.max(MIN_REPORT_INTERVAL_MS, intervalMs));
    }
    if (response.epoch > this.#lastEpoch) {
      this.#lastEpoch = response.epoch;
      this.#lastVersion = 0n;
    }
    const map = this.#table.map;
    for (const directive of response.directives) {
      const bucket = map.get(directive.bucket);
      if (!bucket) {
        this.#stats.directivesUnknown++;
        continue;
      }
      if (bucket.applyDirective(directive, response.epoch, nowMs)) {
        this.#stats.directivesApplied++;
        if (bucket.epoch === this.#lastEpoch && bucket.version > this.#lastVersion) {
          this.#lastVersion = bucket.version;
        }
      } else {
        this.#stats.directivesOutdated++;
      }
    }
    for (const bucket of unanswered) this.#unknown.unanswered(bucket);
  }

  #onFailure(client: ControlClient, clientIndex: number, error: SpillwayError): void {
    this.#stats.reportsFailed++;
    const failures = ++this.#stats.consecutiveFailures;
    this.#watchReconnect(client, clientIndex);
    const clients = this.#config.clients;
    if (clients.length > 1 && this.#clientIndex === clientIndex) {
      this.#clientIndex = (clientIndex + 1) % clients.length;
      this.#stats.failovers++;
    }
    // One line on the first failure, then at doubling counts: an outage must not flood the log.
    if ((failures & (failures - 1)) === 0) {
      this.#config.logger?.warn(
        {
          code: error.code,
          target: client.target,
          nextTarget: clients[this.#clientIndex]?.target,
          consecutiveFailures: failures,
        },
        'global limiter report failed; decisions continue on the last directives',
      );
    }
  }

  /**
   * After a report to `client` failed, waits for its connection to come back (transports that
   * tell: gRPC). If reports are still failing then, the next goes to this client at once and the
   * interval restarts from it: after an outage the parent gets this host's counts, and the host its
   * directives, without waiting out the rest of the interval. One report per reconnect, never more
   * than the timer would have sent.
   */
  #watchReconnect(client: ControlClient, clientIndex: number): void {
    if (!client.whenConnected || this.#reconnectWatches[clientIndex] !== undefined) return;
    if (!this.#started || this.#stopped) return;
    this.#reconnectWatches[clientIndex] = client.whenConnected(() => {
      this.#reconnectWatches[clientIndex] = undefined;
      if (this.#stopped || this.#stats.consecutiveFailures === 0 || this.#inFlight) return;
      this.#clientIndex = clientIndex;
      this.#stats.reportsOnReconnect++;
      this.#timer?.cancel();
      this.#tick();
    });
  }

  #hostCount(): number {
    const count = this.#config.hostCount?.() ?? 1;
    return Number.isSafeInteger(count) && count >= 1 && count <= 0xffffffff ? count : 1;
  }

  #noteOverflow(): void {
    const overflowed = this.#table.overflow.totalOffered;
    if (overflowed > this.#overflowSeen) {
      this.#config.logger?.warn(
        { overflowedUnits: overflowed - this.#overflowSeen, maxBuckets: this.#table.maxBuckets },
        'global limiter bucket table is full; calls for new keys are admitted unlimited',
      );
      this.#overflowSeen = overflowed;
    }
  }
}

function byReportPriority(a: Bucket, b: Bucket): number {
  if (a.hasPending !== b.hasPending) return a.hasPending ? -1 : 1;
  return a.pendingSinceMs - b.pendingSinceMs;
}

function asTransportError(target: string, error: unknown): SpillwayError {
  if (isSpillwayError(error)) return error;
  return new SpillwayError(
    ErrorCode.StoreUnavailable,
    `report to ${target} failed`,
    { target },
    { cause: error },
  );
}
