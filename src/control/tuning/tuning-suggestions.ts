import type { LimitsConfig } from '../../config/limits-config.js';
import type { Clock } from '../../core/clock.js';
import { systemClock } from '../../core/clock.js';
import { assertKnownOptions, optionNames } from '../../core/validate.js';
import type { HistoryStore } from './history-store.js';
import { type ProposeLimitsOptions, proposeLimits, type TuningProposal } from './propose-limits.js';

/** One proposal as the dashboard lists it (src/dashboard/tuning-source.ts has the same shape). */
export interface TuningSuggestionView {
  /** `<bucket>@<proposedLimitRps>`: stable while the proposal stands, new when it moves. */
  id: string;
  rule: string;
  currentLimitRps: number;
  suggestedLimitRps: number;
  reason: string;
  /** Whether the bucket opted in (its change is also applied by the auto tuner). */
  auto: boolean;
  proposal: TuningProposal;
}

export interface TuningSuggestionsOptions {
  store: HistoryStore;
  /** The limits in force (the dashboard passes the file with its admin overrides applied). */
  config: () => LimitsConfig;
  clock?: Clock;
  propose?: ProposeLimitsOptions;
  /** Proposals are recomputed at most this often (they change once a day). Default 60,000. */
  cacheMs?: number;
}

/**
 * Adapts `proposeLimits` to the dashboard's TuningSource: every proposal with a change (action
 * `apply` or `review`) becomes a suggestion. After a suggestion is accepted the limit in force equals
 * the proposal, so the next computation reports it unchanged and it disappears by itself; `accepted`
 * only drops the cache so that happens at once.
 */
const TUNING_SUGGESTIONS_OPTIONS = optionNames<TuningSuggestionsOptions>({
  store: true,
  config: true,
  clock: true,
  propose: true,
  cacheMs: true,
});

export function createTuningSuggestions(options: TuningSuggestionsOptions): {
  readonly name: string;
  suggestions(): TuningSuggestionView[];
  accepted(id: string): void;
} {
  assertKnownOptions(options, TUNING_SUGGESTIONS_OPTIONS, 'createTuningSuggestions');
  const clock = options.clock ?? systemClock;
  const cacheMs = options.cacheMs ?? 60_000;
  let cached: { atMs: number; rulesKey: string; list: TuningSuggestionView[] } | undefined;
  return {
    name: 'daily peak quantile x (1 + headroom), docs/tuning.md',
    suggestions() {
      const nowMs = clock.nowMs();
      const config = options.config();
      // By value: the config getter may build a new object per call.
      const rulesKey = JSON.stringify(config.buckets);
      if (cached && cached.rulesKey === rulesKey && nowMs - cached.atMs < cacheMs) return cached.list;
      const list = proposeLimits(options.store, config, nowMs, options.propose)
        .filter((p) => p.status === 'change')
        .map((p) => ({
          id: `${p.bucket}@${p.proposedLimitRps}`,
          rule: p.bucket,
          currentLimitRps: p.currentLimitRps,
          suggestedLimitRps: p.proposedLimitRps,
          reason: p.reason,
          auto: p.auto,
          proposal: p,
        }));
      cached = { atMs: nowMs, rulesKey, list };
      return list;
    },
    accepted() {
      cached = undefined;
    },
  };
}
