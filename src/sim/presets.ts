import { parseScenario, type RatePoint, type Scenario, type ScenarioBucket } from './scenario.js';

/**
 * The named scenarios `spillway sim --scenario <name>` knows. Each is also a worked example of the
 * scenario file format: `spillway sim --print-scenario <name>` prints it as JSON.
 *
 * Rates are fleet totals; the fleet size only changes how they are split. One bucket, limit
 * 20,000 rps, 1,000 hosts in 10 zones, 1 s interval unless stated.
 */
const LIMIT_RPS = 20_000;

function single(offeredRps: RatePoint[], limitRps = LIMIT_RPS, key = 'api:search'): ScenarioBucket[] {
  return [{ key, limitRps, offeredRps }];
}

function diurnalPoints(lowRps: number, highRps: number, periodS: number, stepS: number): RatePoint[] {
  const points: RatePoint[] = [];
  const midRps = (lowRps + highRps) / 2;
  const amplitudeRps = (highRps - lowRps) / 2;
  for (let t = 0; t <= periodS; t += stepS) {
    points.push([t, Math.round(midRps - amplitudeRps * Math.cos((2 * Math.PI * t) / periodS))]);
  }
  return points;
}

/** 20 callers whose shares of 60,000 rps follow Zipf(1.2): the top caller offers ~4x its limit. */
function hotCallerBuckets(): ScenarioBucket[] {
  const callers = 20;
  const totalRps = 60_000;
  const weights = Array.from({ length: callers }, (_, i) => 1 / (i + 1) ** 1.2);
  const sum = weights.reduce((a, b) => a + b, 0);
  return weights.map((w, i) => ({
    key: `api:caller=c${String(i).padStart(2, '0')}`,
    limitRps: 5000,
    offeredRps: [[0, Math.round((totalRps * w) / sum)]],
  }));
}

const presetInputs: Record<string, Record<string, unknown>> = {
  'steady-1.5x': {
    description: 'Constant 30,000 rps against a 20,000 rps limit (1.5x overload).',
    buckets: single([[0, 30_000]]),
  },
  'step-3x': {
    description: '15,000 rps (0.75x); at 20 s a step to 60,000 rps (3x); at 40 s back to 15,000 rps.',
    buckets: single([
      [0, 15_000],
      [20, 15_000],
      [20, 60_000],
      [40, 60_000],
      [40, 15_000],
    ]),
  },
  'surge-15x': {
    description:
      '22,000 rps against a 25,000 rps limit; at 10 s a surge to 367,000 rps (14.7x the limit) for 10 s.',
    seconds: 30,
    buckets: single(
      [
        [0, 22_000],
        [10, 22_000],
        [10, 367_000],
        [20, 367_000],
        [20, 22_000],
      ],
      25_000,
    ),
  },
  'zipf-hosts': {
    description: 'steady-1.5x, but the traffic share of host i is proportional to 1/(i+1)^1.1 (Zipf).',
    hostSkew: 1.1,
    buckets: single([[0, 30_000]]),
  },
  'hot-caller': {
    description:
      '20 caller buckets (limit 5,000 rps each) sharing 60,000 rps by Zipf(1.2): c00 offers ~4.2x its limit, ' +
      'c01 ~1.8x, c02 ~1.1x, the rest are under their limits; hosts are Zipf(1.0) skewed too.',
    hostSkew: 1.0,
    buckets: hotCallerBuckets(),
    focusBucket: 'api:caller=c00',
  },
  diurnal: {
    description:
      'A compressed day: offered rate follows a cosine from 10,000 to 30,000 rps and back over 60 s.',
    buckets: single(diurnalPoints(10_000, 30_000, 60, 2)),
  },
  'host-churn': {
    description:
      'steady-1.5x while the fleet changes: at 15 s 200 hosts leave and 200 new ones join, at 30 s 300 ' +
      'leave, at 45 s 300 join.',
    buckets: single([[0, 30_000]]),
    events: [
      { atS: 15, kind: 'hosts-leave', count: 200 },
      { atS: 15, kind: 'hosts-join', count: 200 },
      { atS: 30, kind: 'hosts-leave', count: 300 },
      { atS: 45, kind: 'hosts-join', count: 300 },
    ],
  },
  'lb-shift': {
    description:
      '19,000 rps against a 20,000 rps limit (0.95x); at 20 s half the hosts leave and the others take ' +
      'their traffic: each host doubles, the fleet does not. What a host-local rule must not mistake for a spike.',
    buckets: single([[0, 19_000]]),
    events: [{ atS: 20, kind: 'hosts-leave', count: 500 }],
  },
  'aggregator-outage': {
    description:
      'steady-1.5x with 2 aggregators per zone; from 20 s to 40 s aggregator 0 of every zone is down and ' +
      'zone 0 has no aggregator at all.',
    aggregatorsPerZone: 2,
    buckets: single([[0, 30_000]]),
    events: [
      { atS: 20, kind: 'aggregator-down', index: 0 },
      { atS: 20, kind: 'aggregator-down', zone: 0, index: 1 },
      { atS: 40, kind: 'aggregator-up' },
    ],
  },
  'aggregator-cut': {
    description:
      'steady-1.5x with 2 aggregators per zone; from 20 s to 40 s the hosts lose their links to aggregator 0 ' +
      'of every zone, which stays up and keeps forwarding: its hosts move to aggregator 1.',
    aggregatorsPerZone: 2,
    buckets: single([[0, 30_000]]),
    events: [
      { atS: 20, kind: 'host-links-down', index: 0 },
      { atS: 40, kind: 'host-links-up' },
    ],
  },
  'controller-outage': {
    description:
      'steady-1.5x; the controller is unreachable from 20 s and a new controller (new epoch, no state) ' +
      'starts at 35 s.',
    buckets: single([[0, 30_000]]),
    events: [
      { atS: 20, kind: 'controller-down' },
      { atS: 35, kind: 'controller-restart' },
    ],
  },
  'lossy-reports': {
    description:
      '1.5x, stepping to 3x at 30 s, while every message (host to aggregator, aggregator to controller, ' +
      'and each reply) takes 50-200 ms and 10% of messages are lost.',
    network: { delayMs: 50, jitterMs: 150, lossRate: 0.1 },
    buckets: single([
      [0, 30_000],
      [30, 30_000],
      [30, 60_000],
    ]),
  },
};

/** Names of the presets, in the order the accuracy report lists them. */
export const presetNames: readonly string[] = Object.keys(presetInputs);

/** A preset by name, or undefined. */
export function presetScenario(name: string): Scenario | undefined {
  const input = presetInputs[name];
  return input ? parseScenario({ name, ...input }, `preset ${name}`) : undefined;
}
