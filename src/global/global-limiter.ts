import { Buffer } from 'node:buffer';
import type { Random, Scheduler } from '../core/clock.js';
import { systemScheduler } from '../core/clock.js';
import type { Decision, SyncLimiter } from '../core/decision.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, describeValue, optionNames } from '../core/validate.js';
import { coarseClock } from '../local/coarse-clock.js';
import { SENDER_MAX_BUCKETS_PER_REPORT } from '../protocol/report-bounds.js';
import type { ControlClient } from '../transport/control-transport.js';
import type { Bucket, BucketContext, BucketHandle, BucketMode } from './bucket-handle.js';
import { BucketTable } from './bucket-table.js';
import { type BurstGuardOptions, resolveBurstGuard } from './burst-guard.js';
import { type GlobalLimiterLogger, Reporter, type ReporterStats } from './reporter.js';
import {
  DEFAULT_STALE_DECAY_MS,
  DEFAULT_STALE_HOLD_INTERVALS,
  type StalePolicy,
  validateStalePolicy,
} from './stale-policy.js';

export interface GlobalLimiterOptions {
  /** Stable identity of this host in reports (host name and pid, pod name...). At most 256 bytes. */
  reporterId: string;
  zone?: string;
  region?: string;
  /** Aggregators of this zone, in failover order. Empty: decide locally with ratio 0, report nothing. */
  clients: ControlClient[];
  /** Report period. Default 1000; replaced by a reply's `report_interval_ms` when present. */
  intervalMs?: number;
  /** Each interval is `intervalMs * (1 ± jitterRatio)`, so a fleet does not report in lockstep. Default 0.1. */
  jitterRatio?: number;
  /** Per-report timeout. Default: half the current interval. */
  reportTimeoutMs?: number;
  scheduler?: Scheduler;
  random?: Random;
  /** Default `{ holdMs: 3 * intervalMs, decayMs: 10_000 }`: hold, then decay linearly to 0. */
  stalePolicy?: StalePolicy;
  /** Buckets held at once. Default 10_000. */
  maxBuckets?: number;
  /** Longest bucket key, in UTF-8 bytes. Default 256 (the protocol's bound). */
  maxKeyLength?: number;
  /** Host-local spike cap sized from the last directive. Default false (off). */
  burstGuard?: BurstGuardOptions | false;
  /**
   * Between directives, scale a fresh directive's drop ratio by how this host's own offered rate
   * moved since the window the directive covers, when the move is beyond Poisson noise
   * (src/global/local-rescale.ts): a fleet-wide spike is cut at each host's next report tick
   * instead of two to three intervals later. Default true (chosen in docs/accuracy.md).
   */
  localRescale?: boolean;
  /** Mode of a bucket before its first directive (ratio 0 either way). Default 'enforce'. */
  defaultMode?: BucketMode;
  logger?: GlobalLimiterLogger;
  /** Buckets per report; the rest go in the next one (oldest counts first). Default 5_000. */
  maxBucketsPerReport?: number;
  /** How far back a report's window may reach after failed reports. Default 5 intervals. */
  carryOverMaxMs?: number;
  /** A bucket resolved by key, idle this long (no traffic, nothing pending, no fresh directive), is dropped. Default 60_000. */
  idleExpiryMs?: number;
  /**
   * Called at each report tick just before the window's counts are taken, with the scheduler's
   * time: where usage decided elsewhere is `record`ed at the rate it was measured, so each report
   * window holds its share of it (src/envoy/ records Envoy's RLQS usage here).
   */
  onWindowClose?: (nowMs: number) => void;
  /** How many data-plane hosts this limiter's reports speak for (default 1): more when it records others' usage. */
  hostCount?: () => number;
}

