import {
  type ChannelCredentials,
  type ChannelOptions,
  Client,
  connectivityState,
  credentials,
  Metadata,
  status,
} from '@grpc/grpc-js';
import type { Cancellable } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, describeValue, optionNames } from '../core/validate.js';
import type { ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';
import type { ControlClient } from './control-transport.js';
import { DEFAULT_MAX_MESSAGE_BYTES, reportClientMethod } from './grpc-control-service.js';

export interface GrpcClientTlsOptions {
  /** PEM roots to trust; the system roots when absent. */
  caPem?: string | Buffer;
  /** PEM certificate and key for mutual TLS. */
  certPem?: string | Buffer;
  keyPem?: string | Buffer;
  /** Name to verify in the server's certificate when it differs from the target's host. */
  serverNameOverride?: string;
}

export interface GrpcControlClientOptions {
  /**
   * Shared token between tiers. Written into `ReportRequest.auth_token` of requests that do not
   * carry one (the request object passed in is not modified).
   */
  authToken?: string;
  /** TLS to the server; plaintext when absent (loopback and private networks). */
  tls?: GrpcClientTlsOptions;
  /** Bound on request and response size, default 4 MiB. */
  maxMessageBytes?: number;
  /**
   * Extra grpc-js channel options, merged over the defaults below (except
   * `grpc.use_local_subchannel_pool`, which reconnecting needs and which is always 1).
   */
  channelOptions?: ChannelOptions;
  /**
   * After this many reports in a row ended by their deadline, the connection is presumed stuck and
   * replaced: the next report opens a new one. 0 never replaces. Default 2. See
   * {@link createGrpcControlClient}.
   */
  reconnectAfterTimeouts?: number;
  /** Called each time the connection is replaced after timeouts (for logs and metrics); what it throws is ignored. */
  onReconnect?: (event: GrpcReconnectEvent) => void;
}

export interface GrpcReconnectEvent {
  target: string;
  /** Reports in a row that had ended by their deadline on the replaced connection. */
  timeouts: number;
  /** Whether the replaced connection was established (READY) when they timed out. */
  wasReady: boolean;
  /** Timeouts in a row the new connection is given before it is replaced in turn. */
  nextThreshold: number;
  /** Connections replaced since the last successful report, this one included. */
  replacementsSinceSuccess: number;
}

export const DEFAULT_RECONNECT_AFTER_TIMEOUTS = 2;
/**
 * The threshold doubles for each further established connection that only timed out, up to this
 * factor: a parent that is up but too slow for the deadline sees a new connection from each client
 * at most every 16 x `reconnectAfterTimeouts` reports, not a reconnect storm.
 */
const MAX_RECONNECT_BACKOFF_FACTOR = 16;

/**
 * Reconnect quickly after a parent restarts (reports are sent every ~1 s, a parent coming back
 * should see them within a couple of intervals), and ping only while a call is active: reports keep
 * the connection busy, idle pings would just trip servers' ping-abuse limits.
 */
const DEFAULT_CHANNEL_OPTIONS: ChannelOptions = {
  'grpc.keepalive_time_ms': 30_000,
  'grpc.keepalive_timeout_ms': 10_000,
  'grpc.keepalive_permit_without_calls': 0,
  'grpc.initial_reconnect_backoff_ms': 250,
  'grpc.min_reconnect_backoff_ms': 250,
  'grpc.max_reconnect_backoff_ms': 5_000,
  // The reporter owns retries (a report is superseded by the next interval's); no hidden resends.
  'grpc.enable_retries': 0,
};

/**
 * A ControlClient over gRPC (HTTP/2) with @grpc/grpc-js. The connection is opened lazily on the
 * first report and re-established on its own after failures.
 *
 * Every `report()` carries a deadline of `timeoutMs`; it settles by then with the response or a
 * SpillwayError: ERR_SPILLWAY_STORE_TIMEOUT when the deadline passed, ERR_SPILLWAY_STORE_UNAVAILABLE
 * for anything else (unreachable, refused by the server, oversized, closed client). The error's
 * `details` carry `target`, `grpcStatus` (name) and the server's message.
 *
 * Stuck connections. Where a network path drops packets (a partition, a failed switch), neither
 * end learns anything: the connection stays READY in grpc-js while TCP retransmits the unacknowledged
 * report with exponential backoff (RTO 200 ms doubling: at 0.2, 0.6, 1.4, 3.0, 6.3, 12.8 s, ... after
 * the first lost segment), and keepalive (30 s + 10 s) is far off. After the path heals, nothing
 * crosses it until the next retransmission: up to the partition's own length later. So after
 * `reconnectAfterTimeouts` reports in a row end by their deadline (any other outcome, success or
 * error, resets the count: the path answered), the grpc-js `Client` is replaced by a fresh one and
 * the next report opens a new connection, whose SYN crosses a healed path at once. During a long
 * partition each replacement's SYN is lost too, so replacements repeat every
 * `reconnectAfterTimeouts` timeouts and a fresh SYN is never more than that many reports away.
 *
 * A parent that is reachable but slower than the deadline also times every report out, and new
 * connections to it do get established (READY). To spare it a reconnect storm, the threshold doubles
 * for each further replaced connection that was READY when it timed out (up to 16x), and returns to
 * `reconnectAfterTimeouts` at the first successful report. Connections that never got established
 * (a lost SYN: a partition or a dead host) do not raise it.
 *
 * The replaced client is closed once its calls in flight have settled (each has its deadline), so
 * they are not cut short (calls still waiting for a connection would otherwise fail at once with
 * UNAVAILABLE). grpc-js shares connections between clients with equal target, options and
 * credentials through a process-wide subchannel pool: while the replaced client is open, or while
 * another client in the process uses the same connection, a fresh client would get the stuck
 * connection back. Each client therefore uses a pool of its own (`grpc.use_local_subchannel_pool`).
 *
 * `whenConnected` watches the channel's connectivity: it fires when the channel becomes READY after
 * the call, following a replaced connection to its successor. While a parent is down the channel
 * retries on its own with the reconnect backoff once a report has found it down (a connection
 * that merely dropped leaves the channel idle until the next report), so a reporter learns that
 * its parent is back within one backoff period, without sending a report to find out.
 *
 * A replaced connection that never got established leaves its TCP connect pending in grpc-js
 * 1.14 until the kernel gives up on the SYN (about 2 minutes with `tcp_syn_retries` = 6) or the
 * path heals: during a long partition, one socket per replacement, bounded by that.
 */
export function createGrpcControlClient(
  target: string,
  options: GrpcControlClientOptions = {},
): ControlClient {
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const { reconnectAfterTimeouts, credentialsForTarget } = validateGrpcControlClientOptions(options);
  const channelOptions: ChannelOptions = {
    ...DEFAULT_CHANNEL_OPTIONS,
    'grpc.max_send_message_length': maxMessageBytes,
    'grpc.max_receive_message_length': maxMessageBytes,
    ...(options.tls?.serverNameOverride
      ? { 'grpc.ssl_target_name_override': options.tls.serverNameOverride }
      : {}),
    ...options.channelOptions,
    // A replacement client must not get the stuck connection back from the global pool.
    'grpc.use_local_subchannel_pool': 1,
  };
  const authToken = options.authToken;
  const onReconnect = options.onReconnect;

  interface Generation {
    readonly client: Client;
    inFlight: number;
    /** Whether the channel was READY at one of its timeouts (established, then stuck or slow). */
    wasReady: boolean;
  }
  const open = (): Generation => ({
    client: new Client(target, credentialsForTarget, channelOptions),
    inFlight: 0,
    wasReady: false,
  });
  let current = open();
  /** Replaced generations whose calls have not all settled yet. */
  const retired = new Set<Generation>();
  let consecutiveTimeouts = 0;
  let threshold = reconnectAfterTimeouts;
  let readyReplacements = 0;
  let replacementsSinceSuccess = 0;
  let closed = false;

  const replace = (): void => {
    const old = current;
    if (old.wasReady) readyReplacements++;
    replacementsSinceSuccess++;
    const timeouts = consecutiveTimeouts;
    threshold =
      reconnectAfterTimeouts *
      Math.min(MAX_RECONNECT_BACKOFF_FACTOR, 2 ** Math.max(0, readyReplacements - 1));
    consecutiveTimeouts = 0;
    current = open();
    if (old.inFlight === 0) old.client.close();
    else retired.add(old);
    try {
      onReconnect?.({
        target,
        timeouts,
        wasReady: old.wasReady,
        nextThreshold: threshold,
        replacementsSinceSuccess,
      });
    } catch {
      // An observer's failure must not keep the report from settling (this runs in its callback).
    }
  };

  /** Accounts for one settled call of `generation`: a reply, its deadline, or another error. */
  const settled = (generation: Generation, outcome: 'ok' | 'timeout' | 'error'): void => {
    generation.inFlight--;
    if (generation !== current) {
      // A replaced connection's late outcome says nothing about the new one.
      if (generation.inFlight === 0 && retired.delete(generation)) generation.client.close();
      return;
    }
    if (outcome === 'ok') {
      readyReplacements = 0;
      replacementsSinceSuccess = 0;
      threshold = reconnectAfterTimeouts;
    }
    if (outcome !== 'timeout') {
      consecutiveTimeouts = 0;
      return;
    }
    if (generation.client.getChannel().getConnectivityState(false) === connectivityState.READY) {
      generation.wasReady = true;
    }
    consecutiveTimeouts++;
    if (!closed && reconnectAfterTimeouts > 0 && consecutiveTimeouts >= threshold) replace();
  };

  return {
    target,
    report(request: ReportRequest, { timeoutMs }: { timeoutMs: number }): Promise<ReportResponse> {
      return new Promise<ReportResponse>((resolve, reject) => {
        if (closed) {
          reject(
            new SpillwayError(ErrorCode.StoreUnavailable, `gRPC client for ${target} is closed`, { target }),
          );
          return;
        }
        const message: ReportRequest =
          authToken !== undefined && request.authToken === '' ? { ...request, authToken } : request;
        const generation = current;
        generation.inFlight++;
        try {
          generation.client.makeUnaryRequest(
            reportClientMethod.path,
            reportClientMethod.serialize,
            reportClientMethod.deserialize,
            message,
            new Metadata(),
            { deadline: Date.now() + Math.max(0, timeoutMs) },
            (error, response) => {
              if (error || response === undefined) {
                settled(generation, error?.code === status.DEADLINE_EXCEEDED ? 'timeout' : 'error');
                reject(toSpillwayError(target, error));
              } else {
                settled(generation, 'ok');
                resolve(response);
              }
            },
          );
        } catch (error) {
          // grpc-js throws synchronously on a shut-down channel or a serializer failure.
          settled(generation, 'error');
          reject(toSpillwayError(target, error));
        }
      });
    },
    whenConnected(listener: () => void): Cancellable {
      /** Fired or cancelled: no more watching. */
      let done = false;
      let cancelled = false;
      const fire = (): void => {
        done = true;
        // Not from inside grpc-js's state update: the listener typically starts a call at once.
        setImmediate(() => {
          if (!cancelled && !closed) listener();
        });
      };
      /**
       * Watches `generation`'s channel from `state` on; follows the connection to its replacement
       * (after timeouts), which counts as established when it is READY by then.
       */
      const watch = (generation: Generation, state: connectivityState): void => {
        if (done || closed) return;
        const channel = generation.client.getChannel();
        try {
          channel.watchConnectivityState(state, Number.POSITIVE_INFINITY, () => {
            if (done || closed) return;
            if (generation !== current) {
              const next = current.client.getChannel().getConnectivityState(false);
              if (next === connectivityState.READY) fire();
              else watch(current, next);
              return;
            }
            const next = channel.getConnectivityState(false);
            if (next === connectivityState.READY) fire();
            else watch(generation, next);
          });
        } catch {
          // The channel shut down (this client closed, or the generation was replaced and closed).
          if (!closed && generation !== current)
            watch(current, current.client.getChannel().getConnectivityState(false));
        }
      };
      watch(current, current.client.getChannel().getConnectivityState(false));
      return {
        cancel() {
          done = true;
          cancelled = true;
        },
      };
    },
    close(): void {
      if (closed) return;
      closed = true;
      current.client.close();
      for (const generation of retired) generation.client.close();
      retired.clear();
    },
  };
}

/**
 * What the client is built from, checked: throws ERR_SPILLWAY_INVALID_OPTION for a
 * `reconnectAfterTimeouts` that is not a non-negative integer, and what grpc-js throws for TLS
 * material it refuses (a key without a certificate...). Also run on the calling thread by
 * createWorkerControlClient, so bad options fail there, at once, as here.
 */
const GRPC_CLIENT_OPTIONS = optionNames<GrpcControlClientOptions>({
  authToken: true,
  tls: true,
  maxMessageBytes: true,
  channelOptions: true,
  reconnectAfterTimeouts: true,
  onReconnect: true,
});

const GRPC_CLIENT_TLS_OPTIONS = optionNames<GrpcClientTlsOptions>({
  caPem: true,
  certPem: true,
  keyPem: true,
  serverNameOverride: true,
});

export function validateGrpcControlClientOptions(
  options: GrpcControlClientOptions,
  where = 'createGrpcControlClient',
): {
  reconnectAfterTimeouts: number;
  credentialsForTarget: ChannelCredentials;
} {
  assertKnownOptions(options, GRPC_CLIENT_OPTIONS, where);
  assertKnownOptions(options.tls, GRPC_CLIENT_TLS_OPTIONS, `${where} tls`);
  const reconnectAfterTimeouts = options.reconnectAfterTimeouts ?? DEFAULT_RECONNECT_AFTER_TIMEOUTS;
  if (!Number.isSafeInteger(reconnectAfterTimeouts) || reconnectAfterTimeouts < 0) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `reconnectAfterTimeouts must be a non-negative integer, got ${describeValue(options.reconnectAfterTimeouts)}`,
      { option: 'reconnectAfterTimeouts', value: options.reconnectAfterTimeouts },
    );
  }
  return { reconnectAfterTimeouts, credentialsForTarget: channelCredentials(options.tls) };
}

