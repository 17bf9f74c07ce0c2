import { Buffer } from 'node:buffer';
import { status } from '@grpc/grpc-js';
import type { RateLimitRequest } from '../gen/envoy/service/ratelimit/v3/rls_pb.js';
import { RateLimitUnit } from '../gen/envoy/type/v3/ratelimit_unit_pb.js';
import type { RefusalReason } from './rls-stats.js';

/**
 * What one ShouldRateLimit call may carry. Envoy sends a handful of descriptors of a few entries;
 * these bounds keep a hostile or broken client from making one call cost much (10,000 descriptors,
 * megabyte values) while leaving every real configuration room.
 */
export interface RequestBounds {
  /** Descriptors per request. Default 256. */
  maxDescriptors: number;
  /** Entries per descriptor. Default 64. */
  maxEntries: number;
  /** UTF-8 bytes of one entry's key or value. Default 64 KiB (Envoy's own request headers are bounded at 60 KiB). */
  maxEntryBytes: number;
}

export const DEFAULT_REQUEST_BOUNDS: RequestBounds = {
  maxDescriptors: 256,
  maxEntries: 64,
  maxEntryBytes: 64 * 1024,
};

export function resolveBounds(bounds: Partial<RequestBounds> | undefined): RequestBounds {
  return { ...DEFAULT_REQUEST_BOUNDS, ...bounds };
}

/** A request refused with a gRPC status instead of an answer; `reason` labels the refusal metric. */
export class RequestRefusal extends Error {
  constructor(
    readonly grpcStatus: status,
    message: string,
    readonly reason: RefusalReason,
  ) {
    super(message);
    this.name = 'RequestRefusal';
  }

  static notFound(message: string): RequestRefusal {
    return new RequestRefusal(status.NOT_FOUND, message, 'unknown_domain');
  }
}

/**
 * The reference server's two refusals (plain errors there, so gRPC status UNKNOWN, with its words),
 * then our bounds (INVALID_ARGUMENT, naming the field and the bound).
 */
export function checkRequestBounds(request: RateLimitRequest, bounds: RequestBounds): void {
  if (request.domain === '') {
    throw new RequestRefusal(status.UNKNOWN, 'rate limit domain must not be empty', 'empty_domain');
  }
  const descriptors = request.descriptors;
  if (descriptors.length === 0) {
    throw new RequestRefusal(
      status.UNKNOWN,
      'rate limit descriptor list must not be empty',
      'empty_descriptors',
    );
  }
  if (descriptors.length > bounds.maxDescriptors) {
    throw new RequestRefusal(
      status.INVALID_ARGUMENT,
      `the request has ${descriptors.length} descriptors, more than the ${bounds.maxDescriptors} allowed`,
      'too_many_descriptors',
    );
  }
  const invalid = (message: string) =>
    new RequestRefusal(status.INVALID_ARGUMENT, message, 'invalid_descriptor');
  if (tooLong(request.domain, bounds.maxEntryBytes)) {
    throw invalid(`domain is longer than ${bounds.maxEntryBytes} bytes`);
  }
  for (let i = 0; i < descriptors.length; i++) {
    const descriptor = descriptors[i]!;
    const entries = descriptor.entries;
    if (entries.length === 0) throw invalid(`descriptors[${i}] has no entries`);
    if (entries.length > bounds.maxEntries) {
      throw invalid(
        `descriptors[${i}] has ${entries.length} entries, more than the ${bounds.maxEntries} allowed`,
      );
    }
    for (let j = 0; j < entries.length; j++) {
      const entry = entries[j]!;
      if (entry.key === '') throw invalid(`descriptors[${i}].entries[${j}].key is empty`);
      for (const field of ['key', 'value'] as const) {
        if (tooLong(entry[field], bounds.maxEntryBytes)) {
          throw invalid(
            `descriptors[${i}].entries[${j}].${field} is ${Buffer.byteLength(entry[field])} bytes, more than the ${bounds.maxEntryBytes} allowed`,
          );
        }
      }
    }
    const limit = descriptor.limit;
    if (
      limit !== undefined &&
      (limit.unit === RateLimitUnit.UNKNOWN || RateLimitUnit[limit.unit] === undefined)
    ) {
      throw invalid(
        `descriptors[${i}].limit.unit must be SECOND, MINUTE, HOUR, DAY, MONTH or YEAR, got ${limit.unit}`,
      );
    }
  }
}

function tooLong(text: string, maxBytes: number): boolean {
  return text.length > maxBytes || (text.length * 3 > maxBytes && Buffer.byteLength(text) > maxBytes);
}