export interface BucketSnapshot {
  key: string;
  /** Cumulative units since the bucket was created. */
  offered: number;
  admitted: number;
  /** Dropped by the ratio (enforce mode). */
  dropped: number;
  droppedByGuard: number;
  /** Shadow would-drops (admitted). */
  wouldDrop: number;
  /** The held directive's ratio. */
  dropRatio: number;
  /** The ratio applied now, after the stale policy. */
  effectiveRatio: number;
  mode: BucketMode;
  /** 0 before any directive. */
  limitRps: number;
  /** The fleet-wide offered rate in the held directive. */
  globalOfferedRps: number;
  /** This host's offered rate in the last reported window. */
  hostOfferedRps: number;
  /** Milliseconds since the held directive arrived; undefined before any. */
  directiveAgeMs: number | undefined;
  /** The held directive's TTL has passed (the stale policy applies). */
  stale: boolean;
  epoch: number;
  version: number;
  guardArmed: boolean;
  /** The burst guard's detector has tripped: the guard's token bucket decides calls. */
  guardTripped: boolean;
  /** What the held directive lets this host admit, which the tripped guard holds it to (0: unsized). */
  guardAllowanceRps: number;
  /** Depth of the tripped guard's token bucket. */
  guardCapacity: number;
  /** Its tokens (negative: still paying back what the host admitted over its allowance before the trip). */
  guardTokens: number;
  pinned: boolean;
}

export interface GlobalLimiterSnapshot {
  takenAtMs: number;
  buckets: BucketSnapshot[];
  bucketCount: number;
  maxBuckets: number;
  /** Units decided by the overflow handle (new keys while the table was full), cumulative. */
  overflowOffered: number;
  /** Buckets expired for idleness, cumulative. */
  bucketsExpired: number;
  reporter: ReporterStats;
}

export interface GlobalLimiter extends SyncLimiter {
  /** Resolve a bucket once and keep the handle: its `allow()` is the fastest decision. Validates the key. */
  bucket(key: string): BucketHandle;
  /** One map lookup and the handle's `allow`. */
  allow(key: string, cost?: number): boolean;
  limit(key: string, cost?: number): Decision;
  /**
   * Counts units a data plane elsewhere decided for itself (an Envoy enforcing its RLQS assignment)
   * into the bucket's window as offered and admitted, the rest of offered as dropped, without a
   * decision here. Validates the key like `allow`; a new key while the table is full goes to the
   * overflow handle.
   */
  record(key: string, offered: number, admitted: number): void;
  /** The bucket's state now (its held directive included), or undefined when the table holds no such key. Allocates. */
  peek(key: string): BucketSnapshot | undefined;
  /** Begin reporting every interval. */
  start(): void;
  /** Stop the timer; with `finalReport`, send the counts of the last window first. */
  stop(options?: { finalReport?: boolean }): Promise<void>;
  /** Send a report now; resolves once it settled (a failure is counted, never thrown). */
  flush(): Promise<void>;
  snapshot(): GlobalLimiterSnapshot;
}

export const DEFAULT_INTERVAL_MS = 1000;
export const DEFAULT_JITTER_RATIO = 0.1;
export const DEFAULT_MAX_BUCKETS = 10_000;
/** The protocol bounds bucket keys at 256 bytes. */
export const DEFAULT_GLOBAL_MAX_KEY_LENGTH = 256;
export const DEFAULT_IDLE_EXPIRY_MS = 60_000;
/** On: it cuts a spike at each host's next report tick and leaves steady state alone (docs/accuracy.md). */
export const DEFAULT_LOCAL_RESCALE = true;

class GlobalLimiterImpl implements GlobalLimiter {
  readonly #map: Map<string, Bucket>;
  readonly #table: BucketTable;
  readonly #reporter: Reporter;
  readonly #scheduler: Scheduler;

  constructor(table: BucketTable, reporter: Reporter, scheduler: Scheduler) {
    this.#table = table;
    this.#map = table.map;
    this.#reporter = reporter;
    this.#scheduler = scheduler;
  }

  bucket(key: string): BucketHandle {
    return this.#table.pin(key);
  }

