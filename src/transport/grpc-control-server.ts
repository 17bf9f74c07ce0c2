import { timingSafeEqual } from 'node:crypto';
import {
  Server,
  type ServerErrorResponse,
  type ServerUnaryCall,
  type sendUnaryData,
  status,
} from '@grpc/grpc-js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, optionNames } from '../core/validate.js';
import type { ReportRequest } from '../gen/spillway/v1/control_pb.js';
import { RECEIVER_MAX_BUCKETS_PER_REPORT } from '../protocol/report-bounds.js';
import type { ControlServer, ReportContext, ReportHandler } from './control-transport.js';
import { DEFAULT_MAX_MESSAGE_BYTES, reportServerMethod } from './grpc-control-service.js';
import { type GrpcServerTlsOptions, grpcServerCredentials, listenGrpcServer } from './grpc-server-listen.js';
// The receiving side decodes with the hand-written codec: byte-identical to protobuf-es
// (property-tested in test/transport/report-codec.test.ts) and faster, which is what lets one
// aggregator core ingest its 10,000 reports of 50 buckets a second (bench/results/control.md).
import { decodeReportRequest, encodeReportResponse, readReportAuthToken } from './report-codec.js';

export type { GrpcServerTlsOptions } from './grpc-server-listen.js';

export interface GrpcControlServerOptions {
  /** Interface to bind, default 127.0.0.1 (loopback: exposing the control plane is a deliberate choice). */
  host?: string;
  /** Port to bind, default 0 (any free port; read the real one from `address`). */
  port?: number;
  handler: ReportHandler;
  /** Bound on request and response size, default 4 MiB; larger requests get RESOURCE_EXHAUSTED. */
  maxMessageBytes?: number;
  /**
   * Most buckets decoded from one request; past it the request is refused (INVALID_ARGUMENT) without
   * decoding the rest. Default 10,000, the receivers' `maxBucketsPerReport`: raise both together.
   */
  maxBucketsPerReport?: number;
  /**
   * The tree's shared token: it authenticates a report for any zone. When this or `zoneTokens` is
   * set, a report carrying none of the tokens is refused with UNAUTHENTICATED before the handler runs.
   */
  authToken?: string;
  /**
   * Tokens bound to one zone each: a report carrying one reaches the handler with
   * `context.tokenZone` set, and the handler refuses it unless it claims that zone. A zone may have
   * several tokens (rotation); a token binds one zone and differs from `authToken`.
   */
  zoneTokens?: readonly ZoneToken[];
  tls?: GrpcServerTlsOptions;
  /** How long `close()` waits for in-flight calls before cutting connections, default 2000 ms. */
  shutdownGraceMs?: number;
  /**
   * Called for each report refused before the handler ran: `invalid` (undecodable, or more than
   * `maxBucketsPerReport` buckets; `code` is ERR_SPILLWAY_INVALID_REPORT) or `unauthenticated`, so a
   * receiver counts them with the reports its handler refuses.
   */
  onRefused?: (
    refusal: { result: 'invalid' | 'unauthenticated'; code?: string },
    context: { peer: string },
  ) => void;
  /** Called for failures the caller should log: handler errors answered with INTERNAL. */
  onError?: (error: unknown, context: { peer: string }) => void;
}

export interface ZoneToken {
  zone: string;
  token: string;
}

export interface GrpcControlServer extends ControlServer {
  /** The bound port (the real one when `port` was 0). */
  readonly port: number;
}

/**
 * Serves `spillway.v1.RateControl/Report` over gRPC with @grpc/grpc-js, calling `handler` for each
 * decoded report.
 *
 * Status mapping (the SpillwayError code leads the status message, so logs on both sides match):
 * - undecodable request bytes, or a handler throwing ERR_SPILLWAY_INVALID_REPORT: INVALID_ARGUMENT;
 * - a handler throwing ERR_SPILLWAY_CAPACITY_EXCEEDED: RESOURCE_EXHAUSTED;
 * - a missing or wrong auth token (neither the shared one nor a zone token): UNAUTHENTICATED;
 * - anything else the handler throws, or a response that cannot be encoded: INTERNAL (and `onError`).
 */
const GRPC_SERVER_OPTIONS = optionNames<GrpcControlServerOptions>({
  host: true,
  port: true,
  handler: true,
  maxMessageBytes: true,
  maxBucketsPerReport: true,
  authToken: true,
  zoneTokens: true,
  tls: true,
  shutdownGraceMs: true,
  onRefused: true,
  onError: true,
});

