import type { BucketTuning, LimitsConfig } from '../../config/limits-config.js';
import { ErrorCode, SpillwayError } from '../../core/errors.js';
import { DAY_MS, dayStartOf, type HistoryStore, utcDate } from './history-store.js';

/** How one bucket's limit is derived from its history. Per-bucket `tuning` in the limits file overrides these. */
export interface TuningParameters {
  /** Added on top of the chosen daily peak: 0.3 proposes 130% of it. */
  headroom: number;
  /**
   * Which daily peak to size from, as a quantile of the window's daily peaks (1 = the highest).
   * Order statistic without interpolation: the value at index floor(q x (n - 1)) of the ascending
   * peaks, and for q < 1 never one of the two highest days (an incident that spans midnight fills
   * two days and still cannot raise a limit). The chosen value is always a peak that really happened.
   */
  quantile: number;
  floorRps: number;
  /** No upper bound when undefined. */
  ceilingRps: number | undefined;
  /** Largest change per application as a fraction of the current limit (0.2 = +-20%). */
  maxChangePerDay: number;
}

/**
 * Defaults, and why:
 * - quantile 0.95: the 3rd highest daily peak from 21 days with demand to 41: the two highest
 *   days are always ignored, so an incident of one or two days (one crossing midnight) cannot raise
 *   a limit, yet a weekly peak (3 or more of the days) is always covered. The max (1.0) would let a
 *   single bad day set the limit for a month.
 * - headroom 0.3: room for growth between tunings and for the loop's ~2 s of lag on a ramp.
 * - maxChangePerDay 0.2: a wrong proposal (a broken reporter, an attack counted as demand) moves a
 *   limit by at most 20% before an operator can see it on the dashboard; a real trend is followed
 *   at up to +20% a day (x3.8 in a week).
 */
export const DEFAULT_TUNING: Readonly<TuningParameters> = Object.freeze({
  headroom: 0.3,
  quantile: 0.95,
  floorRps: 0,
  ceilingRps: undefined,
  maxChangePerDay: 0.2,
});

/**
 * Three weeks: with fewer days a weekly peak recurs only once or twice, and the two highest days are
 * the ones the quantile ignores, so a proposal would size a weekly-peaked bucket from its quiet days.
 */
export const DEFAULT_MIN_DAYS = 21;

/** Fewest days with demand to size from: the two highest are ignored, so a third must exist. */
export const MIN_DEMAND_DAYS = 3;

/**
 * The smallest limit tuning proposes. Never 0: a limit of 0 is a deliberate block that tuning then
 * leaves alone for good, so a proposal reaching it would lock a bucket out.
 */
export const MIN_TUNED_LIMIT_RPS = 0.01;

export interface ProposeLimitsOptions {
  /** History window in whole weeks, ending at the start of the current UTC day. Default 4. */
  weeks?: number;
  /**
   * Watched for fewer days than this (from the bucket's first day in the window, quiet days
   * included): no proposal. At most the window's days. Default DEFAULT_MIN_DAYS (21), or the whole
   * window when it is shorter.
   */
  minDays?: number;
  /** Overrides DEFAULT_TUNING for buckets without their own setting. */
  defaults?: Partial<TuningParameters>;
  /** A change smaller than this fraction of the current limit is reported as unchanged. Default 0.01. */
  minChangeRatio?: number;
}

/**
 * `change`: a new limit is proposed. `unchanged`: the proposal is within `minChangeRatio` of the
 * current limit. `insufficient-history`: watched too briefly, or too few days with demand. `not-tunable`: a template rule or a
 * limit of 0 (a deliberate block), never changed by tuning.
 */
export type ProposalStatus = 'change' | 'unchanged' | 'insufficient-history' | 'not-tunable';

/** `apply`: opted in (`tuning.auto`), applied without review. `review`: shown to an operator. */
export type ProposalAction = 'apply' | 'review' | 'none';

