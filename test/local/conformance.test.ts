import { ManualClock } from '../../src/core/clock.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';
import {
  type ConformanceLimiter,
  type ConformanceSubject,
  describeLimiterConformance,
} from '../conformance/limiter-conformance.js';

function manualClockSubject(
  name: string,
  create: (options: { limit: number; windowMs: number }, clock: ManualClock) => ConformanceLimiter,
): ConformanceSubject {
  const clock = new ManualClock();
  return {
    name,
    create: (options) => create(options, clock),
    advance: (ms) => clock.advance(ms),
    nowMs: () => clock.nowMs(),
  };
}

describeLimiterConformance(
  manualClockSubject('local keyed token bucket', ({ limit, windowMs }, clock) =>
    createKeyedTokenBucket({ capacity: limit, refillPerSec: (limit * 1000) / windowMs, clock }),
  ),
);

describeLimiterConformance(
  manualClockSubject('local keyed GCRA', ({ limit, windowMs }, clock) =>
    createKeyedGcra({ limit, periodMs: windowMs, clock }),
  ),
);

// Odd windows make every interval a repeating binary fraction: the float edges must still hold.
describeLimiterConformance({
  ...manualClockSubject('local keyed token bucket, 333 ms window', ({ limit, windowMs }, clock) =>
    createKeyedTokenBucket({ capacity: limit, refillPerSec: (limit * 1000) / windowMs, clock }),
  ),
  windowMs: 333,
});

describeLimiterConformance({
  ...manualClockSubject('local keyed GCRA, 333 ms window', ({ limit, windowMs }, clock) =>
    createKeyedGcra({ limit, periodMs: windowMs, clock }),
  ),
  windowMs: 333,
});
