import { type Random, type Scheduler, seededRandom } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { createExactFleet } from './exact-fleet.js';
import { type BucketMetrics, computeBucketMetrics } from './metrics.js';
import { changeTimesS, limitAt, parseScenario, rateAt, type Scenario } from './scenario.js';
import type { AdmissionPoint, SimFleet } from './sim-fleet.js';
import { createSpillwayFleet, type SpillwayFleetTuning } from './spillway-fleet.js';
import { AliasTable, poisson, zipfWeight } from './traffic.js';
import { type VariantName, variantNames } from './variants.js';
import { VirtualScheduler } from './virtual-scheduler.js';

export interface SimOptions {
  /** Seeds traffic and every random draw; the same seed and options give the same result. Default 1. */
  seed?: number;
  /** Override the scenario's fleet size; host join/leave counts scale with it. */
  hosts?: number;
  zones?: number;
  aggregatorsPerZone?: number;
  /** Override the simulated duration (events after it are dropped). */
  seconds?: number;
  tickMs?: number;
  /** Variants to run, in order. Default: all four. */
  variants?: readonly VariantName[];
  /** Resolution of the recorded series and of the sliding windows in the metrics. Default 100 ms. */
  sampleMs?: number;
  /** Knobs of the Spillway variants (burst guard sizing, stale policy...). */
  tuning?: SpillwayFleetTuning;
  /** Build a variant's fleet (tests inject their own). Default: exact or the real Spillway components. */
  createFleet?: (variant: VariantName, context: FleetContext) => SimFleet;
}

export interface FleetContext {
  scenario: Scenario;
  scheduler: Scheduler;
  /** For the fleet's own draws (drop decisions, jitter, loss); independent of the traffic. */
  random: Random;
  tuning: SpillwayFleetTuning;
}

export interface BucketSeriesResult {
  key: string;
  /** Limit (rps) in force per sample. */
  limitRps: number[];
  /** Requests offered per sample (identical for every variant). */
  offered: number[];
  /** Requests admitted per sample, per variant. */
  admitted: Partial<Record<VariantName, number[]>>;
}

export interface VariantSummary {
  variant: VariantName;
  /** Figures for the scenario's focus bucket. */
  focus: BucketMetrics;
  buckets: Record<string, BucketMetrics>;
  /** Over every bucket. */
  excessAdmitted: number;
  wronglyDropped: number;
}

export interface VariantCost {
  wallMs: number;
  /** CPU time of this process during the variant (user + system): the figure a loaded machine distorts least. */
  cpuMs: number;
  allowCalls: number;
  timersFired: number;
}

export interface SimResult {
  /** The scenario as run (after overrides). */
  scenario: Scenario;
  seed: number;
  sampleMs: number;
  warmupS: number;
  changeTimesS: number[];
  variants: VariantName[];
  series: BucketSeriesResult[];
  summary: VariantSummary[];
  /** Wall-clock cost per variant: the only part of a result that differs between identical runs. */
  cost: Partial<Record<VariantName, VariantCost>>;
}

const START_MS = 1_700_000_000_000;
/** Most samples over all buckets: each bucket keeps Float64Arrays of offered and admitted per variant. */
const MAX_SERIES_POINTS = 10_000_000;

/** Apply command-line style overrides to a scenario; host events scale with the fleet. */
export function applyOverrides(scenario: Scenario, options: SimOptions): Scenario {
  const hosts = options.hosts ?? scenario.hosts;
  const scale = hosts / scenario.hosts;
  const seconds = options.seconds ?? scenario.seconds;
  const events = scenario.events
    .filter((e) => e.atS < seconds)
    .map((e) =>
      e.kind === 'hosts-join' || e.kind === 'hosts-leave'
        ? { ...e, count: Math.max(1, Math.round(e.count * scale)) }
        : e,
    );
  return parseScenario(
    {
      ...scenario,
      hosts,
      zones: options.zones ?? scenario.zones,
      aggregatorsPerZone: options.aggregatorsPerZone ?? scenario.aggregatorsPerZone,
      seconds,
      tickMs: options.tickMs ?? scenario.tickMs,
      events,
    },
    scenario.name,
  );
}

