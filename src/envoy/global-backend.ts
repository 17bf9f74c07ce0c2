import type { Random } from '../core/clock.js';
import type { GlobalLimiter } from '../global/global-limiter.js';
import type { DescriptorOutcome, RlsBackend, WindowLimit } from './rls-backend.js';

/**
 * Decides in process as a data-plane host of the global rate limiter: one map lookup and one draw
 * against the drop ratio the controller computed from every instance's reports. No count per
 * window exists here, so while a call is admitted `limit_remaining` is the whole
 * `requests_per_unit` (what the global limiter's decisions say everywhere: its `remaining` is the
 * limit), and 0 when it is not.
 */
export function createGlobalBackend(limiter: GlobalLimiter, random: Random = Math.random): RlsBackend {
  return {
    kind: 'global',
    check(key: string, limit: WindowLimit, hits: number): DescriptorOutcome {
      const decision = limiter.limit(key, hits);
      const overLimit = !decision.allowed || decision.reason === 'shadow';
      return { overLimit, remaining: overLimit ? 0 : limit.requestsPerUnit };
    },
    checkOverride(key: string, limit: WindowLimit, hits: number): DescriptorOutcome {
      // Counted as offered (the controller's ratio for these buckets is 0: it sums them and sends
      // the fleet-wide rate back); the request's own limit is applied to that rate here, as the
      // controller would: drop (offered - limit) / offered at random. Fail open once stale.
      limiter.allow(key, hits);
      const bucket = limiter.peek(key);
      let dropRatio = 0;
      if (bucket !== undefined && bucket.directiveAgeMs !== undefined && !bucket.stale) {
        const offeredRps = bucket.globalOfferedRps;
        if (offeredRps > limit.limitRps) dropRatio = (offeredRps - limit.limitRps) / offeredRps;
      }
      const overLimit = dropRatio > 0 && random() < dropRatio;
      return { overLimit, remaining: overLimit ? 0 : limit.requestsPerUnit };
    },
    close: () => limiter.stop({ finalReport: true }),
  };
}
