import { readFileSync } from 'node:fs';
import { z } from 'zod';
import {
  describeZodIssue,
  firstIssue,
  formatConfigPath,
  type LocatedIssue,
  parseLocatedYaml,
} from '../config/located-yaml.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';

/**
 * A fleet simulation scenario: the fleet's shape, the offered traffic per bucket over time and the
 * faults injected along the way. Presets live in presets.ts; custom scenarios are JSON or YAML
 * files with the same fields (docs/accuracy.md shows one).
 */

/** `[atS, rps]`: the offered rate is linear between points; a repeated `atS` is a step. */
export type RatePoint = [atS: number, rps: number];

export interface ScenarioBucket {
  /** Bucket key, as in the limits file. */
  key: string;
  /** The bucket's global limit (units per second). */
  limitRps: number;
  /** Total offered rate of the fleet for this bucket over time. */
  offeredRps: RatePoint[];
}

export type ScenarioEvent =
  /** Partition an aggregator (or every aggregator of a zone, or of every zone) away / back. */
  | { atS: number; kind: 'aggregator-down' | 'aggregator-up'; zone?: number; index?: number }
  /**
   * Cut / restore the hosts' links to an aggregator (selected as above) while it stays up and keeps
   * forwarding to the controller: its hosts fail over to the zone's other aggregators.
   */
  | { atS: number; kind: 'host-links-down' | 'host-links-up'; zone?: number; index?: number }
  /** The controller becomes unreachable (its state is kept until a restart). */
  | { atS: number; kind: 'controller-down' }
  /** A new controller process takes over: fresh state, a new (higher) epoch, reachable again. */
  | { atS: number; kind: 'controller-restart' }
  /** `count` hosts stop (the oldest first) and their traffic moves to the rest. */
  | { atS: number; kind: 'hosts-leave'; count: number }
  /** `count` new hosts start with no directive and take a share of the traffic. */
  | { atS: number; kind: 'hosts-join'; count: number }
  /** Change delay, jitter or loss on every link from now on. */
  | { atS: number; kind: 'network'; delayMs?: number; jitterMs?: number; lossRate?: number }
  /** An operator changes a bucket's limit (the controller's config is updated in place). */
  | { atS: number; kind: 'limit'; bucket: string; limitRps: number };

export interface NetworkConditions {
  /** One-way delay of every message (report up, reply down), before jitter. */
  delayMs: number;
  /** Uniform extra delay in [0, jitterMs) per message. */
  jitterMs: number;
  /** Probability that a message is lost (the sender sees a timeout). */
  lossRate: number;
}

export interface Scenario {
  name: string;
  description: string;
  /** Simulated duration. */
  seconds: number;
  hosts: number;
  zones: number;
  aggregatorsPerZone: number;
  /** Report interval of every tier. */
  intervalMs: number;
  /** Traffic step: each host's arrivals for a tick happen at the tick's start. */
  tickMs: number;
  /** `poisson` arrivals per tick, or `deterministic` (the rate's expected count, carried over). */
  arrivals: 'poisson' | 'deterministic';
  /** Zipf exponent of the traffic share per host (0 = every host offers the same). */
  hostSkew: number;
  buckets: ScenarioBucket[];
  /** The bucket the headline figures speak for (default: the first). */
  focusBucket: string;
  network: NetworkConditions;
  events: ScenarioEvent[];
  /** Seconds after a change (a step, an event) before the loop counts as in steady state. */
  settleS: number;
}

const ratePoint = z.tuple([z.number().finite().min(0), z.number().finite().min(0)]);
const atS = z.number().finite().min(0);

