import { assertKnownOptions, optionNames } from '../core/validate.js';
import type { AggregatorOptions } from './aggregator.js';
import type { ControllerOptions } from './controller.js';

/**
 * The option names `createController` and `createAggregator` know, checked before anything else
 * when one is built: a typo (`maxBucket`, `childTier`) is an error that names it rather than an
 * option silently left at its default.
 */
const CONTROLLER_OPTIONS = optionNames<ControllerOptions>({
  id: true,
  config: true,
  scheduler: true,
  epoch: true,
  random: true,
  childExpiryMs: true,
  bucketExpiryMs: true,
  maxBuckets: true,
  maxChildren: true,
  maxChildrenPerZone: true,
  maxUnknownKeys: true,
  reportLimits: true,
  logger: true,
  ratioPolicy: true,
  reporterCap: true,
});

const AGGREGATOR_OPTIONS = optionNames<AggregatorOptions>({
  id: true,
  zone: true,
  region: true,
  parents: true,
  parentMode: true,
  acceptZones: true,
  childTiers: true,
  reporterCap: true,
  intervalMs: true,
  reportTimeoutMs: true,
  scheduler: true,
  random: true,
  jitterRatio: true,
  hostGraceMs: true,
  hostExpiryMs: true,
  parentBackoffMs: true,
  maxHosts: true,
  maxHostsPerAddress: true,
  maxBuckets: true,
  maxBucketsPerForward: true,
  reportLimits: true,
  authToken: true,
  logger: true,
});

/** Throws ERR_SPILLWAY_INVALID_OPTION for an option `createController` does not know. */
export function assertControllerOptionNames(options: unknown): void {
  assertKnownOptions(options, CONTROLLER_OPTIONS, 'createController');
}

/** Throws ERR_SPILLWAY_INVALID_OPTION for an option `createAggregator` does not know. */
export function assertAggregatorOptionNames(options: unknown): void {
  assertKnownOptions(options, AGGREGATOR_OPTIONS, 'createAggregator');
}
