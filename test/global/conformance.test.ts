import { ManualClock } from '../../src/core/clock.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import { type ConformanceCase, describeLimiterConformance } from '../conformance/limiter-conformance.js';

/**
 * The global limiter runs the shared suite, but it has no per-host count to conform to: it drops a
 * fraction of offered calls at random, by a ratio the controller computes from the whole fleet's
 * load. Every count case is skipped for that reason; what the global limiter guarantees instead
 * (ratio statistics, cost units, shadow, validation) is tested in test/global/*.test.ts.
 */
const COUNTS =
  'the global limiter decides by a fleet-wide drop ratio from the controller, not by an exact per-host count (see test/global/bucket-handle.test.ts)';

const skip: Record<ConformanceCase, string> = {
  'admits-up-to-limit': COUNTS,
  'decision-fields': `${COUNTS}; remaining is the fleet's unused share of the limit in the directive's window (or burst guard tokens), not a countdown`,
  cost: COUNTS,
  'cost-over-remaining': COUNTS,
  'zero-cost-peek': COUNTS,
  'keys-independent': COUNTS,
  replenishes: 'a ratio changes with the next directive, not with time passing on the host',
  'invalid-input':
    'its last step expects a rejection after `limit` calls; the same validation (cost, empty and oversized keys, nothing counted) is asserted in test/global/bucket-handle.test.ts',
};

const clock = new ManualClock();
describeLimiterConformance({
  name: 'global limiter (data plane, no control plane)',
  create: () => createGlobalLimiter({ reporterId: 'conformance', clients: [], scheduler: clock }),
  advance: (ms) => clock.advance(ms),
  nowMs: () => clock.nowMs(),
  skip,
});
