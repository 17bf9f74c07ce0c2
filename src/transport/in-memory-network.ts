import { fromBinary, toBinary } from '@bufbuild/protobuf';
import type { Random, Scheduler } from '../core/clock.js';
import { systemScheduler } from '../core/clock.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../gen/spillway/v1/control_pb.js';
import type { ControlClient, ControlServer, ReportHandler } from './control-transport.js';

/**
 * The control transport without sockets: tiers of the global limiter talk through it in tests and
 * inside the fleet simulator, in virtual time when given a ManualClock as scheduler.
 *
 * Messages cross it as protobuf bytes (`toBinary` on send, `fromBinary` on delivery), never as
 * shared objects: a tier that mutates a request after sending, or a reply after returning it,
 * cannot reach into another tier, and every message proves it survives the real wire format.
 * Encoding a report of a few hundred buckets costs microseconds, a rounding error next to the
 * interval it is sent at.
 */
export interface InMemoryNetworkOptions {
  /** Delivers messages and fires timeouts; pass a ManualClock for virtual time. Default: real timers. */
  scheduler?: Scheduler;
  /** Draws loss and jitter. Default `Math.random`. */
  random?: Random;
  /** One-way delay of every message. Default 0 (still delivered through the scheduler, never inline). */
  delayMs?: number;
  /** Extra one-way delay drawn uniformly from [0, jitterMs). Default 0. */
  jitterMs?: number;
  /** Probability in [0, 1] that a message (request or reply) is lost. Default 0. */
  lossRate?: number;
}

export interface LinkOptions {
  delayMs?: number;
  jitterMs?: number;
  lossRate?: number;
}

interface Endpoint {
  handler: ReportHandler;
}

/** A client's `whenConnected` waiting for its target to listen again or its partition to heal. */
interface ConnectWatcher {
  from: string;
  to: string;
  /** Cancelled, or its client closed: never called. */
  done: boolean;
  listener: () => void;
}

export class InMemoryNetwork {
  readonly #scheduler: Scheduler;
  readonly #random: Random;
  readonly #endpoints = new Map<string, Endpoint>();
  readonly #down = new Set<string>();
  readonly #connectWatchers = new Set<ConnectWatcher>();
  #delayMs = 0;
  #jitterMs = 0;
  #lossRate = 0;
  #anonymousClients = 0;

  constructor(options: InMemoryNetworkOptions = {}) {
    this.#scheduler = options.scheduler ?? systemScheduler;
    this.#random = options.random ?? Math.random;
    this.setLink(options);
  }

  /** Serve `handler` at `address` (any name, e.g. `agg-1`). One server per address. */
  listen(address: string, handler: ReportHandler): ControlServer {
    if (typeof address !== 'string' || address.length === 0) {
      throw new SpillwayError(ErrorCode.InvalidOption, 'address must be a non-empty string', {
        field: 'address',
      });
    }
    if (this.#endpoints.has(address)) {
      throw new SpillwayError(ErrorCode.InvalidOption, `address ${address} is already in use`, {
        field: 'address',
        address,
      });
    }
    const endpoint: Endpoint = { handler };
    this.#endpoints.set(address, endpoint);
    this.#connected(address);
    return {
      address,
      close: async () => {
        if (this.#endpoints.get(address) === endpoint) this.#endpoints.delete(address);
      },
    };
  }

  /**
   * A client sending to `address`; `from` names the sender (the peer a handler sees, and what
   * `partition` matches). Its `whenConnected` fires, one trip later (a handshake), when a server
   * starts listening at `address` or a partition of either end heals while the other is reachable:
   * the moments a real connection would be established again.
   */
  connect(address: string, options: { from?: string } = {}): ControlClient {
    const from = options.from ?? `client-${++this.#anonymousClients}`;
    let closed = false;
    const watchers = new Set<ConnectWatcher>();
    return {
      target: address,
      report: (request, { timeoutMs }) =>
        closed
          ? Promise.reject(unavailable(address, 'client is closed'))
          : this.#send(from, address, request, timeoutMs),
      whenConnected: (listener) => {
        const watcher: ConnectWatcher = {
          from,
          to: address,
          done: closed,
          listener: () => {
            watchers.delete(watcher);
            listener();
          },
        };
        const cancel = (): void => {
          watcher.done = true;
          watchers.delete(watcher);
          this.#connectWatchers.delete(watcher);
        };
        if (!closed) {
          watchers.add(watcher);
          this.#connectWatchers.add(watcher);
        }
        return { cancel };
      },
      close: () => {
        closed = true;
        for (const watcher of watchers) {
          watcher.done = true;
          this.#connectWatchers.delete(watcher);
        }
        watchers.clear();
      },
    };
  }

  /** While `down`, every message to or from `address` is lost (the sender sees ERR_SPILLWAY_STORE_UNAVAILABLE). */
  partition(address: string, down: boolean): void {
    if (down) this.#down.add(address);
    else if (this.#down.delete(address)) this.#connected(address);
  }

  /** `address` became reachable: clients waiting on a connection to or from it are told, a trip later. */
  #connected(address: string): void {
    for (const watcher of this.#connectWatchers) {
      if (watcher.to !== address && watcher.from !== address) continue;
      if (!this.#endpoints.has(watcher.to) || this.#down.has(watcher.to) || this.#down.has(watcher.from)) {
        continue;
      }
      this.#connectWatchers.delete(watcher);
      this.#scheduler.setTimeout(() => {
        if (watcher.done) return;
        watcher.done = true;
        watcher.listener();
      }, this.#oneWayDelayMs());
    }
  }

