import { create, fromBinary, type MessageInitShape, toBinary } from '@bufbuild/protobuf';
import { Client, credentials, type ServiceError } from '@grpc/grpc-js';
import { SHOULD_RATE_LIMIT_PATH } from '../../src/envoy/envoy-grpc-server.js';
import {
  type RateLimitRequest,
  RateLimitRequestSchema,
  type RateLimitResponse,
  RateLimitResponseSchema,
} from '../../src/gen/envoy/service/ratelimit/v3/rls_pb.js';

/** What Envoy's ratelimit filter does on the wire: one unary ShouldRateLimit per request. */
export interface RlsClient {
  shouldRateLimit(
    request: MessageInitShape<typeof RateLimitRequestSchema> | RateLimitRequest,
    options?: { timeoutMs?: number },
  ): Promise<RateLimitResponse>;
  /** Raw bytes, for malformed requests. */
  callRaw(bytes: Buffer, options?: { timeoutMs?: number }): Promise<Buffer>;
  close(): void;
}

export function createRlsClient(address: string): RlsClient {
  const client = new Client(address, credentials.createInsecure(), {
    'grpc.max_send_message_length': 16 * 1024 * 1024,
  });
  const callRaw = (bytes: Buffer, options: { timeoutMs?: number } = {}) =>
    new Promise<Buffer>((resolve, reject) => {
      client.makeUnaryRequest(
        SHOULD_RATE_LIMIT_PATH,
        (b: Buffer) => b,
        (b: Buffer) => b,
        bytes,
        { deadline: Date.now() + (options.timeoutMs ?? 5_000) },
        (error: ServiceError | null, response?: Buffer) => (error ? reject(error) : resolve(response!)),
      );
    });
  return {
    async shouldRateLimit(request, options) {
      const message =
        '$typeName' in request ? (request as RateLimitRequest) : create(RateLimitRequestSchema, request);
      const bytes = await callRaw(Buffer.from(toBinary(RateLimitRequestSchema, message)), options);
      return fromBinary(RateLimitResponseSchema, bytes);
    },
    callRaw,
    close: () => client.close(),
  };
}