export interface TuningClamp {
  kind: 'maxChangePerDay' | 'floor' | 'ceiling';
  /** The bound that applied. */
  boundRps: number;
  fromRps: number;
  toRps: number;
}

export interface DayPeak {
  /** UTC date, `2026-03-02`. */
  date: string;
  dayStartMs: number;
  peakOfferedRps: number;
}

export interface TuningExplanation {
  /** The window read: `[windowStartMs, windowEndMs)`, whole UTC days. */
  windowStartMs: number;
  windowEndMs: number;
  /** Every day with demand (a peak above 0) in the window, oldest first. */
  dailyPeaks: DayPeak[];
  parameters: TuningParameters;
  /** How the proposal was sized; absent when history was insufficient. */
  sizing?: TuningSizing;
}

export interface TuningSizing {
  /** The chosen day is the rank-th highest of the daily peaks (1 = the highest). */
  rank: number;
  chosen: DayPeak;
  /** Days above the chosen one, highest first: the ones the quantile ignores. */
  ignored: DayPeak[];
  /** chosen x (1 + headroom), before clamps and rounding. */
  withHeadroomRps: number;
  /** In the order applied. */
  clamps: TuningClamp[];
}

export interface TuningProposal {
  /** The rule's key (tuning works on exact-key rules) or template. */
  bucket: string;
  /** Position of the rule in the limits file's `buckets`. */
  ruleIndex: number;
  auto: boolean;
  status: ProposalStatus;
  action: ProposalAction;
  currentLimitRps: number;
  /** The proposed limit; equal to the current one when there is no proposal. */
  proposedLimitRps: number;
  /** (proposed - current) / current; 0 without a proposal. */
  changeRatio: number;
  /** One line an operator can read. */
  reason: string;
  /** Present when history was read (change, unchanged, insufficient-history). */
  explanation?: TuningExplanation;
}

/**
 * Proposes a limit for every rule in `config` from the peaks in `store` (pure apart from reading the
 * store; nothing is written). For each exact-key rule with a non-zero limit:
 *
 *   chosen   = the `quantile` of the bucket's daily peaks over the last `weeks` complete UTC days
 *   raw      = chosen x (1 + headroom)
 *   proposed = raw clamped to current x (1 +- maxChangePerDay), then to [floorRps, ceilingRps], rounded
 *
 * Buckets whose rule sets `tuning.auto: true` get action `apply`, the others `review`. Results are in
 * the limits file's order. The clamp is per application: apply at most once a day (the controller's
 * auto tuner does; a cron running `spillway tune --apply` should too).
 */
