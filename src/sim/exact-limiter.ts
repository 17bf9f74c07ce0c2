/**
 * The baseline the global limiter is measured against: what one perfect shared store would admit.
 * A single token bucket per bucket key (refill = the limit, burst = `burstMs` of the limit)
 * decides every request at the instant it arrives, with no report lag and no sampling, so over
 * any window it admits min(offered, limit) give or take one burst (and one request when a burst is
 * not a whole number of requests).
 */
export interface ExactLimiter {
  allow(nowMs: number): boolean;
  setLimit(limitRps: number, nowMs: number): void;
}

export function createExactLimiter(options: {
  limitRps: number;
  burstMs: number;
  nowMs: number;
}): ExactLimiter {
  let limitRps = options.limitRps;
  let capacity = (limitRps * options.burstMs) / 1000;
  let tokens = capacity;
  let refilledAtMs = options.nowMs;
  const refill = (nowMs: number) => {
    if (nowMs > refilledAtMs) {
      tokens = Math.min(ceilingOf(capacity), tokens + ((nowMs - refilledAtMs) * limitRps) / 1000);
      refilledAtMs = nowMs;
    }
  };
  return {
    allow(nowMs) {
      refill(nowMs);
      if (tokens >= 1) {
        tokens -= 1;
        return true;
      }
      return false;
    },
    setLimit(newLimitRps, nowMs) {
      refill(nowMs);
      limitRps = newLimitRps;
      capacity = (limitRps * options.burstMs) / 1000;
      tokens = Math.min(tokens, ceilingOf(capacity));
    },
  };
}

/**
 * How many tokens the bucket may hold: its burst, plus what is left of a token it could not spend.
 * Requests take whole tokens, so with a burst of 1.5 (150 rps, 10 ms ticks) a tick leaves half a
 * token; capping at the burst would throw that half away every tick and admit 100 rps, and below
 * one token (under 100 rps) nothing at all. Kept, the fraction makes up the next tick's whole
 * token, so the long-run rate is the limit; just under one more token keeps a whole burst (1000 rps
 * x 10 ms = 10) from admitting an eleventh request.
 */
function ceilingOf(capacity: number): number {
  return capacity + 1 - 1e-9;
}
