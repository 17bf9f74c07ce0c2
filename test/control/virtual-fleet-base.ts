import type { LimitsConfig } from '../../src/config/limits-config.js';
import { ManualClock } from '../../src/core/clock.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';

/**
 * What the virtual-time fleet tests start from: a manual clock, an in-memory network with 2 ms of
 * delay, and limits with one enforced global bucket, `pay`, at `limitRps` (directives live 4
 * intervals). Each test wires its own controller(s), aggregators and hosts on top.
 */
export function virtualFleetBase(intervalMs: number, limitRps: number) {
  const clock = new ManualClock(1_700_000_000_000);
  const network = new InMemoryNetwork({ scheduler: clock, delayMs: 2 });
  const config: LimitsConfig = {
    version: 1,
    intervalMs,
    ttlMs: 4 * intervalMs,
    buckets: [{ key: 'pay', limitRps, mode: 'enforce', scope: 'global' }],
  };
  return { clock, network, config };
}
