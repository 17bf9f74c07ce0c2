import { fromBinary, toBinary } from '@bufbuild/protobuf';
import {
  type MethodDefinition,
  Server,
  type ServerDuplexStream,
  type ServerErrorResponse,
  type ServerUnaryCall,
  type sendUnaryData,
  status,
} from '@grpc/grpc-js';
import {
  type RateLimitRequest,
  RateLimitRequestSchema,
  RateLimitResponseSchema,
} from '../gen/envoy/service/ratelimit/v3/rls_pb.js';
import {
  type GrpcServerTlsOptions,
  grpcServerCredentials,
  listenGrpcServer,
} from '../transport/grpc-server-listen.js';
import type { RateLimitService } from './rate-limit-service.js';
import { RequestRefusal } from './request-bounds.js';

/** Where Envoy calls: the paths of envoy/service/ratelimit/v3/rls.proto and rlqs.proto. */
export const SHOULD_RATE_LIMIT_PATH = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';
export const STREAM_RATE_LIMIT_QUOTAS_PATH =
  '/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas';

/** A ShouldRateLimit request is a few hundred bytes; 1 MiB bounds what one call may make us buffer. */
export const DEFAULT_ENVOY_MAX_MESSAGE_BYTES = 1024 * 1024;

/** What the server does with an RLQS stream: raw bytes both ways, its own decoding and errors. */
export type QuotaStreamHandler = (stream: ServerDuplexStream<Buffer, Buffer>) => void;

export interface EnvoyGrpcServerOptions {
  host?: string;
  /** Default 0: any free port (read `address`). */
  port?: number;
  /** Serves ShouldRateLimit when given. */
  rls?: RateLimitService;
  /** Serves StreamRateLimitQuotas when given. */
  rlqs?: QuotaStreamHandler;
  maxMessageBytes?: number;
  /** Serve TLS (mutual TLS with `requireClientCert` and `caPem`); plaintext when absent. */
  tls?: GrpcServerTlsOptions;
  /** A call refused before the service saw it: undecodable bytes (the service counts its own refusals). */
  onMalformed?: () => void;
  /** Failures the caller should log (a handler that threw something other than a refusal). */
  onError?: (error: unknown, context: { peer: string }) => void;
  /** How long `close()` lets calls in flight finish, default 2000 ms. */
  shutdownGraceMs?: number;
}

export interface EnvoyGrpcServer {
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

const raw = { serialize: (bytes: Buffer) => bytes, deserialize: (bytes: Buffer) => bytes };

function rawMethod(path: string, streaming: boolean): MethodDefinition<Buffer, Buffer> {
  return {
    path,
    requestStream: streaming,
    responseStream: streaming,
    requestSerialize: raw.serialize,
    requestDeserialize: raw.deserialize,
    responseSerialize: raw.serialize,
    responseDeserialize: raw.deserialize,
  };
}

/**
 * Envoy's rate limit APIs over gRPC (@grpc/grpc-js). Messages arrive as bytes and are decoded here,
 * so undecodable bytes are INVALID_ARGUMENT (grpc-js would answer INTERNAL for a throwing
 * deserializer); a request over `maxMessageBytes` is RESOURCE_EXHAUSTED from grpc-js itself.
 * A `RequestRefusal` becomes its own status; anything else thrown is INTERNAL and `onError`.
 */
export async function startEnvoyGrpcServer(options: EnvoyGrpcServerOptions): Promise<EnvoyGrpcServer> {
  const host = options.host ?? '127.0.0.1';
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_ENVOY_MAX_MESSAGE_BYTES;
  const server = new Server({
    'grpc.max_receive_message_length': maxMessageBytes,
    'grpc.max_send_message_length': maxMessageBytes,
    'grpc.keepalive_time_ms': 60_000,
    'grpc.keepalive_timeout_ms': 20_000,
    // Envoy keeps one connection per worker thread and multiplexes every call on it.
    'grpc.max_concurrent_streams': 10_000,
  });
  const rls = options.rls;
  if (rls) {
    const shouldRateLimit = (
      call: ServerUnaryCall<Buffer, Buffer>,
      callback: sendUnaryData<Buffer>,
    ): void => {
      let request: RateLimitRequest;
      try {
        request = fromBinary(RateLimitRequestSchema, call.request);
      } catch (error) {
        options.onMalformed?.();
        callback(statusError(status.INVALID_ARGUMENT, `malformed RateLimitRequest: ${messageOf(error)}`));
        return;
      }
      const answer = (response: Parameters<typeof toBinary<typeof RateLimitResponseSchema>>[1]) =>
        callback(null, Buffer.from(toBinary(RateLimitResponseSchema, response)));
      const fail = (error: unknown) => {
        if (error instanceof RequestRefusal) {
          callback(statusError(error.grpcStatus, error.message));
          return;
        }
        options.onError?.(error, { peer: call.getPeer() });
        callback(statusError(status.INTERNAL, `rate limit service failed: ${messageOf(error)}`));
      };
      try {
        const response = rls.shouldRateLimit(request);
        if (response instanceof Promise) response.then(answer, fail);
        else answer(response);
      } catch (error) {
        fail(error);
      }
    };
    server.addService(
      { ShouldRateLimit: rawMethod(SHOULD_RATE_LIMIT_PATH, false) },
      { ShouldRateLimit: shouldRateLimit },
    );
  }
  if (options.rlqs) {
    server.addService(
      { StreamRateLimitQuotas: rawMethod(STREAM_RATE_LIMIT_QUOTAS_PATH, true) },
      { StreamRateLimitQuotas: options.rlqs },
    );
  }
  return listenGrpcServer(server, {
    host,
    port: options.port ?? 0,
    credentials: grpcServerCredentials(options.tls),
    shutdownGraceMs: options.shutdownGraceMs ?? 2_000,
  });
}

export function statusError(code: status, details: string): Partial<ServerErrorResponse> {
  return { code, details, message: details };
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
