import type { Clock } from '../core/clock.js';
import { createExactLimiter } from './exact-limiter.js';
import type { Scenario } from './scenario.js';
import type { AdmissionPoint, SimFleet } from './sim-fleet.js';

/**
 * The `exact` variant: every host shares one token bucket per bucket key, as with a perfect store.
 * Its burst is one traffic tick, so per tick it admits min(offered, limit) (a fraction of a request
 * carried to the next tick): no window of the run sees more than the limit give or take one request,
 * and below the limit nothing is dropped beyond arrival noise.
 */
export function createExactFleet(scenario: Scenario, clock: Clock): SimFleet {
  const limiters = scenario.buckets.map((bucket) =>
    createExactLimiter({ limitRps: bucket.limitRps, burstMs: scenario.tickMs, nowMs: clock.nowMs() }),
  );
  const points: AdmissionPoint[] = limiters.map((limiter) => ({ allow: () => limiter.allow(clock.nowMs()) }));
  return {
    addHost: () => points,
    removeHost: () => {},
    applyEvent(event) {
      if (event.kind !== 'limit') return;
      const index = scenario.buckets.findIndex((b) => b.key === event.bucket);
      limiters[index]?.setLimit(event.limitRps, clock.nowMs());
    },
    stop: () => {},
  };
}
