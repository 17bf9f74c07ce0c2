export { createExactFleet } from './exact-fleet.js';
export type { ExactLimiter } from './exact-limiter.js';
export { createExactLimiter } from './exact-limiter.js';
export type { BucketMetrics, BucketSeries, Convergence, MetricOptions } from './metrics.js';
export { computeBucketMetrics } from './metrics.js';
export { presetNames, presetScenario } from './presets.js';
export type {
  BucketSeriesResult,
  FleetContext,
  SimOptions,
  SimResult,
  VariantCost,
  VariantSummary,
} from './run-simulation.js';
export { applyOverrides, runSimulation } from './run-simulation.js';
export type { NetworkConditions, RatePoint, Scenario, ScenarioBucket, ScenarioEvent } from './scenario.js';
export { changeTimesS, limitAt, loadScenarioFile, parseScenario, rateAt } from './scenario.js';
export type { AdmissionPoint, SimFleet } from './sim-fleet.js';
export type { SpillwayFleetOptions, SpillwayFleetTuning } from './spillway-fleet.js';
export { createSpillwayFleet } from './spillway-fleet.js';
export { formatSummaryTable, summaryColumns, summaryRows } from './summary-table.js';
export { renderSimChart, variantColors } from './svg-chart.js';
export { AliasTable, poisson, zipfWeight } from './traffic.js';
export type { VariantName } from './variants.js';
export { isVariantName, variantLabels, variantNames } from './variants.js';
export { drainMicrotasks, VirtualScheduler } from './virtual-scheduler.js';
export type { WrittenFiles } from './write-result.js';
export { writeSimResult } from './write-result.js';
