import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { BucketRule, BucketTuning, LimitsConfig } from '../../src/config/limits-config.js';
import { formatProposals } from '../../src/control/tuning/format-proposals.js';
import { DAY_MS, type HistoryStore, utcDate } from '../../src/control/tuning/history-store.js';
import { createMemoryHistoryStore } from '../../src/control/tuning/memory-history-store.js';
import {
  chosenIndex,
  MIN_TUNED_LIMIT_RPS,
  type ProposeLimitsOptions,
  proposeLimits,
  quantileIndex,
  type TuningProposal,
} from '../../src/control/tuning/propose-limits.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { dayAgo, isWeekend, NOW_MS, recordDays, TODAY_MS } from './generated-history.js';

function rule(key: string, limitRps: number, tuning?: BucketTuning): BucketRule {
  return { key, limitRps, mode: 'enforce', scope: 'global', ...(tuning ? { tuning } : {}) };
}

function config(...buckets: BucketRule[]): LimitsConfig {
  return { version: 1, intervalMs: 1000, ttlMs: 4000, buckets };
}

function proposeOne(
  store: HistoryStore,
  bucket: BucketRule,
  options?: ProposeLimitsOptions,
  nowMs = NOW_MS,
): TuningProposal {
  const [proposal] = proposeLimits(store, config(bucket), nowMs, options);
  return proposal!;
}

/** Four weeks ending yesterday (Sunday 2026-03-01): 20 weekdays at 1000 rps, 8 weekend days at 400. */
function weeklyStore(bucket = 'api'): HistoryStore {
  const store = createMemoryHistoryStore();
  recordDays(store, bucket, 28, (dayStartMs) => (isWeekend(dayStartMs) ? 400 : 1000));
  return store;
}