  allow(key: string, cost?: number): boolean {
    const bucket = this.#map.get(key);
    return (bucket !== undefined ? bucket : this.#table.resolveForCall(key)).allow(cost);
  }

  limit(key: string, cost?: number): Decision {
    const bucket = this.#map.get(key);
    return (bucket !== undefined ? bucket : this.#table.resolveForCall(key)).decide(cost);
  }

  record(key: string, offered: number, admitted: number): void {
    const bucket = this.#map.get(key);
    (bucket !== undefined ? bucket : this.#table.resolveForCall(key)).record(offered, admitted);
  }

  peek(key: string): BucketSnapshot | undefined {
    const bucket = this.#map.get(key);
    return bucket === undefined ? undefined : snapshotBucket(bucket, this.#scheduler.nowMs());
  }

  start(): void {
    this.#reporter.start();
  }

  stop(options: { finalReport?: boolean } = {}): Promise<void> {
    return this.#reporter.stop(options.finalReport === true);
  }

  flush(): Promise<void> {
    return this.#reporter.flush();
  }

  snapshot(): GlobalLimiterSnapshot {
    const nowMs = this.#scheduler.nowMs();
    const buckets: BucketSnapshot[] = [];
    for (const bucket of this.#map.values()) buckets.push(snapshotBucket(bucket, nowMs));
    const overflow = this.#table.overflow;
    return {
      takenAtMs: nowMs,
      buckets,
      bucketCount: this.#map.size,
      maxBuckets: this.#table.maxBuckets,
      overflowOffered: overflow.totalOffered + overflow.windowOffered,
      bucketsExpired: this.#table.expired,
      reporter: this.#reporter.stats(),
    };
  }
}

function snapshotBucket(bucket: Bucket, nowMs: number): BucketSnapshot {
  return {
    key: bucket.key,
    offered: bucket.totalOffered + bucket.windowOffered,
    admitted: bucket.totalAdmitted + bucket.windowAdmitted,
    dropped: bucket.totalDropped + bucket.windowDropped,
    droppedByGuard: bucket.totalDroppedByGuard + bucket.windowDroppedByGuard,
    wouldDrop: bucket.totalWouldDrop + bucket.windowWouldDrop,
    dropRatio: bucket.directiveRatio,
    effectiveRatio: bucket.effectiveRatio,
    mode: bucket.mode,
    limitRps: bucket.limitRps,
    globalOfferedRps: bucket.globalOfferedRps,
    hostOfferedRps: bucket.recentOfferedRps,
    directiveAgeMs: bucket.hasDirective ? nowMs - bucket.receivedAtMs : undefined,
    stale: bucket.hasDirective && nowMs >= bucket.expiresAtMs,
    epoch: Number(bucket.epoch),
    version: Number(bucket.version),
    guardArmed: bucket.guarded,
    guardTripped: bucket.guarded && bucket.guard!.tripped,
    guardAllowanceRps: bucket.guard?.allowanceRps ?? 0,
    guardCapacity: bucket.guard?.capacity ?? 0,
    guardTokens: bucket.guard?.tokens ?? 0,
    pinned: bucket.pinned,
  };
}

/**
 * The data plane of the global rate limiter: decisions in process from a per-bucket drop ratio,
 * usage reported every interval, directives applied from the replies. See docs/global-data-plane.md.
 */
const GLOBAL_LIMITER_OPTIONS = optionNames<GlobalLimiterOptions>({
  reporterId: true,
  zone: true,
  region: true,
  clients: true,
  intervalMs: true,
  jitterRatio: true,
  reportTimeoutMs: true,
  scheduler: true,
  random: true,
  stalePolicy: true,
  maxBuckets: true,
  maxKeyLength: true,
  burstGuard: true,
  localRescale: true,
  defaultMode: true,
  logger: true,
  maxBucketsPerReport: true,
  carryOverMaxMs: true,
  idleExpiryMs: true,
  onWindowClose: true,
  hostCount: true,
});

export function createGlobalLimiter(options: GlobalLimiterOptions): GlobalLimiter {
  if (typeof options !== 'object' || options === null) {
    throw invalidOption('options', 'options must be an object');
  }
  assertKnownOptions(options, GLOBAL_LIMITER_OPTIONS, 'createGlobalLimiter');
  const reporterId = options.reporterId;
  if (typeof reporterId !== 'string' || reporterId.length === 0 || Buffer.byteLength(reporterId) > 256) {
    throw invalidOption('reporterId', 'reporterId must be a non-empty string of at most 256 bytes');
  }
  if (!Array.isArray(options.clients)) {
    throw invalidOption('clients', 'clients must be an array of ControlClient (may be empty)');
  }
  const intervalMs = positiveFinite('intervalMs', options.intervalMs ?? DEFAULT_INTERVAL_MS);
  const jitterRatio = options.jitterRatio ?? DEFAULT_JITTER_RATIO;
  if (typeof jitterRatio !== 'number' || !(jitterRatio >= 0 && jitterRatio < 1)) {
    throw invalidOption('jitterRatio', 'jitterRatio must be a number in [0, 1)');
  }
  const reportTimeoutMs =
    options.reportTimeoutMs === undefined
      ? undefined
      : positiveFinite('reportTimeoutMs', options.reportTimeoutMs);
  const maxBuckets = positiveInteger('maxBuckets', options.maxBuckets ?? DEFAULT_MAX_BUCKETS);
  const maxKeyLength = positiveInteger('maxKeyLength', options.maxKeyLength ?? DEFAULT_GLOBAL_MAX_KEY_LENGTH);
  const maxBucketsPerReport = positiveInteger(
    'maxBucketsPerReport',
    options.maxBucketsPerReport ?? SENDER_MAX_BUCKETS_PER_REPORT,
  );
  const carryOverMaxMs =
    options.carryOverMaxMs === undefined
      ? undefined
      : positiveFinite('carryOverMaxMs', options.carryOverMaxMs);
  const idleExpiryMs = positiveFinite('idleExpiryMs', options.idleExpiryMs ?? DEFAULT_IDLE_EXPIRY_MS);
  for (const field of ['onWindowClose', 'hostCount'] as const) {
    if (options[field] !== undefined && typeof options[field] !== 'function')
      throw invalidOption(field, `${field} must be a function`);
  }
  const defaultMode = options.defaultMode ?? 'enforce';
  if (defaultMode !== 'enforce' && defaultMode !== 'shadow') {
    throw invalidOption('defaultMode', "defaultMode must be 'enforce' or 'shadow'");
  }
  if (options.localRescale !== undefined && typeof options.localRescale !== 'boolean') {
    throw invalidOption('localRescale', 'localRescale must be a boolean');
  }
  for (const field of ['zone', 'region'] as const) {
    const value = options[field];
    if (value !== undefined && typeof value !== 'string')
      throw invalidOption(field, `${field} must be a string`);
  }
  const explicitPolicy =
    options.stalePolicy === undefined ? undefined : validateStalePolicy(options.stalePolicy);
  const burstGuard = resolveBurstGuard(options.burstGuard);
  const scheduler = options.scheduler ?? systemScheduler;
  const random = options.random ?? Math.random;

  let reporter: Reporter | undefined;
  let defaultPolicy = { holdMs: DEFAULT_STALE_HOLD_INTERVALS * intervalMs, decayMs: DEFAULT_STALE_DECAY_MS };
  const currentIntervalMs = (): number => reporter?.intervalMs ?? intervalMs;
  const context: BucketContext = {
    clock: scheduler,
    guardClock: options.scheduler ?? coarseClock,
    // The default hold follows the interval the control plane asks for.
    stalePolicy: () => {
      if (explicitPolicy) return explicitPolicy;
      const holdMs = DEFAULT_STALE_HOLD_INTERVALS * currentIntervalMs();
      if (defaultPolicy.holdMs !== holdMs) defaultPolicy = { holdMs, decayMs: DEFAULT_STALE_DECAY_MS };
      return defaultPolicy;
    },
    burstGuard,
    localRescale: options.localRescale ?? DEFAULT_LOCAL_RESCALE,
    intervalMs: currentIntervalMs,
    defaultShadow: defaultMode === 'shadow',
  };
  const table = new BucketTable(maxBuckets, maxKeyLength, random, context);
  reporter = new Reporter({
    reporterId,
    zone: options.zone ?? '',
    region: options.region ?? '',
    clients: [...options.clients],
    scheduler,
    random,
    table,
    intervalMs,
    jitterRatio,
    reportTimeoutMs,
    maxBucketsPerReport,
    carryOverMaxMs,
    idleExpiryMs,
    logger: options.logger,
    onWindowClose: options.onWindowClose,
    hostCount: options.hostCount,
  });
  return new GlobalLimiterImpl(table, reporter, scheduler);
}

function invalidOption(field: string, message: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidOption, message, { field });
}

function positiveFinite(field: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw invalidOption(field, `${field} must be a positive finite number, got ${describeValue(value)}`);
  }
  return value;
}

function positiveInteger(field: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw invalidOption(field, `${field} must be a positive integer, got ${describeValue(value)}`);
  }
  return value;
}
