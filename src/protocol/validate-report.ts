import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { ReportRequest } from '../gen/spillway/v1/control_pb.js';
import {
  MAX_ACKNOWLEDGED_BY_BYTES,
  MAX_REPORT_WINDOW_MS,
  RECEIVER_MAX_BUCKETS_PER_REPORT,
  RECEIVER_MAX_KEY_BYTES,
  RECEIVER_MAX_RATE_PER_SEC,
} from './report-bounds.js';
import { trustedHostCount } from './trusted-host-count.js';

/** Bounds a receiver enforces on every report before it touches any state. */
export interface ReportLimits {
  /** Default 256, as the protocol documents. */
  maxReporterIdBytes?: number;
  /** Default 256, as the protocol documents. */
  maxBucketKeyBytes?: number;
  /** Default 10,000. */
  maxBucketsPerReport?: number;
  /** Longest window a report may cover. Default 60,000 ms (`MAX_REPORT_WINDOW_MS`). */
  maxWindowMs?: number;
  /**
   * Fastest rate (`offered` over the window) a bucket may claim, per host the report speaks for
   * (`host_count`, at least 1). Default 1e12 per second.
   */
  maxRatePerSec?: number;
  /**
   * Relative slack for `admitted <= offered` and `wouldDrop <= admitted`: aggregators forward
   * float sums, which may round a hair over. Default 1e-6.
   */
  epsilon?: number;
}

/**
 * Throws SpillwayError ERR_SPILLWAY_INVALID_REPORT (details: `field`, and `bucket` / `index` for a
 * bucket's field) unless the report is well-formed. Receivers call it first, so a hostile report
 * changes nothing. Cost: one pass over the buckets and one Set of their keys.
 */
export function validateReport(request: ReportRequest, limits: ReportLimits = {}): void {
  const maxIdBytes = limits.maxReporterIdBytes ?? RECEIVER_MAX_KEY_BYTES;
  const maxKeyBytes = limits.maxBucketKeyBytes ?? RECEIVER_MAX_KEY_BYTES;
  const maxBuckets = limits.maxBucketsPerReport ?? RECEIVER_MAX_BUCKETS_PER_REPORT;
  const maxWindowMs = limits.maxWindowMs ?? MAX_REPORT_WINDOW_MS;
  const epsilon = limits.epsilon ?? 1e-6;
  // Per host the report speaks for: an aggregator's sum of honest hosts stays under it.
  // (`trustedHostCount`: a host's own claim of many hosts is not believed).
  const maxRatePerSec =
    (limits.maxRatePerSec ?? RECEIVER_MAX_RATE_PER_SEC) * Math.max(1, trustedHostCount(request));

  const id = request.reporterId;
  if (typeof id !== 'string' || id.length === 0) fail('reporterId', 'reporterId must be non-empty');
  if (!fitsBytes(id, maxIdBytes)) fail('reporterId', `reporterId is longer than ${maxIdBytes} bytes`);
  if (!fitsBytes(request.zone, maxKeyBytes)) fail('zone', `zone is longer than ${maxKeyBytes} bytes`);
  if (!fitsBytes(request.region, maxKeyBytes)) fail('region', `region is longer than ${maxKeyBytes} bytes`);
  // Another receiver's id, by the protocol's fixed bound (senders pass on no longer one; a
  // receiver configured for shorter reporter ids must not refuse a report over a parent's id). Its
  // window end is not checked: a sender whose clock stepped back may name one after this window,
  // and the receiver reads that as "just acknowledged", which is no reason to lose the report.
  if (!fitsBytes(request.acknowledgedBy, MAX_ACKNOWLEDGED_BY_BYTES)) {
    fail('acknowledgedBy', `acknowledgedBy is longer than ${MAX_ACKNOWLEDGED_BY_BYTES} bytes`);
  }

  const windowMs = Number(request.windowEndMs - request.windowStartMs);
  if (!(windowMs > 0)) fail('windowEndMs', `window must have a positive length, got ${windowMs} ms`);
  if (windowMs > maxWindowMs)
    fail('windowEndMs', `window of ${windowMs} ms is longer than ${maxWindowMs} ms`);

  const buckets = request.buckets;
  if (buckets.length > maxBuckets) {
    fail('buckets', `report has ${buckets.length} buckets, over the maximum ${maxBuckets}`);
  }
  const keys = new Set<string>();
  for (let index = 0; index < buckets.length; index++) {
    const usage = buckets[index]!;
    const key = usage.bucket;
    if (typeof key !== 'string' || key.length === 0)
      fail('bucket', 'bucket key must be non-empty', { index });
    if (!fitsBytes(key, maxKeyBytes)) {
      fail('bucket', `bucket key is longer than ${maxKeyBytes} bytes`, { index, bucket: key.slice(0, 64) });
    }
    if (keys.has(key)) fail('bucket', `bucket "${key}" appears twice in one report`, { index, bucket: key });
    keys.add(key);
    const { offered, admitted, wouldDrop } = usage;
    checkCount('offered', offered, index, key);
    checkCount('admitted', admitted, index, key);
    checkCount('wouldDrop', wouldDrop, index, key);
    // admitted <= offered and wouldDrop <= admitted (below) bound theirs.
    if ((offered * 1000) / windowMs > maxRatePerSec) {
      fail(
        'offered',
        `bucket "${key}": offered ${offered} in ${windowMs} ms is over ${maxRatePerSec} per second`,
        {
          index,
          bucket: key,
        },
      );
    }
    if (admitted > offered + epsilon * Math.max(1, offered)) {
      fail('admitted', `bucket "${key}": admitted ${admitted} exceeds offered ${offered}`, {
        index,
        bucket: key,
      });
    }
    if (wouldDrop > admitted + epsilon * Math.max(1, admitted)) {
      fail('wouldDrop', `bucket "${key}": wouldDrop ${wouldDrop} exceeds admitted ${admitted}`, {
        index,
        bucket: key,
      });
    }
  }
}

function checkCount(field: string, value: number, index: number, bucket: string): void {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    fail(field, `bucket "${bucket}": ${field} must be a finite number >= 0, got ${String(value)}`, {
      index,
      bucket,
    });
  }
}

/** UTF-8 length without encoding in the common case: a UTF-16 unit is 1 to 3 UTF-8 bytes. */
function fitsBytes(text: string, maxBytes: number): boolean {
  if (text.length > maxBytes) return false;
  if (text.length * 3 <= maxBytes) return true;
  return Buffer.byteLength(text, 'utf8') <= maxBytes;
}

function fail(field: string, message: string, extra?: Record<string, unknown>): never {
  throw new SpillwayError(ErrorCode.InvalidReport, message, { field, ...extra });
}