describe('proposeLimits: known answers on generated history', () => {
  it('weekly seasonality: p95 of 28 daily peaks is a weekday peak (1000) x 1.3 = 1300', () => {
    const p = proposeOne(weeklyStore(), rule('api', 1200, { auto: true }));
    assert.equal(p.status, 'change');
    assert.equal(p.action, 'apply');
    assert.equal(p.proposedLimitRps, 1300);
    assert.equal(p.currentLimitRps, 1200);
    assert.ok(Math.abs(p.changeRatio - 100 / 1200) < 1e-12);
    const e = p.explanation!;
    assert.equal(e.dailyPeaks.length, 28);
    assert.equal(e.dailyPeaks.filter((d) => d.peakOfferedRps === 400).length, 8);
    assert.equal(e.dailyPeaks[0]!.date, '2026-02-02');
    assert.equal(e.dailyPeaks.at(-1)!.date, '2026-03-01');
    assert.equal(e.windowStartMs, Date.UTC(2026, 1, 2));
    assert.equal(e.windowEndMs, TODAY_MS, 'today (incomplete) is not read');
    assert.equal(e.sizing!.rank, 3, 'floor(0.95 x 27) = 25: the 3rd highest of 28');
    assert.equal(e.sizing!.chosen.peakOfferedRps, 1000);
    assert.equal(e.sizing!.withHeadroomRps, 1300);
    assert.deepEqual(e.sizing!.clamps, []);
    assert.equal(p.reason, 'p95 of 28 daily peaks = 1000 rps (2026-02-25) x 1.3 = 1300');
  });

  it('weekly seasonality: the quantile decides which kind of day sizes the limit', () => {
    const store = weeklyStore();
    const wide = { maxChangePerDay: 10 };
    // 8 weekend days are the lowest 8 of 28: index floor(q x 27) < 8 picks a weekend peak.
    assert.equal(proposeOne(store, rule('api', 1000, { ...wide, quantile: 0.25 })).proposedLimitRps, 520);
    assert.equal(proposeOne(store, rule('api', 1000, { ...wide, quantile: 0.3 })).proposedLimitRps, 1300);
    assert.equal(
      proposeOne(store, rule('api', 1000, { ...wide, quantile: 1, headroom: 0 })).proposedLimitRps,
      1000,
    );
    assert.equal(proposeOne(store, rule('api', 1000, { ...wide, headroom: 0.5 })).proposedLimitRps, 1500);
  });

  it('a one-off spike (one day at 10x) does not inflate the limit, and is named as ignored', () => {
    const store = weeklyStore();
    const spikeDay = dayAgo(10);
    store.recordPeak('api', spikeDay + 15 * 60_000, 10_000);
    const p = proposeOne(store, rule('api', 1200));
    assert.equal(p.proposedLimitRps, 1300);
    assert.equal(p.action, 'review');
    const ignored = p.explanation!.sizing!.ignored;
    assert.equal(ignored[0]!.date, utcDate(spikeDay));
    assert.equal(ignored[0]!.peakOfferedRps, 10_000);
    // Even with a week of history (minDays lowered to 7), neither of the two highest days is the
    // chosen one: an incident that crosses midnight fills two days and still cannot raise a limit.
    const short = createMemoryHistoryStore();
    recordDays(short, 'api', 7, (_day, ago) => (ago === 3 || ago === 4 ? 10_000 : 1000));
    const shortProposal = proposeOne(short, rule('api', 1200), { minDays: 7 });
    assert.equal(shortProposal.proposedLimitRps, 1300);
    assert.equal(shortProposal.explanation!.sizing!.rank, 3);
    // The max (quantile 1) is exactly what would be inflated: documented trade-off.
    assert.equal(
      proposeOne(short, rule('api', 1200, { quantile: 1 }), { minDays: 7 }).proposedLimitRps,
      1440,
    );
  });

  it('the two highest days are never chosen below quantile 1; the plain order statistic otherwise', () => {
    assert.equal(chosenIndex(28, 0.95), 25, 'floor(0.95 x 27) = 25 = n - 3 already');
    assert.equal(chosenIndex(21, 0.95), 18, 'floor(0.95 x 20) = 19 would be the 2nd highest');
    assert.equal(chosenIndex(7, 0.95), 4);
    assert.equal(chosenIndex(7, 0.5), 3);
    assert.equal(chosenIndex(7, 1), 6, 'quantile 1 is the max, asked for');
    assert.equal(chosenIndex(2, 0.95), 0);
    assert.equal(chosenIndex(1, 0.95), 0);
  });

  it('quiet days count as watched, not as demand: a weekday-only API is tuned from its weekdays', () => {
    const store = createMemoryHistoryStore();
    // 20 weekdays at 1000 rps, weekends without a single request (no rows at all).
    for (let ago = 28; ago >= 1; ago--) {
      if (!isWeekend(dayAgo(ago))) recordDays(store, 'weekdays', 1, () => 1000, dayAgo(ago - 1));
    }
    const p = proposeOne(store, rule('weekdays', 1200));
    assert.equal(p.status, 'change', p.reason);
    assert.equal(p.proposedLimitRps, 1300);
    assert.equal(p.explanation!.dailyPeaks.length, 20);
    // A shorter window asks for no more days than it holds.
    const week = proposeOne(store, rule('weekdays', 1200), { weeks: 1 });
    assert.equal(week.status, 'change', week.reason);
  });

  it('days without demand do not count: an idle bucket keeps its limit', () => {
    const store = createMemoryHistoryStore();
    recordDays(store, 'idle', 28, () => 0);
    const p = proposeOne(store, rule('idle', 200, { auto: true }));
    assert.equal(p.status, 'insufficient-history');
    assert.equal(p.proposedLimitRps, 200);
    assert.equal(
      p.reason,
      'only 0 days with demand in the last 4 weeks (need 3: the two highest are never sized from)',
    );
  });

  it('never proposes a limit of 0, which would be a block tuning then leaves for good', () => {
    const store = createMemoryHistoryStore();
    recordDays(store, 'tiny', 28, () => 0.001);
    for (const maxChangePerDay of [1, 10]) {
      const p = proposeOne(store, rule('tiny', 0.02, { maxChangePerDay }));
      assert.equal(p.proposedLimitRps, MIN_TUNED_LIMIT_RPS, `maxChangePerDay ${maxChangePerDay}`);
    }
    const p = proposeOne(store, rule('tiny', 200, { maxChangePerDay: 1 }));
    assert.equal(p.proposedLimitRps, MIN_TUNED_LIMIT_RPS);
    assert.equal(p.status, 'change');
  });

  it('a growing trend: the limit follows, never faster than maxChangePerDay per daily application', () => {
    const store = createMemoryHistoryStore();
    const firstDayMs = Date.UTC(2026, 0, 1);
    const peakOn = (dayStartMs: number) => 500 * 1.05 ** ((dayStartMs - firstDayMs) / DAY_MS);
    let limitRps = 600;
    const limits: number[] = [];
    for (let day = 0; day < 60; day++) {
      const dayStartMs = firstDayMs + day * DAY_MS;
      // Yesterday's traffic is in the store by today's run.
      if (day > 0) recordDays(store, 'api', 1, peakOn, dayStartMs);
      const p = proposeOne(store, rule('api', limitRps, { auto: true }), {}, dayStartMs + 3_600_000);
      if (day < 21) {
        assert.equal(p.status, 'insufficient-history', `day ${day}`);
        continue;
      }
      if (p.action === 'apply') {
        assert.ok(
          p.proposedLimitRps <= limitRps * 1.2 + 0.5 && p.proposedLimitRps >= limitRps * 0.8 - 0.5,
          `day ${day}: ${limitRps} -> ${p.proposedLimitRps} exceeds +-20%`,
        );
        limitRps = p.proposedLimitRps;
      }
      limits.push(limitRps);
    }
    // At 5%/day growth the clamp (20%/day) is no longer binding once caught up: the last limit is
    // exactly the 3rd highest of the last 28 days (3 days before the run day) x 1.3.
    const lastRunDayMs = firstDayMs + 59 * DAY_MS;
    assert.equal(limitRps, Math.round(peakOn(lastRunDayMs - 3 * DAY_MS) * 1.3));
    for (let i = 1; i < limits.length; i++)
      assert.ok(limits[i]! >= limits[i - 1]!, 'monotone on a rising trend');
    // Far behind, the first application is clamped and says so.
    const p = proposeOne(store, rule('api', 1000), {}, lastRunDayMs + 3_600_000);
    assert.equal(p.proposedLimitRps, 1200);
    assert.deepEqual(
      p.explanation!.sizing!.clamps.map((c) => [c.kind, c.boundRps]),
      [['maxChangePerDay', 1200]],
    );
    assert.match(p.reason, /clamped by maxChangePerDay$/);
  });

  it('a falling load lowers the limit by at most maxChangePerDay', () => {
    const p = proposeOne(weeklyStore(), rule('api', 5000));
    assert.equal(p.proposedLimitRps, 4000);
    assert.ok(Math.abs(p.changeRatio + 0.2) < 1e-12);
  });

  it('floor and ceiling are hard bounds that win over the rate clamp', () => {
    const store = weeklyStore();
    const floor = proposeOne(store, rule('api', 1400, { floorRps: 1500 }));
    assert.equal(floor.proposedLimitRps, 1500);
    assert.deepEqual(
      floor.explanation!.sizing!.clamps.map((c) => [c.kind, c.fromRps, c.toRps]),
      [['floor', 1300, 1500]],
    );
    const ceiling = proposeOne(store, rule('api', 1200, { ceilingRps: 1250 }));
    assert.equal(ceiling.proposedLimitRps, 1250);
    // Raw 1300 from current 1000: the rate clamp allows 1200, the ceiling then says 1100.
    const both = proposeOne(store, rule('api', 1000, { ceilingRps: 1100 }));
    assert.equal(both.proposedLimitRps, 1100);
    assert.deepEqual(
      both.explanation!.sizing!.clamps.map((c) => c.kind),
      ['maxChangePerDay', 'ceiling'],
    );
    // Raw 1300 from current 2000: the rate clamp allows down to 1600, the floor keeps 1800.
    assert.equal(proposeOne(store, rule('api', 2000, { floorRps: 1800 })).proposedLimitRps, 1800);
    // Defaults from options apply to buckets without their own setting.
    assert.equal(
      proposeOne(store, rule('api', 1200), { defaults: { ceilingRps: 1210 } }).proposedLimitRps,
      1210,
    );
  });

  it('not enough history: no proposal, with the reason; days outside the window and today do not count', () => {
    const store = createMemoryHistoryStore();
    recordDays(store, 'api', 6, () => 1000);
    store.recordPeak('api', TODAY_MS + 60_000, 50_000); // today, incomplete
    store.recordPeak('api', dayAgo(40), 50_000); // before the 4-week window
    const p = proposeOne(store, rule('api', 700, { auto: true }));
    assert.equal(p.status, 'insufficient-history');
    assert.equal(p.action, 'none');
    assert.equal(p.proposedLimitRps, 700);
    assert.equal(p.reason, 'watched for 6 days of the last 4 weeks (need 21)');
    assert.equal(p.explanation!.dailyPeaks.length, 6);
    assert.equal(p.explanation!.sizing, undefined);
    assert.equal(proposeOne(store, rule('api', 700), { minDays: 6 }).proposedLimitRps, 840);
    const never = proposeOne(store, rule('unknown', 700));
    assert.equal(never.reason, 'watched for 0 days of the last 4 weeks (need 21)');
  });

  it('opt-in buckets are applied, the others reviewed; templates and limit 0 are never tuned', () => {
    const store = createMemoryHistoryStore();
    for (const key of ['auto', 'review', 'steady', 'blocked']) recordDays(store, key, 28, () => 1000);
    const proposals = proposeLimits(
      store,
      config(
        rule('auto', 1000, { auto: true }),
        rule('review', 1000),
        rule('steady', 1305, { auto: true }),
        rule('blocked', 0, { auto: true }),
        {
          template: 'api:caller=*',
          limitRps: 10,
          mode: 'enforce',
          scope: 'global',
          overrides: {},
          maxInstances: 10,
        },
      ),
      NOW_MS,
    );
    assert.deepEqual(
      proposals.map((p) => [p.bucket, p.status, p.action, p.proposedLimitRps]),
      [
        ['auto', 'change', 'apply', 1200],
        ['review', 'change', 'review', 1200],
        ['steady', 'unchanged', 'none', 1300],
        ['blocked', 'not-tunable', 'none', 0],
        ['api:caller=*', 'not-tunable', 'none', 10],
      ],
    );
    assert.match(proposals[2]!.reason, /within 1% of the current limit$/);
  });

  it('the explanation prints peaks, quantile, headroom, clamps and before/after', () => {
    const store = weeklyStore();
    store.recordPeak('api', dayAgo(10) + 60_000, 10_000);
    const text = formatProposals(proposeLimits(store, config(rule('api', 1000, { auto: true })), NOW_MS));
    const expected = [
      'bucket  current  proposed  change  action        status',
      '------  -------  --------  ------  ------------  ------',
      'api        1000      1200    +20%  apply (auto)  change',
      '',
      'api: change (tuning.auto)',
      '  history: 28 days with demand in 2026-02-02..2026-03-01 (UTC), daily peaks of offered rps',
    ];
    assert.deepEqual(text.split('\n').slice(0, 6), expected);
    assert.match(text, /^ {2}peaks: 02-02 1000, 02-03 1000, .*02-20 10000, .*02-28 400, 03-01 400$/m);
    assert.match(
      text,
      /^ {2}p95 of daily peaks: 3rd highest of 28 = 1000 rps on 2026-02-26; ignored above it: 2026-02-20 10000, 2026-02-27 1000$/m,
    );
    assert.match(text, /^ {2}x \(1 \+ headroom 0\.3\) = 1300 rps$/m);
    assert.match(text, /^ {2}clamped by maxChangePerDay 0\.2: current 1000 \+20%: 1300 -> 1200$/m);
    assert.match(text, /^ {2}limit: 1000 -> 1200 rps \(\+20%, applied automatically \(tuning\.auto\)\)$/m);
  });

  it('refuses invalid options with ERR_SPILLWAY_INVALID_OPTION', () => {
    const store = createMemoryHistoryStore();
    const bad: ProposeLimitsOptions[] = [
      { weeks: 0 },
      { weeks: 1.5 },
      { minDays: 0 },
      // More days than the window holds could never be met: every bucket would read "insufficient".
      { weeks: 1, minDays: 8 },
      { defaults: { quantile: 0 } },
      { defaults: { headroom: -1 } },
      { defaults: { maxChangePerDay: 0 } },
      { defaults: { floorRps: 10, ceilingRps: 5 } },
    ];
    for (const options of bad) {
      assert.throws(
        () => proposeLimits(store, config(rule('a', 1)), NOW_MS, options),
        (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
        JSON.stringify(options),
      );
    }
  });

  it('quantileIndex: the order statistic floor(q x (n - 1)), never the maximum for q < 1', () => {
    assert.equal(quantileIndex(28, 0.95), 25);
    assert.equal(quantileIndex(7, 0.95), 5);
    assert.equal(quantileIndex(7, 0.999), 5);
    assert.equal(quantileIndex(7, 1), 6);
    assert.equal(quantileIndex(1, 0.95), 0);
    assert.equal(quantileIndex(100, 0.99), 98);
  });
});
