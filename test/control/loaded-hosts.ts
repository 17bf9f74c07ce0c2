import type { ManualClock } from '../../src/core/clock.js';
import { seededRandom } from '../../src/core/clock.js';
import { type BucketHandle, createGlobalLimiter, type GlobalLimiter } from '../../src/global/index.js';
import type { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { settle } from '../global/fixtures.js';

export interface LoadedHostSpec {
  zone: string;
  /** The aggregator (listening name on the network) this host reports to. */
  aggregator: string;
  rps: number;
}

/**
 * GlobalLimiter hosts offering load to one bucket in virtual time, for control-plane tests that
 * watch the loop end to end: each host reports to its aggregator over the in-memory network and
 * offers its rate spread evenly over `stepMs` steps.
 */
export function startLoadedHosts(
  network: InMemoryNetwork,
  clock: ManualClock,
  hosts: readonly LoadedHostSpec[],
  { bucket, intervalMs, stepMs }: { bucket: string; intervalMs: number; stepMs: number },
) {
  const limiters: GlobalLimiter[] = [];
  const handles: BucketHandle[] = [];
  hosts.forEach((spec, i) => {
    const limiter = createGlobalLimiter({
      reporterId: `host-${i}`,
      zone: spec.zone,
      clients: [network.connect(spec.aggregator, { from: `host-${i}` })],
      intervalMs,
      scheduler: clock,
      random: seededRandom(100 + i),
    });
    limiter.start();
    limiters.push(limiter);
    handles.push(limiter.bucket(bucket));
  });
  const perStep = hosts.map((h) => (h.rps * stepMs) / 1000);
  const credit = hosts.map(() => 0);

  /** Runs `ms` of virtual time with load; stops early (returning the elapsed ms) once `each` is true. */
  async function run(ms: number, each?: () => boolean): Promise<number | undefined> {
    for (let elapsed = 0; elapsed < ms; elapsed += stepMs) {
      handles.forEach((handle, i) => {
        credit[i]! += perStep[i]!;
        for (; credit[i]! >= 1; credit[i]!--) handle.allow();
      });
      clock.advance(stepMs);
      await settle();
      if (each?.()) return elapsed + stepMs;
    }
    return undefined;
  }

  const buckets = () => limiters.map((l) => l.snapshot().buckets.find((b) => b.key === bucket)!);
  /** Σ rate × (1 − applied ratio): what the fleet admits with the ratios it applies now. */
  const impliedAdmittedRps = () =>
    buckets().reduce((sum, b, i) => sum + hosts[i]!.rps * (1 - b.effectiveRatio), 0);

  return { limiters, run, buckets, impliedAdmittedRps };
}
