import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { seededRandom } from '../../src/core/clock.js';
import { parseScenario } from '../../src/sim/scenario.js';
import { createSpillwayFleet } from '../../src/sim/spillway-fleet.js';
import { VirtualScheduler } from '../../src/sim/virtual-scheduler.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';

/** Records, per reporter, the addresses it connected to, in the order it listed them. */
class RecordingNetwork extends InMemoryNetwork {
  readonly connections = new Map<string, string[]>();

  override connect(address: string, options: { from?: string } = {}): ControlClient {
    const from = options.from ?? '';
    this.connections.set(from, [...(this.connections.get(from) ?? []), address]);
    return super.connect(address, options);
  }
}

describe('createSpillwayFleet', () => {
  it("spreads a zone's hosts evenly over its aggregators when hosts are assigned zones as id % zones", () => {
    const scheduler = new VirtualScheduler();
    const random = seededRandom(1);
    const network = new RecordingNetwork({ scheduler, random });
    const scenario = parseScenario({
      name: 'spread',
      zones: 2,
      aggregatorsPerZone: 2,
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
});
