import { DEFAULT_MAX_BUCKET_SERIES } from '../ops/limiter-metrics.js';
import { type FlagSpec, type FlagValues, numberFlag } from './command-line.js';

/** How many buckets get per-bucket series in /metrics (controller, aggregator, proxy, host). */
export const BUCKET_SERIES_FLAGS: Record<string, FlagSpec> = {
  'max-bucket-series': {
    type: 'string',
    valueName: 'n',
    description:
      'buckets given per-bucket series in /metrics, the most offered first (keys may come from clients); the rest are counted',
    defaultText: String(DEFAULT_MAX_BUCKET_SERIES),
  },
};

export function maxBucketSeriesFromFlags(values: FlagValues): number {
  return numberFlag(values, 'max-bucket-series', DEFAULT_MAX_BUCKET_SERIES, { min: 0, integer: true });
}