/**
 * Run every variant over the same traffic in virtual time and measure it. Deterministic: the
 * result depends only on the scenario and the options (except `cost`, wall-clock figures).
 */
export async function runSimulation(baseScenario: Scenario, options: SimOptions = {}): Promise<SimResult> {
  const scenario = applyOverrides(baseScenario, options);
  const seed = options.seed ?? 1;
  const sampleMs = options.sampleMs ?? 100;
  const variants = [...(options.variants ?? variantNames)];
  if (variants.length === 0) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'at least one variant is needed', { field: 'variants' });
  }
  if (sampleMs % scenario.tickMs !== 0 || 1000 % sampleMs !== 0) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `sampleMs (${sampleMs}) must divide 1000 and be a multiple of tickMs (${scenario.tickMs})`,
      { field: 'sampleMs' },
    );
  }
  const totalMs = scenario.seconds * 1000;
  if (totalMs % sampleMs !== 0) {
    // A last, partial sample would hold traffic no figure or chart counts.
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `seconds (${scenario.seconds}) must be a whole number of samples (${sampleMs} ms)`,
      { field: 'seconds' },
    );
  }
  const samples = totalMs / sampleMs;
  if (samples * scenario.buckets.length > MAX_SERIES_POINTS) {
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      `${scenario.buckets.length} buckets x ${samples} samples is over ${MAX_SERIES_POINTS} points per series: fewer buckets, fewer seconds or a longer sampleMs`,
      { field: 'sampleMs' },
    );
  }
  const createFleet = options.createFleet ?? defaultFleet;
  const tuning = options.tuning ?? {};

  const limitSeries = scenario.buckets.map((bucket) =>
    Array.from({ length: samples }, (_, i) => limitAt(scenario, bucket.key, (i * sampleMs) / 1000)),
  );
  const series: BucketSeriesResult[] = scenario.buckets.map((bucket, b) => ({
    key: bucket.key,
    limitRps: limitSeries[b]!,
    offered: [],
    admitted: {},
  }));
  const cost: Partial<Record<VariantName, VariantCost>> = {};

  for (const variant of variants) {
    const started = performance.now();
    const cpuStarted = process.cpuUsage();
    const scheduler = new VirtualScheduler(START_MS);
    const fleet = createFleet(variant, {
      scenario,
      scheduler,
      random: seededRandom(seed ^ 0x5bd1e995),
      tuning,
    });
    const counts = await driveTraffic(scenario, seed, sampleMs, scheduler, fleet);
    fleet.stop();
    await scheduler.runUntil(START_MS + totalMs + 1);
    series.forEach((s, b) => {
      if (s.offered.length === 0) s.offered = Array.from(counts.offered[b]!);
      s.admitted[variant] = Array.from(counts.admitted[b]!);
    });
    cost[variant] = {
      wallMs: Math.round(performance.now() - started),
      cpuMs: cpuMs(process.cpuUsage(cpuStarted)),
      allowCalls: counts.allowCalls,
      timersFired: scheduler.firedTimers,
    };
  }

  const changes = changeTimesS(scenario);
  const warmupS = scenario.settleS;
  const summary = variants.map((variant): VariantSummary => {
    const buckets: Record<string, BucketMetrics> = {};
    let excessAdmitted = 0;
    let wronglyDropped = 0;
    for (const s of series) {
      const metrics = computeBucketMetrics(
        { sampleMs, offered: s.offered, admitted: s.admitted[variant]!, limitRps: s.limitRps },
        { changeTimesS: changes, settleS: scenario.settleS, warmupS },
      );
      buckets[s.key] = metrics;
      excessAdmitted += metrics.excessAdmitted;
      wronglyDropped += metrics.wronglyDropped;
    }
    return { variant, focus: buckets[scenario.focusBucket]!, buckets, excessAdmitted, wronglyDropped };
  });

  return { scenario, seed, sampleMs, warmupS, changeTimesS: changes, variants, series, summary, cost };
}

