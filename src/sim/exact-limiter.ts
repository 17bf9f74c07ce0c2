/**
 * The baseline the global limiter is measured against: what one perfect shared store would admit.
 * A single token bucket per bucket key (refill = the limit, burst = `burstMs` of the limit)
 * decides every request at the instant it arrives, with no report lag and no sampling, so over
 * any window it admits min(offered, limit) give or take one burst.
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
      tokens = Math.min(capacity, tokens + ((nowMs - refilledAtMs) * limitRps) / 1000);
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
      tokens = Math.min(tokens, capacity);
    },
  };
}
