import type { Cancellable } from '../core/clock.js';
import type { ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';

/**
 * The one seam between tiers of the global rate limiter. Every tier sends the same `Report`
 * (usage up, directives down); implementations are the in-memory network (tests, the fleet
 * simulator, in virtual time) and gRPC over HTTP/2 (real processes).
 *
 * Contract: `report()` settles within `timeoutMs` (rejecting with a SpillwayError of code
 * ERR_SPILLWAY_STORE_TIMEOUT or ERR_SPILLWAY_STORE_UNAVAILABLE), never hangs, and never throws
 * synchronously. Callers may have at most one report in flight per client. A report the receiver
 * answered with a refusal (invalid, over capacity, not authenticated) is STORE_UNAVAILABLE with
 * `details.refused: true`, and `details.remoteCode` when the receiver named a Spillway code, in
 * every transport alike: the sender's metrics and logs tell "parent down" from "parent says no".
 */
export interface ControlClient {
  /** Where this client sends (an address such as `127.0.0.1:7070` or an in-memory name). */
  readonly target: string;
  report(request: ReportRequest, options: { timeoutMs: number }): Promise<ReportResponse>;
  /**
   * Optional (transports with connections): calls `listener` once, the next time a connection to
   * `target` is established after this call, and never for one established before it (a stuck
   * connection that stays up does not count). Never calls it synchronously, nor after `cancel()`
   * or `close()`. A reporter whose report failed uses it to send its next report as soon as the
   * parent is back, instead of at its next interval.
   */
  whenConnected?(listener: () => void): Cancellable;
  close(): void;
}

/** What a receiving tier (aggregator, controller) implements. Throwing a SpillwayError refuses the report. */
export type ReportHandler = (
  request: ReportRequest,
  context: ReportContext,
) => Promise<ReportResponse> | ReportResponse;

export interface ReportContext {
  /** The sender's address as the transport sees it. */
  peer: string;
  /**
   * Set when the transport authenticated the report with a token bound to a zone (the gRPC server's
   * `zoneTokens`): the one zone the report may claim. A receiving tier refuses a report claiming
   * another and keeps reporters of different zone tokens apart; `createController` and
   * `createAggregator` do both. Absent: unauthenticated, or the tree's shared token (any zone).
   */
  tokenZone?: string;
}

export interface ControlServer {
  /** The address clients connect to (with the real port when listening on port 0). */
  readonly address: string;
  close(): Promise<void>;
}