export function proposeLimits(
  store: HistoryStore,
  config: LimitsConfig,
  nowMs: number,
  options: ProposeLimitsOptions = {},
): TuningProposal[] {
  const weeks = options.weeks ?? 4;
  const minDays = options.minDays ?? Math.min(DEFAULT_MIN_DAYS, weeks * 7);
  const minChangeRatio = options.minChangeRatio ?? 0.01;
  checkOption('weeks', weeks, Number.isInteger(weeks) && weeks >= 1 && weeks <= 52, 'an integer in 1..52');
  checkOption(
    'minDays',
    minDays,
    Number.isInteger(minDays) && minDays >= 1 && minDays <= weeks * 7,
    `an integer from 1 to the window's ${weeks * 7} days`,
  );
  checkOption('minChangeRatio', minChangeRatio, minChangeRatio >= 0 && minChangeRatio < 1, 'in [0, 1)');
  checkOption('nowMs', nowMs, Number.isFinite(nowMs), 'a finite epoch ms');
  const defaults: TuningParameters = { ...DEFAULT_TUNING, ...stripUndefined(options.defaults ?? {}) };
  checkParameters(defaults);

  const windowEndMs = dayStartOf(nowMs);
  const windowStartMs = windowEndMs - weeks * 7 * DAY_MS;

  return config.buckets.map((rule, ruleIndex): TuningProposal => {
    const auto = rule.tuning?.auto === true;
    const bucket = rule.key ?? rule.template ?? '';
    const base = {
      bucket,
      ruleIndex,
      auto,
      currentLimitRps: rule.limitRps,
      proposedLimitRps: rule.limitRps,
      changeRatio: 0,
      action: 'none' as const,
    };
    if (rule.key === undefined) {
      return {
        ...base,
        status: 'not-tunable',
        reason: 'template rules are not tuned (each instance has its own load; set overrides by hand)',
      };
    }
    if (rule.limitRps === 0) {
      return {
        ...base,
        status: 'not-tunable',
        reason: 'limit 0 blocks the bucket on purpose; tuning leaves it',
      };
    }
    const parameters = parametersFor(defaults, rule.tuning);
    const stored = store.dailyPeaks(rule.key, windowStartMs, windowEndMs);
    // How long the bucket has been watched: from its first day in the window, quiet days included
    // (a weekday-only API is watched at weekends too).
    const observedDays = stored.length === 0 ? 0 : Math.round((windowEndMs - stored[0]!.dayStartMs) / DAY_MS);
    // A day without demand says nothing about what the bucket needs: sized from, an idle month would
    // walk a limit down to nothing by maxChangePerDay steps, and the traffic's return would meet it.
    const dailyPeaks: DayPeak[] = stored
      .filter((d) => Number.isFinite(d.peakOfferedRps) && d.peakOfferedRps > 0)
      .map((d) => ({
        date: utcDate(d.dayStartMs),
        dayStartMs: d.dayStartMs,
        peakOfferedRps: d.peakOfferedRps,
      }));
    const weeksText = `${weeks} week${weeks === 1 ? '' : 's'}`;
    const shortOf =
      observedDays < minDays
        ? `watched for ${observedDays} day${observedDays === 1 ? '' : 's'} of the last ${weeksText} (need ${minDays})`
        : dailyPeaks.length < MIN_DEMAND_DAYS
          ? `only ${dailyPeaks.length} day${dailyPeaks.length === 1 ? '' : 's'} with demand in the last ${weeksText} (need ${MIN_DEMAND_DAYS}: the two highest are never sized from)`
          : undefined;
    if (shortOf !== undefined) {
      return {
        ...base,
        status: 'insufficient-history',
        reason: shortOf,
        explanation: { windowStartMs, windowEndMs, dailyPeaks, parameters },
      };
    }

    const ascending = [...dailyPeaks].sort(
      (a, b) => a.peakOfferedRps - b.peakOfferedRps || a.dayStartMs - b.dayStartMs,
    );
    const index = chosenIndex(ascending.length, parameters.quantile);
    const chosen = ascending[index]!;
    const ignored = ascending.slice(index + 1).reverse();
    const withHeadroomRps = chosen.peakOfferedRps * (1 + parameters.headroom);

    const clamps: TuningClamp[] = [];
    let value = withHeadroomRps;
    const clampTo = (kind: TuningClamp['kind'], boundRps: number, below: boolean) => {
      if (below ? value > boundRps : value < boundRps) {
        clamps.push({ kind, boundRps, fromRps: value, toRps: boundRps });
        value = boundRps;
      }
    };
    const current = rule.limitRps;
    clampTo('maxChangePerDay', current * (1 + parameters.maxChangePerDay), true);
    clampTo('maxChangePerDay', Math.max(0, current * (1 - parameters.maxChangePerDay)), false);
    // Floor and ceiling are the operator's hard bounds: they win over the rate clamp.
    if (parameters.ceilingRps !== undefined) clampTo('ceiling', parameters.ceilingRps, true);
    clampTo('floor', parameters.floorRps, false);
    let proposed = roundLimit(value);
    if (parameters.ceilingRps !== undefined) proposed = Math.min(proposed, parameters.ceilingRps);
    proposed = Math.max(proposed, parameters.floorRps, MIN_TUNED_LIMIT_RPS);

    const changeRatio = (proposed - current) / current;
    const unchanged = Math.abs(changeRatio) <= minChangeRatio;
    const explanation: TuningExplanation = {
      windowStartMs,
      windowEndMs,
      dailyPeaks,
      parameters,
      sizing: { rank: ascending.length - index, chosen, ignored, withHeadroomRps, clamps },
    };
    const clampText =
      clamps.length === 0 ? '' : `, clamped by ${[...new Set(clamps.map((c) => c.kind))].join(' and ')}`;
    const reason =
      `${quantileName(parameters.quantile)} of ${ascending.length} daily peaks = ${formatRps(chosen.peakOfferedRps)} rps ` +
      `(${chosen.date}) x ${formatNumber(1 + parameters.headroom)} = ${formatRps(withHeadroomRps)}${clampText}` +
      (unchanged ? `; within ${formatNumber(minChangeRatio * 100)}% of the current limit` : '');
    return {
      ...base,
      status: unchanged ? 'unchanged' : 'change',
      action: unchanged ? 'none' : auto ? 'apply' : 'review',
      proposedLimitRps: proposed,
      changeRatio: unchanged ? 0 : changeRatio,
      reason,
      explanation,
    };
  });
}

