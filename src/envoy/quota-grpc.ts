import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import {
  RateLimitQuotaResponseSchema,
  type RateLimitQuotaUsageReports,
  RateLimitQuotaUsageReportsSchema,
} from '../gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import type { QuotaStreamHandler } from './envoy-grpc-server.js';
import type { QuotaService } from './quota-service.js';

/**
 * Responses waiting to be written to one stream. A client that stops reading while it keeps
 * reporting would otherwise grow this process's memory: past it, its stream ends RESOURCE_EXHAUSTED.
 */
export const MAX_PENDING_RESPONSE_BYTES = 1024 * 1024;

/**
 * StreamRateLimitQuotas over grpc-js: bytes in and out, decoded here (undecodable bytes end the
 * stream INVALID_ARGUMENT), each stream one session of the quota service. A client that half-closes
 * or goes away closes its session (its usage stops counting and its share is given back).
 */
export function quotaStreamHandler(
  service: QuotaService,
  hooks: { onMalformed?: () => void } = {},
): QuotaStreamHandler {
  return (call) => {
    /** Set before the session is closed, so its own end callback does not end the call OK first. */
    let ended = false;
    const fail = (code: status, details: string) => {
      if (ended) return;
      ended = true;
      call.emit('error', { code, details, message: details });
    };
    const session = service.open(
      (response) => {
        if (ended) return;
        if (call.writableLength > MAX_PENDING_RESPONSE_BYTES) {
          fail(status.RESOURCE_EXHAUSTED, 'the client is not reading its responses');
          session.close();
          return;
        }
        call.write(Buffer.from(toBinary(RateLimitQuotaResponseSchema, response)));
      },
      (refusal) => {
        if (refusal) {
          fail(refusal.grpcStatus, refusal.message);
        } else if (!ended) {
          ended = true;
          call.end();
        }
      },
    );
    call.on('data', (bytes: Buffer) => {
      if (ended) return;
      let report: RateLimitQuotaUsageReports;
      try {
        report = fromBinary(RateLimitQuotaUsageReportsSchema, bytes);
      } catch (error) {
        hooks.onMalformed?.();
        fail(status.INVALID_ARGUMENT, `malformed RateLimitQuotaUsageReports: ${(error as Error).message}`);
        session.close();
        return;
      }
      session.receive(report);
    });
    call.on('end', () => session.close());
    call.on('cancelled', () => session.close());
    call.on('close', () => session.close());
  };
}
