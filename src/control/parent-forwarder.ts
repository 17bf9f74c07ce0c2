import type { Cancellable, Random, Scheduler } from '../core/clock.js';
import type { Directive, ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';
import { acknowledgingId } from '../protocol/acknowledging-id.js';
import type { ControlClient } from '../transport/control-transport.js';
import type { ControlLogger } from './control-logger.js';
import type { Acknowledgement } from './zone-sums.js';

const MIN_INTERVAL_MS = 100;
const MAX_INTERVAL_MS = 60_000;

/** Fan-out is counted at every parent by design: nothing for a parent to hold out. */
const NO_ACKNOWLEDGEMENT: Acknowledgement = { by: '', windowEndMs: 0n };

export interface LastForward {
  sequence: number;
  atMs: number;
  buckets: number;
  hostCount: number;
  /** The parent that answered (fan-out: the first to). */
  target?: string;
}

export interface ParentForwarderOptions {
  /** The aggregator's id, for logs. */
  id: string;
  /** In failover order. */
  parents: readonly ControlClient[];
  fanout: boolean;
  scheduler: Scheduler;
  random: Random;
  jitterRatio: number;
  /** Until a parent's reply sets another. */
  intervalMs: number;
  /** Per attempt; undefined: half the interval. */
  reportTimeoutMs: number | undefined;
  /** How long a failed parent is tried after healthy ones; undefined: 5 intervals. */
  parentBackoffMs: number | undefined;
  logger: ControlLogger;
  /** The next forward, built now. */
  buildReport: (nowMs: number, acknowledgement: Acknowledgement) => ReportRequest;
  /** Takes a reply's directives for the forward `sequence`; returns whether any was taken. */
  applyDirectives: (directives: readonly Directive[], sequence: bigint) => boolean;
  /** A parent replied from controller generation `epoch` (0: a reply that names none). */
  heardEpoch?: (epoch: bigint) => void;
}

/**
 * Sends an aggregator's forwards to its parents and hands their replies back.
 *
 * Flush triggers: the jittered interval timer, `flush()`, and two that only fire after an outage
 * or a start, each at most once per occasion: a failed parent's connection coming back
 * (`whenConnected`) while no parent answers, and a host report while no directive is fresh
 * (`maybeColdForward`). At most one forward is in flight; a timer firing while one is in flight is
 * skipped (counted).
 *
 * `failover`: each forward goes to the first healthy parent, then the next; a parent that failed
 * is tried after healthy ones for a backoff. `fanout`: each forward goes to every parent at once.
 */
export class ParentForwarder {
  readonly #options: ParentForwarderOptions;
  readonly #parents: readonly ControlClient[];
  readonly #scheduler: Scheduler;
  #intervalMs: number;
  /** Per parent: tried after healthy ones until then. */
  readonly #parentDownUntilMs: number[];
  /** Per parent: waiting for its connection to come back after a failure (`whenConnected`). */
  readonly #reconnectWatches: (Cancellable | undefined)[];
  #inFlight: Promise<void> | undefined;
  #timer: Cancellable | undefined;
  #running = false;
  /** Whether the last forward got no answer from any parent. */
  #lastForwardFailed = false;
  /** A cold forward (see `maybeColdForward`) may go; re-armed when a parent's directive arrives. */
  #coldForwardArmed = true;
  /** Who acknowledged the last acknowledged forward, and its window end (failover mode). */
  #acknowledgement: Acknowledgement = NO_ACKNOWLEDGEMENT;
  #lastForward: LastForward | undefined;
  readonly counters = {
    forwards: 0,
    /** Forwards every parent refused or timed out. */
    forwardFailures: 0,
    /** Single attempts that failed (one forward may fail over several times). */
    parentFailures: 0,
    /** Timer firings skipped because the previous forward was still in flight. */
    skippedForwards: 0,
    /** Forwards sent at once because a parent's connection came back while no parent answered. */
    reconnectForwards: 0,
    /** Forwards sent at once because a host reported while no directive was fresh. */
    coldForwards: 0,
  };

  constructor(options: ParentForwarderOptions) {
    this.#parentDownUntilMs = options.parents.map(() => Number.NEGATIVE_INFINITY);
    this.#reconnectWatches = options.parents.map(() => undefined);
    this.#options = options;
    this.#parents = options.parents;
    this.#scheduler = options.scheduler;
    this.#intervalMs = options.intervalMs;
  }

  /** The forward period in force (a parent's reply may set it). */
  get intervalMs(): number {
    return this.#intervalMs;
  }

  get lastForward(): LastForward | undefined {
    return this.#lastForward;
  }

  parents(nowMs: number): { target: string; healthy: boolean }[] {
    return this.#parents.map((p, i) => ({ target: p.target, healthy: this.#parentDownUntilMs[i]! <= nowMs }));
  }

  healthyParents(nowMs: number): number {
    let healthy = 0;
    for (const downUntilMs of this.#parentDownUntilMs) if (downUntilMs <= nowMs) healthy++;
    return healthy;
  }

  get running(): boolean {
    return this.#running;
  }

  start(): void {
    this.#running = true;
    this.#schedule();
  }

  /** Stops the timer and waits for an in-flight forward to settle. */
  async stop(): Promise<void> {
    this.#running = false;
    this.#timer?.cancel();
    this.#timer = undefined;
    for (const [index, watch] of this.#reconnectWatches.entries()) {
      watch?.cancel();
      this.#reconnectWatches[index] = undefined;
    }
    while (this.#inFlight) await this.#inFlight.catch(() => {});
  }

  /** Forward now (after the one in flight, if any). */
  async flush(): Promise<void> {
    while (this.#inFlight) await this.#inFlight;
    await this.#startForward();
  }

  /**
   * A host reported usage and this aggregator holds no fresh directive at all: it just started (a
   * restart, or its hosts failed over to it), or every directive ran out. Its hosts get nothing
   * until its next forward comes back, so that forward goes now instead of at the end of the
   * interval, and they find the directives at their next report. Not while the last forward
   * failed (the reconnect watch covers a parent that is down), nor while one is in flight; one per
   * cold spell (re-armed only by a directive arriving), so a parent that has nothing to give (its
   * own parent down) sees no more forwards than the interval's. Deferred to a timer of its own: the
   * host's reply does not wait for the sums.
   */
  maybeColdForward(): void {
    if (!this.#running || !this.#coldForwardArmed || this.#lastForwardFailed || this.#inFlight) return;
    this.#coldForwardArmed = false;
    this.#scheduler.setTimeout(() => {
      if (!this.#running || this.#inFlight) return;
      this.counters.coldForwards++;
      void this.#startForward();
    }, 0);
  }

  #timeoutMs(): number {
    return this.#options.reportTimeoutMs ?? Math.max(1, this.#intervalMs / 2);
  }

  #schedule(): void {
    const delayMs = this.#intervalMs * (1 + this.#options.jitterRatio * (2 * this.#options.random() - 1));
    this.#timer = this.#scheduler.setTimeout(() => {
      if (!this.#running) return;
      if (this.#inFlight) this.counters.skippedForwards++;
      else void this.#startForward();
      this.#schedule();
    }, delayMs);
  }

  #startForward(): Promise<void> {
    const run = this.#forward().finally(() => {
      if (this.#inFlight === run) this.#inFlight = undefined;
    });
    this.#inFlight = run;
    return run;
  }

  async #forward(): Promise<void> {
    const builtAtMs = this.#scheduler.nowMs();
    const fanout = this.#options.fanout;
    const request = this.#options.buildReport(builtAtMs, fanout ? NO_ACKNOWLEDGEMENT : this.#acknowledgement);
    this.counters.forwards++;
    if (fanout) return this.#forwardToAll(request);
    for (const index of this.#parentOrder(this.#scheduler.nowMs())) {
      const parent = this.#parents[index]!;
      try {
        const response = await parent.report(this.#asSentNow(request, builtAtMs), {
          timeoutMs: this.#timeoutMs(),
        });
        this.#parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
        this.#lastForwardFailed = false;
        this.#acknowledgement = {
          by: acknowledgingId(response.responderId),
          windowEndMs: request.windowEndMs,
        };
        this.#applyResponse(response, request.sequence);
        this.#recordForward(request, parent.target);
        return;
      } catch (error) {
        this.#parentFailed(index, error, 'control: parent failed, failing over');
      }
    }
    this.#lastForwardFailed = true;
    this.counters.forwardFailures++;
    this.#recordForward(request, undefined);
  }

  /** One report to every parent at once; directives from each reply are applied as it arrives. */
  async #forwardToAll(request: ReportRequest): Promise<void> {
    const answered = await Promise.all(
      this.#parents.map(async (parent, index) => {
        try {
          const response = await parent.report(request, { timeoutMs: this.#timeoutMs() });
          this.#parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
          this.#applyResponse(response, request.sequence);
          return parent.target;
        } catch (error) {
          this.#parentFailed(index, error, 'control: parent failed (fan-out: the other parents still count)');
          return undefined;
        }
      }),
    );
    const target = answered.find((t) => t !== undefined);
    this.#lastForwardFailed = target === undefined;
    if (target === undefined) this.counters.forwardFailures++;
    this.#recordForward(request, target);
  }

  #recordForward(request: ReportRequest, target: string | undefined): void {
    this.#lastForward = {
      sequence: Number(request.sequence),
      atMs: this.#scheduler.nowMs(),
      buckets: request.buckets.length,
      hostCount: request.hostCount,
      ...(target !== undefined ? { target } : {}),
    };
  }

  /** `forwardSequence`: the forward `response` answers. */
  #applyResponse(response: ReportResponse, forwardSequence: bigint): void {
    if (response.reportIntervalMs > 0) {
      this.#intervalMs = Math.min(Math.max(response.reportIntervalMs, MIN_INTERVAL_MS), MAX_INTERVAL_MS);
    }
    this.#options.heardEpoch?.(response.epoch);
    if (this.#options.applyDirectives(response.directives, forwardSequence)) this.#coldForwardArmed = true;
  }

  /**
   * `request` as sent now, `builtAtMs` having built it. A receiver reads how long ago the last
   * acknowledgement was from `window_end_ms - acknowledged_window_end_ms`, as if the report went
   * out at its window's end. A retry to the next parent goes out up to a report timeout later: by
   * then the parent that acknowledged is that much further into its grace, and a receiver reading
   * the stale age would keep this aggregator out of its sums past that grace, its zone counted
   * nowhere for about the timeout. So the acknowledgement moves back by the delay
   * (docs/control-plane.md, "Moving to another aggregator").
   */
  #asSentNow(request: ReportRequest, builtAtMs: number): ReportRequest {
    const lateMs = Math.floor(this.#scheduler.nowMs() - builtAtMs);
    if (lateMs <= 0 || request.acknowledgedBy === '') return request;
    return { ...request, acknowledgedWindowEndMs: request.acknowledgedWindowEndMs - BigInt(lateMs) };
  }

  /** Healthy parents in configured order, then the ones backing off (a last resort beats no report). */
  #parentOrder(nowMs: number): number[] {
    const healthy: number[] = [];
    const backingOff: number[] = [];
    for (let i = 0; i < this.#parents.length; i++) {
      (this.#parentDownUntilMs[i]! <= nowMs ? healthy : backingOff).push(i);
    }
    return [...healthy, ...backingOff];
  }

  /** Marks a parent down after a failed attempt; logs when it was healthy. */
  #parentFailed(index: number, error: unknown, what: string): void {
    this.counters.parentFailures++;
    this.#watchReconnect(index);
    const nowMs = this.#scheduler.nowMs();
    const wasHealthy = this.#parentDownUntilMs[index]! <= nowMs;
    this.#parentDownUntilMs[index] = nowMs + (this.#options.parentBackoffMs ?? 5 * this.#intervalMs);
    if (wasHealthy) {
      this.#options.logger.warn(
        {
          aggregator: this.#options.id,
          parent: this.#parents[index]!.target,
          error: (error as Error).message,
        },
        what,
      );
    }
  }

  /**
   * After a parent failed, waits for its connection to come back (transports that tell: gRPC). If
   * by then no parent answers forwards, this one is tried first and a forward goes at once, with the
   * interval restarting from it: after an outage (a restarted controller) the zone's usage reaches
   * the parent, and its directives come back, without waiting out the rest of the interval. One
   * forward per reconnect, never more than the timer would have sent.
   */
  #watchReconnect(index: number): void {
    const parent = this.#parents[index]!;
    if (!parent.whenConnected || this.#reconnectWatches[index] !== undefined || !this.#running) return;
    this.#reconnectWatches[index] = parent.whenConnected(() => {
      this.#reconnectWatches[index] = undefined;
      if (!this.#running || !this.#lastForwardFailed) return;
      this.#parentDownUntilMs[index] = Number.NEGATIVE_INFINITY;
      if (this.#inFlight) return;
      this.counters.reconnectForwards++;
      this.#timer?.cancel();
      void this.#startForward();
      this.#schedule();
    });
  }
}