/**
 * The day tuning sizes from, as an index into `n` ascending daily peaks: the quantile's order
 * statistic, and below q = 1 never one of the two highest days (when there are three or more).
 */
export function chosenIndex(n: number, q: number): number {
  const index = quantileIndex(n, q);
  return q < 1 && n >= 3 ? Math.min(index, n - 3) : index;
}

/** Index into `n` ascending values for quantile `q` (order statistic, no interpolation). */
export function quantileIndex(n: number, q: number): number {
  if (n <= 0) throw new RangeError('quantileIndex: no values');
  return Math.min(n - 1, Math.max(0, Math.floor(q * (n - 1) + 1e-9)));
}

/** Whole units from 100 rps up, hundredths below: readable in a file and in a diff. */
export function roundLimit(rps: number): number {
  return rps >= 100 ? Math.round(rps) : Math.round(rps * 100) / 100;
}

function parametersFor(defaults: TuningParameters, tuning: BucketTuning | undefined): TuningParameters {
  if (!tuning) return { ...defaults };
  const { auto: _auto, ...own } = tuning;
  return { ...defaults, ...stripUndefined(own) };
}

function checkParameters(p: TuningParameters): void {
  const field = (name: string) => `defaults.${name}`;
  checkOption(field('headroom'), p.headroom, p.headroom >= 0 && p.headroom <= 10, 'in [0, 10]');
  checkOption(field('quantile'), p.quantile, p.quantile > 0 && p.quantile <= 1, 'in (0, 1]');
  checkOption(
    field('floorRps'),
    p.floorRps,
    p.floorRps >= 0 && Number.isFinite(p.floorRps),
    'a finite number >= 0',
  );
  if (p.ceilingRps !== undefined)
    checkOption(
      field('ceilingRps'),
      p.ceilingRps,
      p.ceilingRps >= p.floorRps && Number.isFinite(p.ceilingRps),
      'finite and >= floorRps',
    );
  checkOption(
    field('maxChangePerDay'),
    p.maxChangePerDay,
    p.maxChangePerDay > 0 && p.maxChangePerDay <= 10,
    'in (0, 10]',
  );
}

function stripUndefined<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function checkOption(name: string, value: number, ok: boolean, expected: string): void {
  if (!ok || Number.isNaN(value)) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `proposeLimits: ${name} must be ${expected}, got ${value}`,
      {
        field: name,
      },
    );
  }
}

/** `p95`, `p99.5`, `max`. */
export function quantileName(q: number): string {
  return q === 1 ? 'max' : `p${formatNumber(q * 100)}`;
}

export function formatRps(rps: number): string {
  return formatNumber(roundLimit(rps));
}

function formatNumber(value: number): string {
  return String(Math.round(value * 1000) / 1000);
}