const eventSchema = z.discriminatedUnion('kind', [
  z.strictObject({
    atS,
    kind: z.enum(['aggregator-down', 'aggregator-up', 'host-links-down', 'host-links-up']),
    zone: z.number().int().min(0).optional(),
    index: z.number().int().min(0).optional(),
  }),
  z.strictObject({ atS, kind: z.literal('controller-down') }),
  z.strictObject({ atS, kind: z.literal('controller-restart') }),
  z.strictObject({ atS, kind: z.enum(['hosts-leave', 'hosts-join']), count: z.number().int().min(1) }),
  z.strictObject({
    atS,
    kind: z.literal('network'),
    delayMs: z.number().finite().min(0).optional(),
    jitterMs: z.number().finite().min(0).optional(),
    lossRate: z.number().min(0).max(1).optional(),
  }),
  z.strictObject({
    atS,
    kind: z.literal('limit'),
    bucket: z.string().min(1),
    limitRps: z.number().finite().positive(),
  }),
]);

/** Most requests a scenario may offer (bounded by its peak rates): about an hour per variant here. */
export const MAX_ARRIVALS = 2e10;

const scenarioSchema = z.strictObject({
  // The name becomes the result files' names (<name>.json, <name>.svg): no path separators.
  name: z
    .string()
    .min(1)
    .max(100)
    .regex(
      /^[A-Za-z0-9][A-Za-z0-9._-]*$/,
      'letters, digits, ".", "_" and "-", starting with a letter or digit',
    ),
  description: z.string().default(''),
  seconds: z.number().finite().positive().max(86_400).default(60),
  hosts: z.number().int().min(1).max(100_000).default(1000),
  zones: z.number().int().min(1).max(1000).default(10),
  aggregatorsPerZone: z.number().int().min(1).max(16).default(1),
  intervalMs: z.number().int().min(10).max(60_000).default(1000),
  tickMs: z.number().int().min(1).max(1000).default(10),
  arrivals: z.enum(['poisson', 'deterministic']).default('poisson'),
  hostSkew: z.number().finite().min(0).max(5).default(0),
  buckets: z
    .array(
      z.strictObject({
        key: z.string().min(1).max(256),
        limitRps: z.number().finite().positive(),
        offeredRps: z.array(ratePoint).min(1),
      }),
    )
    .min(1)
    .max(10_000),
  focusBucket: z.string().optional(),
  network: z
    .strictObject({
      delayMs: z.number().finite().min(0).default(1),
      jitterMs: z.number().finite().min(0).default(1),
      lossRate: z.number().min(0).max(1).default(0),
    })
    .default({ delayMs: 1, jitterMs: 1, lossRate: 0 }),
  events: z.array(eventSchema).default([]),
  settleS: z.number().finite().min(0).default(5),
});

/**
 * Validate an object (parsed JSON or YAML, or a preset) into a complete scenario with defaults
 * filled in. The schema is strict at every level: an unknown field is an error naming it (with a
 * suggestion), reported before any field it leaves missing. Message: `<source>: <path>: <what>`.
 */
export function parseScenario(input: unknown, source = 'scenario'): Scenario {
  const parsed = scenarioSchema.safeParse(input);
  const checked = parsed.success
    ? checkScenario(parsed.data)
    : { issue: describeZodIssue(firstIssue(parsed.error.issues), input, scenarioSchema) };
  if ('value' in checked) return checked.value;
  const { issue } = checked;
  throw new SpillwayError(
    ErrorCode.InvalidConfig,
    `${source}: ${issue.label ?? formatConfigPath(issue.path)}: ${issue.message}`,
    { source, path: formatConfigPath(issue.path) },
  );
}

