import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { seededRandom } from '../../src/core/clock.js';
import { parseScenario } from '../../src/sim/scenario.js';
import { createSpillwayFleet } from '../../src/sim/spillway-fleet.js';
import { VirtualScheduler } from '../../src/sim/virtual-scheduler.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';

/**
 * Records, per reporter, the addresses it connected to, in the order it listed them (a host sends
 * from one address per link, `host-N>agg-...`), and which addresses are partitioned now.
 */
class RecordingNetwork extends InMemoryNetwork {
  readonly connections = new Map<string, string[]>();
  readonly down = new Set<string>();

  override connect(address: string, options: { from?: string } = {}): ControlClient {
    const reporter = (options.from ?? '').split('>')[0]!;
    this.connections.set(reporter, [...(this.connections.get(reporter) ?? []), address]);
    return super.connect(address, options);
  }

  override partition(address: string, down: boolean): void {
    if (down) this.down.add(address);
    else this.down.delete(address);
    super.partition(address, down);
  }
}

function fleetOf(zones: number, aggregatorsPerZone: number) {
  const scheduler = new VirtualScheduler();
  const random = seededRandom(1);
  const network = new RecordingNetwork({ scheduler, random });
  const scenario = parseScenario({
    name: 'spread',
    zones,
    aggregatorsPerZone,
    buckets: [{ key: 'b', limitRps: 100, offeredRps: [[0, 50]] }],
  });
  const fleet = createSpillwayFleet({
    variant: 'spillway',
    scenario,
    scheduler,
    random,
    tuning: {},
    network,
  });
  return { network, scenario, fleet };
}

describe('createSpillwayFleet', () => {
  it("spreads a zone's hosts evenly over its aggregators when hosts are assigned zones as id % zones", () => {
    const { network, scenario, fleet } = fleetOf(2, 2);
    // How runSimulation assigns zones: host id % zones.
    for (let id = 0; id < 8; id++) fleet.addHost(id, id % scenario.zones);
    fleet.stop();

    const primaries = new Map<string, number>();
    for (let id = 0; id < 8; id++) {
      const listed = network.connections.get(`host-${id}`)!;
      const zone = id % scenario.zones;
      // Every host lists both of its zone's aggregators, for failover.
      assert.deepEqual([...listed].sort(), [`agg-z${zone}-0`, `agg-z${zone}-1`], `host ${id}`);
      primaries.set(listed[0]!, (primaries.get(listed[0]!) ?? 0) + 1);
    }
    // Four hosts per zone: two on each aggregator first. (Rotating by host id put all four on the
    // same one: with an even number of zones, a zone's ids share their parity.)
    assert.deepEqual(
      [...primaries].sort(),
      ['agg-z0-0', 'agg-z0-1', 'agg-z1-0', 'agg-z1-1'].map((a) => [a, 2]),
    );
  });

  it("host-links-down cuts the hosts' links to the chosen aggregators only (they stay up), also for hosts joining meanwhile", () => {
    const { network, fleet } = fleetOf(2, 2);
    for (let id = 0; id < 4; id++) fleet.addHost(id, id % 2);
    fleet.applyEvent({ atS: 1, kind: 'host-links-down', index: 0 });
    fleet.addHost(4, 0);
    assert.deepEqual([...network.down].sort(), [
      'host-0>agg-z0-0',
      'host-1>agg-z1-0',
      'host-2>agg-z0-0',
      'host-3>agg-z1-0',
      'host-4>agg-z0-0',
    ]);
    fleet.applyEvent({ atS: 2, kind: 'host-links-up' });
    assert.deepEqual([...network.down], []);
    fleet.stop();
  });
});
