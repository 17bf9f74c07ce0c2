import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { Client, type ClientDuplexStream, credentials } from '@grpc/grpc-js';
import { STREAM_RATE_LIMIT_QUOTAS_PATH } from '../../src/envoy/envoy-grpc-server.js';
import {
  type RateLimitQuotaResponse,
  RateLimitQuotaResponseSchema,
  type RateLimitQuotaUsageReports,
  RateLimitQuotaUsageReportsSchema,
} from '../../src/gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';

/** One Envoy's StreamRateLimitQuotas stream, as grpc-js gives it; `ended` settles with the final status code. */
export interface RlqsStream {
  send(report: RateLimitQuotaUsageReports): void;
  sendRaw(bytes: Buffer): void;
  /** Half-close (an Envoy shutting down) or cancel (an Envoy that vanished). */
  close(): void;
  cancel(): void;
  readonly ended: Promise<{ code: number; details: string }>;
}

export function openRlqsStream(
  client: Client,
  onResponse: (response: RateLimitQuotaResponse) => void,
): RlqsStream {
  const call: ClientDuplexStream<Buffer, Buffer> = client.makeBidiStreamRequest(
    STREAM_RATE_LIMIT_QUOTAS_PATH,
    (b: Buffer) => b,
    (b: Buffer) => b,
  );
  call.on('data', (bytes: Buffer) => onResponse(fromBinary(RateLimitQuotaResponseSchema, bytes)));
  const ended = new Promise<{ code: number; details: string }>((resolve) => {
    call.on('status', (s) => resolve({ code: s.code, details: s.details }));
  });
  call.on('error', () => {});
  return {
    send: (report) => {
      if (!call.writableEnded) call.write(Buffer.from(toBinary(RateLimitQuotaUsageReportsSchema, report)));
    },
    sendRaw: (bytes) => call.write(bytes),
    close: () => call.end(),
    cancel: () => call.cancel(),
    ended,
  };
}

export function createRlqsClient(address: string): Client {
  return new Client(address, credentials.createInsecure());
}
