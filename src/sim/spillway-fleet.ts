import type { LimitsConfig, RatioPolicySpec } from '../config/index.js';
import type { Random, Scheduler } from '../core/clock.js';
import type { Scenario } from './scenario.js';
import type { AdmissionPoint, SimFleet } from './sim-fleet.js';
import type { VariantName } from './variants.js';

/** Knobs of the Spillway variants; absent fields take the components' own defaults. */
export interface SpillwayFleetTuning {
  /** Ratio policy of the `spillway` and `guard` variants (default: the controller's default). */
  ratioPolicy?: RatioPolicySpec;
  /** Burst guard of the `guard` variant (default: the data plane's defaults). */
  burstGuard?: { slackRatio?: number; burstWindowMs?: number };
  /** Report jitter of hosts, as a fraction of the interval. Default 0.1. */
  jitterRatio?: number;
}

export interface SpillwayFleetOptions {
  variant: VariantName;
  scenario: Scenario;
  scheduler: Scheduler;
  random: Random;
  tuning: SpillwayFleetTuning;
}

export function createSpillwayFleet(_options: SpillwayFleetOptions): SimFleet {
  throw new Error('the Spillway components are not integrated yet');
}

export type { AdmissionPoint, LimitsConfig };
