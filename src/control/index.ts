export { decodeReportRequest, encodeReportResponse } from '../transport/report-codec.js';
export type {
  Aggregator,
  AggregatorBucketSnapshot,
  AggregatorCounters,
  AggregatorHostSnapshot,
  AggregatorOptions,
  AggregatorSnapshot,
  ChildTier,
} from './aggregator.js';
export { createAggregator } from './aggregator.js';
export type { ControlLogger } from './control-logger.js';
export { silentLogger } from './control-logger.js';
export type {
  Controller,
  ControllerBucketSnapshot,
  ControllerBucketZoneSnapshot,
  ControllerChildSnapshot,
  ControllerCounters,
  ControllerOptions,
  ControllerSnapshot,
  ControllerSnapshotOptions,
} from './controller.js';
export { createController } from './controller.js';
export { computeDropRatio } from './drop-ratio.js';
export type {
  CorrectedRatioOptions,
  CorrectedState,
  EwmaState,
  RatioInput,
  RatioPolicy,
} from './ratio-policy.js';
export {
  correctedRatioPolicy,
  createRatioPolicy,
  DEFAULT_RATIO_POLICY,
  ewmaRatioPolicy,
  plainRatioPolicy,
} from './ratio-policy.js';
export type { ReporterCap } from './reporter-cap.js';
export { clipScale, perHostCapRps, validateReporterCap } from './reporter-cap.js';