export async function startGrpcControlServer(options: GrpcControlServerOptions): Promise<GrpcControlServer> {
  assertKnownOptions(options, GRPC_SERVER_OPTIONS, 'startGrpcControlServer');
  assertKnownOptions(
    options.tls,
    optionNames<GrpcServerTlsOptions>({ certPem: true, keyPem: true, caPem: true, requireClientCert: true }),
    'startGrpcControlServer tls',
  );
  const host = options.host ?? '127.0.0.1';
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const shutdownGraceMs = options.shutdownGraceMs ?? 2_000;
  const { handler, onError } = options;
  const maxBucketsPerReport = options.maxBucketsPerReport ?? RECEIVER_MAX_BUCKETS_PER_REPORT;
  const authenticate = createAuthenticator(options.authToken, options.zoneTokens);
  const credentials = grpcServerCredentials(options.tls);

  const server = new Server({
    'grpc.max_receive_message_length': maxMessageBytes,
    'grpc.max_send_message_length': maxMessageBytes,
    // Find dead peers (a host that vanished mid-call) without waiting for TCP timeouts.
    'grpc.keepalive_time_ms': 60_000,
    'grpc.keepalive_timeout_ms': 20_000,
    'grpc.max_concurrent_streams': 1_000,
  });

  const report = (call: ServerUnaryCall<Buffer, Buffer>, callback: sendUnaryData<Buffer>): void => {
    const peer = call.getPeer();
    let request: ReportRequest;
    let authenticated: { zone?: string } | undefined;
    try {
      // The token first, from a scan that builds nothing: a stranger's report costs one pass over
      // its bytes, never a decoded message.
      authenticated = authenticate.required
        ? authenticate(readReportAuthToken(call.request))
        : authenticate('');
      if (authenticated === undefined) {
        options.onRefused?.({ result: 'unauthenticated' }, { peer });
        callback(statusError(status.UNAUTHENTICATED, 'report refused: missing or wrong auth_token'));
        return;
      }
      request = decodeReportRequest(call.request, maxBucketsPerReport);
    } catch (error) {
      options.onRefused?.({ result: 'invalid', code: ErrorCode.InvalidReport }, { peer });
      callback(
        statusError(
          status.INVALID_ARGUMENT,
          `${ErrorCode.InvalidReport}: malformed ReportRequest: ${messageOf(error)}`,
        ),
      );
      return;
    }
    const context: ReportContext =
      authenticated.zone === undefined ? { peer } : { peer, tokenZone: authenticated.zone };
    // Promise.resolve().then also turns a synchronous throw in the handler into a rejection.
    Promise.resolve()
      .then(() => handler(request, context))
      .then((response) => {
        const bytes = encodeReportResponse(response);
        return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      })
      .then(
        (bytes) => callback(null, bytes),
        (error: unknown) => {
          if (isSpillwayError(error, ErrorCode.InvalidReport)) {
            callback(statusError(status.INVALID_ARGUMENT, `${error.code}: ${error.message}`));
          } else if (isSpillwayError(error, ErrorCode.CapacityExceeded)) {
            callback(statusError(status.RESOURCE_EXHAUSTED, `${error.code}: ${error.message}`));
          } else {
            onError?.(error, { peer });
            const code = isSpillwayError(error) ? `${error.code}: ` : '';
            callback(statusError(status.INTERNAL, `${code}report handler failed: ${messageOf(error)}`));
          }
        },
      );
  };
  server.addService({ Report: reportServerMethod }, { Report: report });

  return listenGrpcServer(server, { host, port: options.port ?? 0, credentials, shutdownGraceMs });
}

/**
 * Checks `zoneTokens` (and that none equals the shared token) and returns them; throws
 * ERR_SPILLWAY_INVALID_OPTION naming the zone otherwise. Token values never appear in messages.
 */
export function validateZoneTokens(
  zoneTokens: readonly ZoneToken[],
  authToken?: string,
): readonly ZoneToken[] {
  const zoneOf = new Map<string, string>();
  for (const { zone, token } of zoneTokens) {
    if (typeof zone !== 'string' || zone === '') {
      throw new SpillwayError(ErrorCode.InvalidOption, 'zoneTokens: a zone must be a non-empty string', {
        field: 'zoneTokens',
      });
    }
    if (typeof token !== 'string' || token === '') {
      throw new SpillwayError(ErrorCode.InvalidOption, `zoneTokens: the token of zone ${zone} is empty`, {
        field: 'zoneTokens',
        zone,
      });
    }
    if (token === authToken) {
      throw new SpillwayError(
        ErrorCode.InvalidOption,
        `zoneTokens: the token of zone ${zone} is the shared token, which is valid for any zone`,
        { field: 'zoneTokens', zone },
      );
    }
    const bound = zoneOf.get(token);
    if (bound !== undefined && bound !== zone) {
      throw new SpillwayError(
        ErrorCode.InvalidOption,
        `zoneTokens: zones ${bound} and ${zone} have the same token; a token binds one zone`,
        { field: 'zoneTokens', zone },
      );
    }
    zoneOf.set(token, zone);
  }
  return zoneTokens;
}

/**
 * Maps a report's token to what it authenticates: `{}` (the shared token, or no token configured at
 * all), `{ zone }` (a zone token) or undefined (refused). Every configured token is compared, in
 * constant time per token, whichever matches.
 */
interface Authenticator {
  (given: string): { zone?: string } | undefined;
  /** False when no token is configured: every report is accepted, and none needs reading. */
  readonly required: boolean;
}

function createAuthenticator(
  authToken: string | undefined,
  zoneTokens: readonly ZoneToken[] | undefined,
): Authenticator {
  if (authToken === '') {
    // An empty token would match every report that carries none: auth on in name only.
    throw new SpillwayError(ErrorCode.InvalidOption, 'authToken must not be empty', { field: 'authToken' });
  }
  const zoned = validateZoneTokens(zoneTokens ?? [], authToken).map(({ zone, token }) => ({
    zone,
    token: Buffer.from(token),
  }));
  const shared = authToken !== undefined ? Buffer.from(authToken) : undefined;
  const unbound: { zone?: string } = {};
  if (shared === undefined && zoned.length === 0) return Object.assign(() => unbound, { required: false });
  const check = (givenText: string) => {
    const given = Buffer.from(givenText);
    let result: { zone?: string } | undefined;
    if (shared !== undefined && tokenMatches(shared, given)) result = unbound;
    for (const entry of zoned) {
      if (tokenMatches(entry.token, given) && result === undefined) result = entry;
    }
    return result;
  };
  return Object.assign(check, { required: true });
}

function tokenMatches(expected: Buffer, given: Buffer): boolean {
  return given.length === expected.length && timingSafeEqual(given, expected);
}

function statusError(code: status, details: string): Partial<ServerErrorResponse> {
  return { code, details, message: details };
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