function cpuMs(usage: NodeJS.CpuUsage): number {
  return Math.round((usage.user + usage.system) / 1000);
}

function defaultFleet(variant: VariantName, context: FleetContext): SimFleet {
  if (variant === 'exact') return createExactFleet(context.scenario, context.scheduler);
  return createSpillwayFleet({ ...context, variant });
}

interface TrafficCounts {
  offered: Float64Array[];
  admitted: Float64Array[];
  allowCalls: number;
}

interface ActiveHost {
  id: number;
  points: AdmissionPoint[];
}

/**
 * The traffic loop. Every draw comes from `seededRandom(seed)` in an order that depends only on
 * the scenario, never on a decision, so every variant sees the very same requests on the very same
 * hosts. Each request is one real `allow()` call.
 */
async function driveTraffic(
  scenario: Scenario,
  seed: number,
  sampleMs: number,
  scheduler: VirtualScheduler,
  fleet: SimFleet,
): Promise<TrafficCounts> {
  const random = seededRandom(seed);
  const { tickMs, buckets } = scenario;
  const ticks = (scenario.seconds * 1000) / tickMs;
  const ticksPerSample = sampleMs / tickMs;
  const samples = ticks / ticksPerSample;
  const offered = buckets.map(() => new Float64Array(samples));
  const admitted = buckets.map(() => new Float64Array(samples));
  const carry = new Float64Array(buckets.length);
  let allowCalls = 0;

  let active: ActiveHost[] = [];
  let nextHostId = 0;
  const addHosts = (count: number) => {
    for (let i = 0; i < count; i++) {
      const id = nextHostId++;
      active.push({ id, points: fleet.addHost(id, id % scenario.zones) });
    }
  };
  addHosts(scenario.hosts);
  let table = new AliasTable(active.map((h) => zipfWeight(h.id, scenario.hostSkew)));

  let eventIndex = 0;
  for (let tick = 0; tick < ticks; tick++) {
    const tickStartMs = tick * tickMs;
    await scheduler.runUntil(START_MS + tickStartMs);

    let membershipChanged = false;
    while (eventIndex < scenario.events.length && scenario.events[eventIndex]!.atS * 1000 <= tickStartMs) {
      const event = scenario.events[eventIndex++]!;
      if (event.kind === 'hosts-join') {
        addHosts(event.count);
        membershipChanged = true;
      } else if (event.kind === 'hosts-leave') {
        // Never the whole fleet: the traffic has to land somewhere.
        const leaving = active.slice(0, Math.min(event.count, active.length - 1));
        for (const host of leaving) fleet.removeHost(host.id);
        active = active.slice(leaving.length);
        membershipChanged = true;
      } else {
        fleet.applyEvent(event);
      }
    }
    if (membershipChanged) table = new AliasTable(active.map((h) => zipfWeight(h.id, scenario.hostSkew)));

    const sample = Math.floor(tick / ticksPerSample);
    const tickStartS = tickStartMs / 1000;
    for (let b = 0; b < buckets.length; b++) {
      const expected = (rateAt(buckets[b]!.offeredRps, tickStartS) * tickMs) / 1000;
      let arrivals: number;
      if (scenario.arrivals === 'poisson') {
        arrivals = poisson(random, expected);
      } else {
        carry[b] = carry[b]! + expected;
        arrivals = Math.floor(carry[b]!);
        carry[b] = carry[b]! - arrivals;
      }
      let admittedNow = 0;
      for (let i = 0; i < arrivals; i++) {
        if (active[table.pick(random)]!.points[b]!.allow()) admittedNow++;
      }
      offered[b]![sample] = offered[b]![sample]! + arrivals;
      admitted[b]![sample] = admitted[b]![sample]! + admittedNow;
      allowCalls += arrivals;
    }
  }
  return { offered, admitted, allowCalls };
}
