export type { AutoTuneResult, AutoTuner, AutoTunerOptions } from './auto-tuner.js';
export { AUTO_TUNE_MARKER, createAutoTuner } from './auto-tuner.js';
export { explainProposal, formatProposals } from './format-proposals.js';
export type { DailyPeak, HistoryStore, MinutePeak } from './history-store.js';
export { DAY_MS, dayStartOf, MINUTE_MS, minuteStartOf, utcDate } from './history-store.js';
export type { LimitChange } from './limits-file-writer.js';
export { updateLimitsText, writeLimitsFile } from './limits-file-writer.js';
export { createMemoryHistoryStore } from './memory-history-store.js';
export type { PeakRecorder, PeakRecorderOptions, PeakRecorderStats, PeakSnapshot } from './peak-recorder.js';
export { createPeakRecorder } from './peak-recorder.js';
export type {
  DayPeak,
  ProposalAction,
  ProposalStatus,
  ProposeLimitsOptions,
  TuningClamp,
  TuningExplanation,
  TuningParameters,
  TuningProposal,
  TuningSizing,
} from './propose-limits.js';
export {
  chosenIndex,
  DEFAULT_MIN_DAYS,
  DEFAULT_TUNING,
  MIN_TUNED_LIMIT_RPS,
  proposeLimits,
  quantileIndex,
  roundLimit,
} from './propose-limits.js';
export type { SqliteHistoryStoreOptions } from './sqlite-history-store.js';
export { createSqliteHistoryStore } from './sqlite-history-store.js';
export type { TuningSuggestionsOptions, TuningSuggestionView } from './tuning-suggestions.js';
export { createTuningSuggestions } from './tuning-suggestions.js';
