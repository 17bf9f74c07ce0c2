import type { LimitsConfig } from '../../config/limits-config.js';
import { seededRandom } from '../../core/clock.js';
import { DAY_MS, dayStartOf, type HistoryStore, MINUTE_MS } from './history-store.js';

/**
 * A made-up history, so `spillway tune --sample-history` shows what a proposal looks like without
 * the weeks of peaks a controller records first (docs/tuning.md). For each exact-key rule of the
 * limits file (templates are never tuned), `days` complete UTC days ending yesterday: weekdays
 * peaking around 80% of the current limit, weekends lower, a few busier days, all from a fixed seed
 * so the same file and day give the same sample. Each day gets a quiet overnight rate and an
 * afternoon ramp to its peak, so the per-minute rows look like a controller's.
 */
export const SAMPLE_DAYS = 28;

/** The buckets written and the days covered. */
export interface SampleHistory {
  buckets: string[];
  days: number;
}

export function writeSampleHistory(
  store: HistoryStore,
  config: LimitsConfig,
  nowMs: number,
  days = SAMPLE_DAYS,
): SampleHistory {
  const random = seededRandom(dayStartOf(nowMs) / DAY_MS);
  const buckets: string[] = [];
  for (const rule of config.buckets) {
    if (rule.key === undefined) continue;
    buckets.push(rule.key);
    // A limit of 0 (blocked) still gets a sample to size from.
    const baseRps = rule.limitRps > 0 ? rule.limitRps : 10;
    for (let ago = days; ago >= 1; ago--) {
      const dayStartMs = dayStartOf(nowMs) - ago * DAY_MS;
      const weekday = new Date(dayStartMs).getUTCDay();
      const weekend = weekday === 0 || weekday === 6;
      const busy = random() < 0.1 ? 1.3 : 1;
      const peakRps = baseRps * (weekend ? 0.45 : 0.8) * busy * (0.9 + 0.2 * random());
      const minutes: [number, number][] = [];
      for (let minute = 0; minute < 14 * 60; minute += 60) minutes.push([minute, peakRps * 0.2]);
      for (let step = 0; step <= 10; step++) minutes.push([14 * 60 + step * 6, (peakRps * step) / 10]);
      for (const [minute, rps] of minutes) {
        store.recordPeaks(dayStartMs + minute * MINUTE_MS, [[rule.key, Math.round(rps * 100) / 100]]);
      }
    }
  }
  return { buckets, days };
}
