import {
  type ChannelCredentials,
  type ChannelOptions,
  Client,
  credentials,
  Metadata,
  status,
} from '@grpc/grpc-js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
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
  /** Extra grpc-js channel options, merged over the defaults below. */
  channelOptions?: ChannelOptions;
}

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
 */
export function createGrpcControlClient(
  target: string,
  options: GrpcControlClientOptions = {},
): ControlClient {
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const client = new Client(target, channelCredentials(options.tls), {
    ...DEFAULT_CHANNEL_OPTIONS,
    'grpc.max_send_message_length': maxMessageBytes,
    'grpc.max_receive_message_length': maxMessageBytes,
    ...(options.tls?.serverNameOverride
      ? { 'grpc.ssl_target_name_override': options.tls.serverNameOverride }
      : {}),
    ...options.channelOptions,
  });
  const authToken = options.authToken;
  let closed = false;

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
        try {
          client.makeUnaryRequest(
            reportClientMethod.path,
            reportClientMethod.serialize,
            reportClientMethod.deserialize,
            message,
            new Metadata(),
            { deadline: Date.now() + Math.max(0, timeoutMs) },
            (error, response) => {
              if (error || response === undefined) reject(toSpillwayError(target, error));
              else resolve(response);
            },
          );
        } catch (error) {
          // grpc-js throws synchronously on a shut-down channel or a serializer failure.
          reject(toSpillwayError(target, error));
        }
      });
    },
    close(): void {
      if (closed) return;
      closed = true;
      client.close();
    },
  };
}

function channelCredentials(tls: GrpcClientTlsOptions | undefined): ChannelCredentials {
  if (!tls) return credentials.createInsecure();
  return credentials.createSsl(
    toBuffer(tls.caPem) ?? null,
    toBuffer(tls.keyPem) ?? null,
    toBuffer(tls.certPem) ?? null,
  );
}

function toBuffer(pem: string | Buffer | undefined): Buffer | undefined {
  if (pem === undefined) return undefined;
  return typeof pem === 'string' ? Buffer.from(pem) : pem;
}

interface GrpcErrorLike {
  code?: number;
  details?: string;
  message?: string;
}

function toSpillwayError(target: string, error: unknown): SpillwayError {
  const grpcError = (typeof error === 'object' && error !== null ? error : {}) as GrpcErrorLike;
  const code = typeof grpcError.code === 'number' ? grpcError.code : status.UNKNOWN;
  const grpcStatus = status[code] ?? 'UNKNOWN';
  const remoteMessage = grpcError.details ?? grpcError.message ?? String(error);
  const details = { target, grpcStatus, remoteMessage };
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