  /** Change delay, jitter or loss for every message sent from now on. */
  setLink(options: LinkOptions): void {
    if (options.delayMs !== undefined) this.#delayMs = nonNegative('delayMs', options.delayMs);
    if (options.jitterMs !== undefined) this.#jitterMs = nonNegative('jitterMs', options.jitterMs);
    if (options.lossRate !== undefined) {
      const lossRate = nonNegative('lossRate', options.lossRate);
      if (lossRate > 1) {
        throw new SpillwayError(ErrorCode.InvalidOption, `lossRate must be in [0, 1], got ${lossRate}`, {
          field: 'lossRate',
        });
      }
      this.#lossRate = lossRate;
    }
  }

  #oneWayDelayMs(): number {
    return this.#delayMs + (this.#jitterMs > 0 ? this.#random() * this.#jitterMs : 0);
  }

  /** A message is lost when the link drops it or either end is partitioned at the moment it travels. */
  #lost(from: string, to: string): boolean {
    if (this.#down.has(from) || this.#down.has(to)) return true;
    return this.#lossRate > 0 && this.#random() < this.#lossRate;
  }

  #send(from: string, to: string, request: ReportRequest, timeoutMs: number): Promise<ReportResponse> {
    if (typeof timeoutMs !== 'number' || !(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      // As over gRPC, where such a deadline has passed before the call starts.
      return Promise.reject(
        new SpillwayError(ErrorCode.StoreTimeout, `no time for a reply from ${to}: timeoutMs ${timeoutMs}`, {
          target: to,
          timeoutMs,
        }),
      );
    }
    let requestBytes: Uint8Array;
    try {
      requestBytes = toBinary(ReportRequestSchema, request);
    } catch (error) {
      return Promise.reject(
        new SpillwayError(
          ErrorCode.InvalidReport,
          'report could not be encoded',
          { target: to },
          { cause: error },
        ),
      );
    }
    return new Promise<ReportResponse>((resolve, reject) => {
      let settled = false;
      const timeout = this.#scheduler.setTimeout(() => {
        finish(
          new SpillwayError(ErrorCode.StoreTimeout, `no reply from ${to} within ${timeoutMs} ms`, {
            target: to,
            timeoutMs,
          }),
        );
      }, timeoutMs);
      const finish = (outcome: SpillwayError | Uint8Array): void => {
        if (settled) return;
        settled = true;
        timeout.cancel();
        if (outcome instanceof Uint8Array) {
          try {
            resolve(fromBinary(ReportResponseSchema, outcome));
          } catch (error) {
            reject(unavailable(to, 'reply could not be decoded', error));
          }
        } else {
          reject(outcome);
        }
      };
      // Every failure is noticed one trip later, as a reset connection would be.
      const failAfterTrip = (reason: string, cause?: unknown): void => {
        this.#scheduler.setTimeout(() => finish(unavailable(to, reason, cause)), this.#oneWayDelayMs());
      };

      if (this.#lost(from, to)) {
        failAfterTrip(this.#down.has(from) || this.#down.has(to) ? 'partitioned' : 'request lost');
        return;
      }
      this.#scheduler.setTimeout(() => {
        const endpoint = this.#endpoints.get(to);
        if (!endpoint) {
          failAfterTrip('no server at this address');
          return;
        }
        const reply = (outcome: ReportResponse | SpillwayError): void => {
          if (settled) return;
          if (this.#lost(to, from)) {
            failAfterTrip(this.#down.has(from) || this.#down.has(to) ? 'partitioned' : 'reply lost');
            return;
          }
          let replyBytes: Uint8Array | SpillwayError;
          if (outcome instanceof SpillwayError) {
            replyBytes = outcome;
          } else {
            try {
              replyBytes = toBinary(ReportResponseSchema, outcome);
            } catch (error) {
              replyBytes = unavailable(to, 'reply could not be encoded', error);
            }
          }
          this.#scheduler.setTimeout(() => finish(replyBytes), this.#oneWayDelayMs());
        };
        let result: Promise<ReportResponse> | ReportResponse;
        try {
          result = endpoint.handler(fromBinary(ReportRequestSchema, requestBytes), { peer: from });
        } catch (error) {
          reply(refusal(to, error));
          return;
        }
        if (isPromiseLike(result)) {
          result.then(reply, (error: unknown) => reply(refusal(to, error)));
        } else {
          reply(result);
        }
      }, this.#oneWayDelayMs());
    });
  }
}

function unavailable(target: string, reason: string, cause?: unknown): SpillwayError {
  return new SpillwayError(
    ErrorCode.StoreUnavailable,
    `${target} unavailable: ${reason}`,
    { target, reason },
    cause === undefined ? undefined : { cause },
  );
}

/**
 * A handler's SpillwayError is a refusal, delivered as the gRPC client delivers one (see
 * control-transport.ts): STORE_UNAVAILABLE, `refused`, the handler's code as `remoteCode`. Anything
 * else is a server fault.
 */
function refusal(target: string, error: unknown): SpillwayError {
  if (isSpillwayError(error)) {
    return new SpillwayError(
      ErrorCode.StoreUnavailable,
      `report to ${target} refused: ${error.code}: ${error.message}`,
      {
        target,
        refused: true,
        remoteCode: error.code,
        remoteMessage: error.message,
        remoteDetails: error.details,
      },
      { cause: error },
    );
  }
  return unavailable(target, 'handler failed', error);
}

function isPromiseLike<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown }).then === 'function';
}

function nonNegative(field: string, value: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, `${field} must be a finite number >= 0, got ${value}`, {
      field,
    });
  }
  return value;
}