function channelCredentials(tls: GrpcClientTlsOptions | undefined): ChannelCredentials {
  if (!tls) return credentials.createInsecure();
  return credentials.createSsl(
    toBuffer(tls.caPem) ?? null,
    toBuffer(tls.keyPem) ?? null,
    toBuffer(tls.certPem) ?? null,
  );
}

function toBuffer(pem: string | Uint8Array | undefined): Buffer | undefined {
  if (pem === undefined) return undefined;
  if (typeof pem === 'string') return Buffer.from(pem);
  // A Buffer sent to a worker thread arrives as a plain Uint8Array, which grpc-js refuses.
  return Buffer.isBuffer(pem) ? pem : Buffer.from(pem.buffer, pem.byteOffset, pem.byteLength);
}

interface GrpcErrorLike {
  code?: number;
  details?: string;
  message?: string;
}

/** Statuses that mean the parent answered and said no, rather than failed to answer. */
const REFUSALS: ReadonlySet<number> = new Set([
  status.INVALID_ARGUMENT,
  status.RESOURCE_EXHAUSTED,
  status.UNAUTHENTICATED,
  status.PERMISSION_DENIED,
]);

function toSpillwayError(target: string, error: unknown): SpillwayError {
  const grpcError = (typeof error === 'object' && error !== null ? error : {}) as GrpcErrorLike;
  const code = typeof grpcError.code === 'number' ? grpcError.code : status.UNKNOWN;
  const grpcStatus = status[code] ?? 'UNKNOWN';
  const remoteMessage = grpcError.details ?? grpcError.message ?? String(error);
  const details: Record<string, unknown> = { target, grpcStatus, remoteMessage };
  // The server leads its message with the Spillway code (grpc-control-server.ts).
  const remoteCode = /^(ERR_SPILLWAY_[A-Z_]+):/.exec(remoteMessage)?.[1];
  // RESOURCE_EXHAUSTED is also grpc-js's own, on either side, for a message over the size bound (a
  // reply too large to receive may follow a report the parent applied): a refusal only when the
  // parent named its reason.
  if (REFUSALS.has(code) && (code !== status.RESOURCE_EXHAUSTED || remoteCode !== undefined)) {
    details.refused = true;
    if (remoteCode !== undefined) details.remoteCode = remoteCode;
  }
  if (code === status.DEADLINE_EXCEEDED) {
    return new SpillwayError(ErrorCode.StoreTimeout, `report to ${target} timed out`, details, {
      cause: error,
    });
  }
  return new SpillwayError(
    ErrorCode.StoreUnavailable,
    `report to ${target} failed: ${grpcStatus}: ${remoteMessage}`,
    details,
    { cause: error },
  );
}