/** The rules the schema cannot express, each located by its path in the scenario. */
function checkScenario(
  value: z.output<typeof scenarioSchema>,
): { value: Scenario } | { issue: LocatedIssue } {
  const at = (path: (string | number)[], message: string) => ({ issue: { path, message } });
  const keys = new Set<string>();
  for (const [index, bucket] of value.buckets.entries()) {
    if (keys.has(bucket.key)) return at(['buckets', index, 'key'], `bucket '${bucket.key}' is listed twice`);
    keys.add(bucket.key);
    for (let i = 1; i < bucket.offeredRps.length; i++) {
      if (bucket.offeredRps[i]![0] < bucket.offeredRps[i - 1]![0]) {
        return at(
          ['buckets', index, 'offeredRps', i],
          `bucket '${bucket.key}' offeredRps points must be in time order`,
        );
      }
    }
  }
  const focusBucket = value.focusBucket ?? value.buckets[0]!.key;
  if (!keys.has(focusBucket)) return at(['focusBucket'], `'${focusBucket}' is not a bucket`);
  for (const [index, event] of value.events.entries()) {
    if (event.kind === 'limit' && !keys.has(event.bucket)) {
      return at(['events', index, 'bucket'], `limit event names unknown bucket '${event.bucket}'`);
    }
  }
  // Every arrival is one real allow() call per variant: bound the run before it starts, not after hours.
  let arrivalsBound = 0;
  for (const bucket of value.buckets) {
    let peakRps = 0;
    for (const [, rps] of bucket.offeredRps) peakRps = Math.max(peakRps, rps);
    arrivalsBound += peakRps * value.seconds;
  }
  if (arrivalsBound > MAX_ARRIVALS) {
    return at(
      ['buckets'],
      `up to ${arrivalsBound.toExponential(2)} requests (each bucket's highest offeredRps x seconds), over the maximum ${MAX_ARRIVALS.toExponential(0)}: each is one allow() call per variant`,
    );
  }
  if (value.seconds * 1000 < value.tickMs || (value.seconds * 1000) % value.tickMs !== 0) {
    return at(['seconds'], `must be a whole number of ticks (${value.tickMs} ms)`);
  }
  return {
    value: {
      ...value,
      buckets: value.buckets.map((b) => ({ ...b, offeredRps: b.offeredRps.map(([t, r]) => [t, r]) })),
      events: [...value.events].sort((a, b) => a.atS - b.atS),
      focusBucket,
    },
  };
}

/**
 * Read a scenario file, YAML or JSON (JSON is YAML), through the reader every Spillway file uses:
 * errors are ERR_SPILLWAY_INVALID_CONFIG `file:line:col: <path>: <what>`.
 */
export function loadScenarioFile(path: string): Scenario {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new SpillwayError(
      ErrorCode.InvalidConfig,
      `cannot read scenario file ${path}`,
      { path },
      {
        cause: error,
      },
    );
  }
  return parseLocatedYaml(text, path, scenarioSchema, checkScenario);
}

/** The offered rate of a bucket at `tS` (after a step at `tS`, its new value). */
export function rateAt(points: readonly RatePoint[], tS: number): number {
  let last = points[0]!;
  if (tS < last[0]) return last[1];
  for (let i = 1; i < points.length; i++) {
    const point = points[i]!;
    if (tS < point[0]) {
      const spanS = point[0] - last[0];
      return spanS <= 0 ? point[1] : last[1] + ((point[1] - last[1]) * (tS - last[0])) / spanS;
    }
    last = point;
  }
  return last[1];
}

/**
 * Instants where the scenario changes abruptly: a step in any bucket's offered rate, and every
 * event. Convergence is measured from each; steady state starts `settleS` after the last one.
 */
export function changeTimesS(scenario: Scenario): number[] {
  const times = new Set<number>([0]);
  for (const bucket of scenario.buckets) {
    const points = bucket.offeredRps;
    for (let i = 1; i < points.length; i++) {
      if (points[i]![0] === points[i - 1]![0] && points[i]![1] !== points[i - 1]![1])
        times.add(points[i]![0]);
    }
  }
  for (const event of scenario.events) times.add(event.atS);
  return [...times].filter((t) => t < scenario.seconds).sort((a, b) => a - b);
}

/** The limit of a bucket at `tS`, following `limit` events. */
export function limitAt(scenario: Scenario, key: string, tS: number): number {
  let limitRps = scenario.buckets.find((b) => b.key === key)!.limitRps;
  for (const event of scenario.events) {
    if (event.atS > tS) break;
    if (event.kind === 'limit' && event.bucket === key) limitRps = event.limitRps;
  }
  return limitRps;
}
