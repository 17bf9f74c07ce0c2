export type { Cancellable, Clock, Random, Scheduler } from './clock.js';
export { ManualClock, seededRandom, systemClock, systemScheduler } from './clock.js';
export type { AsyncLimiter, Decision, DecisionReason, Limiter, StoreFault, SyncLimiter } from './decision.js';
export { ErrorCode, isSpillwayError, SpillwayError } from './errors.js';
export {
  assertCost,
  assertKey,
  assertKnownOptions,
  assertPositiveFinite,
  assertPositiveInteger,
  DEFAULT_MAX_KEY_LENGTH,
  describeValue,
  optionNames,
  suggestName,
} from './validate.js';
