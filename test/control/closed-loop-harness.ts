import { create } from '@bufbuild/protobuf';
import { createController } from '../../src/control/controller.js';
import type { RatioPolicy } from '../../src/control/ratio-policy.js';
import { ManualClock, type Random, seededRandom } from '../../src/core/clock.js';
import { Mode, ReportRequestSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';

/**
 * A small closed loop in virtual time: N simulated hosts apply the controller's drop ratio to
 * random (Poisson, optionally bursty) offered load and report every interval, each at its own
 * phase; the real controller ticks on the same ManualClock. Used by test/control/closed-loop.test.ts
 * to prove the loop converges and by bench/control.bench.ts to compare ratio policies. The fleet
 * simulator (src/sim) is the full-size version of this.
 */
export interface ClosedLoopScenario {
  name: string;
  hosts: number;
  intervals: number;
  limitRps: number;
  /** Fleet-wide offered rate during interval `t` (1-based). */
  offeredRps: (t: number) => number;
  /** Lognormal sigma of a fleet-wide per-interval load factor (traffic that is burstier than Poisson). */
  burstSigma?: number;
  /** Share of hosts (by load) that ignore directives: old clients, hosts whose directives went stale. */
  nonCompliantShare?: number;
  /** Error statistics cover intervals [measureFrom, measureTo]. */
  measureFrom: number;
  measureTo?: number;
}

export interface ClosedLoopResult {
  scenario: string;
  policy: string;
  /** Mean of (admitted / limit - 1) over measured intervals where offered > limit. */
  meanError: number;
  /** Root mean square of the same. */
  rmsError: number;
  /** Largest (admitted / limit - 1) over the measured intervals. */
  maxOvershoot: number;
  /** Per interval: fleet offered and admitted (units per interval of 1 s). */
  series: { offered: number; admitted: number }[];
}

const INTERVAL_MS = 1000;

export function runClosedLoop(scenario: ClosedLoopScenario, policy: RatioPolicy, seed = 1): ClosedLoopResult {
  const clock = new ManualClock(0);
  const random = seededRandom(seed);
  const controller = createController({
    id: 'controller',
    scheduler: clock,
    epoch: 1,
    ratioPolicy: policy,
    config: {
      version: 1,
      intervalMs: INTERVAL_MS,
      ttlMs: 4 * INTERVAL_MS,
      buckets: [{ key: 'bucket', limitRps: scenario.limitRps, mode: 'enforce', scope: 'global' }],
    },
  });

  // Skewed shares (weights 1/(i+1)^0.8, a mild Zipf) so a few hosts carry most of the load.
  const weights = Array.from({ length: scenario.hosts }, (_, i) => 1 / (i + 1) ** 0.8);
  const totalWeight = weights.reduce((a, b) => a + b, 0);
  const shares = weights.map((w) => w / totalWeight);
  // Non-compliant hosts are taken from the small end until they carry the requested share.
  const compliant = shares.map(() => true);
  let ignoredShare = 0;
  for (let i = scenario.hosts - 1; i >= 0 && ignoredShare < (scenario.nonCompliantShare ?? 0); i--) {
    compliant[i] = false;
    ignoredShare += shares[i]!;
  }

  const series = Array.from({ length: scenario.intervals + 2 }, () => ({ offered: 0, admitted: 0 }));
  const burstFactor: number[] = [1];
  for (let t = 1; t <= scenario.intervals + 1; t++) {
    const sigma = scenario.burstSigma ?? 0;
    burstFactor[t] = sigma > 0 ? Math.exp(sigma * gaussian(random) - (sigma * sigma) / 2) : 1;
  }

  for (let h = 0; h < scenario.hosts; h++) {
    const phaseMs = Math.floor(((h + 0.5) / scenario.hosts) * INTERVAL_MS);
    let dropRatio = 0;
    let sequence = 0n;
    let windowIndex = 0;
    const report = () => {
      windowIndex++;
      if (windowIndex > scenario.intervals) return;
      const rate = scenario.offeredRps(windowIndex) * burstFactor[windowIndex]! * shares[h]!;
      const offered = poisson(random, rate);
      let admitted = offered;
      if (compliant[h] && dropRatio > 0) {
        admitted = 0;
        for (let i = 0; i < offered; i++) if (random() >= dropRatio) admitted++;
      }
      series[windowIndex]!.offered += offered;
      series[windowIndex]!.admitted += admitted;
      const endMs = Math.round(clock.nowMs());
      const response = controller.handleReport(
        create(ReportRequestSchema, {
          reporterId: `host-${h}`,
          tier: Tier.HOST,
          zone: 'z1',
          sequence: ++sequence,
          windowStartMs: BigInt(endMs - INTERVAL_MS),
          windowEndMs: BigInt(endMs),
          buckets: [{ bucket: 'bucket', offered, admitted, wouldDrop: 0 }],
          hostCount: 1,
        }),
        { peer: 'sim' },
      );
      if (response instanceof Promise) throw new Error('controller replies synchronously');
      const directive = response.directives[0];
      if (directive && directive.mode === Mode.ENFORCE) dropRatio = directive.dropRatio;
      clock.setTimeout(report, INTERVAL_MS);
    };
    clock.setTimeout(report, phaseMs + INTERVAL_MS);
  }
  controller.start();
  clock.advance((scenario.intervals + 2) * INTERVAL_MS);
  controller.stop();

  const to = Math.min(scenario.measureTo ?? scenario.intervals, scenario.intervals);
  let sum = 0;
  let sumSquares = 0;
  let maxOvershoot = Number.NEGATIVE_INFINITY;
  let count = 0;
  for (let t = scenario.measureFrom; t <= to; t++) {
    if (scenario.offeredRps(t) <= scenario.limitRps) continue;
    const error = series[t]!.admitted / scenario.limitRps - 1;
    sum += error;
    sumSquares += error * error;
    maxOvershoot = Math.max(maxOvershoot, error);
    count++;
  }
  return {
    scenario: scenario.name,
    policy: JSON.stringify(policy.spec),
    meanError: count ? sum / count : 0,
    rmsError: count ? Math.sqrt(sumSquares / count) : 0,
    maxOvershoot: count ? maxOvershoot : 0,
    series: series.slice(1, scenario.intervals + 1),
  };
}

/** Poisson sample: Knuth's product method for small means, a rounded normal above 200. */
function poisson(random: Random, mean: number): number {
  if (mean <= 0) return 0;
  if (mean > 200) return Math.max(0, Math.round(mean + Math.sqrt(mean) * gaussian(random)));
  const limit = Math.exp(-mean);
  let k = 0;
  let p = random();
  while (p > limit) {
    k++;
    p *= random();
  }
  return k;
}

function gaussian(random: Random): number {
  const u = 1 - random();
  const v = random();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

/** The scenarios the ratio policy was chosen on (docs/control-plane.md). Limit 1000 rps, 20 hosts. */
export function standardScenarios(intervals = 150): ClosedLoopScenario[] {
  const limitRps = 1000;
  return [
    {
      name: 'steady 1.5x, Poisson',
      hosts: 20,
      intervals,
      limitRps,
      offeredRps: () => 1500,
      measureFrom: 20,
    },
    {
      name: 'steady 1.5x, bursty (fleet-wide sigma 0.15 per interval)',
      hosts: 20,
      intervals,
      limitRps,
      offeredRps: () => 1500,
      burstSigma: 0.15,
      measureFrom: 20,
    },
    {
      name: 'steady 1.5x, 10% of load on hosts ignoring directives',
      hosts: 20,
      intervals,
      limitRps,
      offeredRps: () => 1500,
      nonCompliantShare: 0.1,
      measureFrom: 20,
    },
    {
      name: 'ramp 1.0x to 2.0x over 40 intervals',
      hosts: 20,
      intervals: 80,
      limitRps,
      offeredRps: (t) => (t <= 10 ? 1000 : t <= 50 ? 1000 + (1000 * (t - 10)) / 40 : 2000),
      measureFrom: 11,
      measureTo: 50,
    },
    {
      name: 'step 0.5x to 1.5x at interval 30 (first 10 intervals after)',
      hosts: 20,
      intervals: 60,
      limitRps,
      offeredRps: (t) => (t < 30 ? 500 : 1500),
      measureFrom: 30,
      measureTo: 39,
    },
  ];
}
