import {
  DEFAULT_QUOTA_BURST_MS,
  DEFAULT_QUOTA_TOLERANCE,
  type QuotaServiceOptions,
} from '../envoy/quota-service.js';
import { type FlagSpec, type FlagValues, numberFlag, stringFlag, usageError } from './command-line.js';

/** How `spillway rls` serves RLQS (StreamRateLimitQuotas), on the same listener, with --backend global. */
export const RLQS_FLAGS: Record<string, FlagSpec> = {
  'rlqs-strategy': {
    type: 'string',
    valueName: 'token-bucket|requests-per-time-unit',
    description:
      "the strategy of an Envoy's share over its limit (Envoy implements token-bucket; requests-per-time-unit is in its API only)",
    defaultText: 'token-bucket',
  },
  'rlqs-burst-ms': {
    type: 'string',
    valueName: 'ms',
    description: "an Envoy's token bucket depth, in time at its share (at least 5 tokens)",
    defaultText: String(DEFAULT_QUOTA_BURST_MS),
  },
  'rlqs-tolerance': {
    type: 'string',
    valueName: 'fraction',
    description:
      'a new share within this fraction of the one assigned keeps the assignment (and the Envoy its tokens)',
    defaultText: String(DEFAULT_QUOTA_TOLERANCE),
  },
  'rlqs-max-streams': {
    type: 'string',
    valueName: 'n',
    description: 'RLQS streams open at once; more are refused with RESOURCE_EXHAUSTED',
    defaultText: '1000',
  },
  'rlqs-max-buckets-per-stream': {
    type: 'string',
    valueName: 'n',
    description: 'BucketIds one stream may report; past it the stream ends with RESOURCE_EXHAUSTED',
    defaultText: '1000',
  },
  'rlqs-silent-stream-ms': {
    type: 'string',
    valueName: 'ms',
    description: 'a stream without a usage report this long is ended with DEADLINE_EXCEEDED',
    defaultText: '60000',
  },
};

export type RlqsFlagOptions = Pick<
  QuotaServiceOptions,
  'style' | 'burstMs' | 'tolerance' | 'maxStreams' | 'maxBucketsPerStream' | 'silentStreamMs'
>;

export function rlqsOptionsFromFlags(values: FlagValues, backend: string): RlqsFlagOptions {
  if (backend !== 'global') {
    const stray = Object.keys(RLQS_FLAGS).find((flag) => values[flag] !== undefined);
    if (stray)
      throw usageError(`--${stray} is for --backend global (RLQS needs the global loop)`, { flag: stray });
  }
  const style = stringFlag(values, 'rlqs-strategy') ?? 'token-bucket';
  if (style !== 'token-bucket' && style !== 'requests-per-time-unit') {
    throw usageError(`--rlqs-strategy must be token-bucket or requests-per-time-unit, got '${style}'`, {
      flag: 'rlqs-strategy',
    });
  }
  return {
    style,
    burstMs: numberFlag(values, 'rlqs-burst-ms', DEFAULT_QUOTA_BURST_MS, { min: 1, max: 600_000 }),
    tolerance: numberFlag(values, 'rlqs-tolerance', DEFAULT_QUOTA_TOLERANCE, { min: 0, max: 0.5 }),
    maxStreams: numberFlag(values, 'rlqs-max-streams', 1_000, { min: 1, max: 1_000_000, integer: true }),
    maxBucketsPerStream: numberFlag(values, 'rlqs-max-buckets-per-stream', 1_000, {
      min: 1,
      max: 1_000_000,
      integer: true,
    }),
    silentStreamMs: numberFlag(values, 'rlqs-silent-stream-ms', 60_000, { min: 1_000, max: 86_400_000 }),
  };
}
