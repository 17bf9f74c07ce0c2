import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Aggregator, createAggregator } from '../../src/control/aggregator.js';
import { type Controller, createController } from '../../src/control/controller.js';
import { seededRandom } from '../../src/core/clock.js';
import type { ControlServer } from '../../src/transport/control-transport.js';
import { startLoadedHosts } from './loaded-hosts.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * A controller restarted under a real fleet in virtual time: GlobalLimiter hosts -> zone
 * aggregators -> controller over the in-memory network (protobuf bytes, 2 ms each way). The loop
 * must come back on the new epoch within about an interval: the aggregators forward as soon as
 * the controller listens again, the controller answers that first forward with a ratio, and each
 * host takes it at its next report (docs/reliability.md, "Controller restart: where the time goes").
 */
const INTERVAL_MS = 1000;
const LIMIT_RPS = 300;
const STEP_MS = 10;

interface HostSpec {
  zone: string;
  rps: number;
}

function buildFleet(hosts: readonly HostSpec[]) {
  const { clock, network, config } = virtualFleetBase(INTERVAL_MS, LIMIT_RPS);
  let controller: Controller;
  let server: ControlServer | undefined;
  const startController = (id: string) => {
    controller = createController({ id, config, scheduler: clock });
    server = network.listen('controller', controller.handleReport);
    controller.start();
    return controller;
  };
  startController('ctl-1');
  const aggregators = new Map<string, Aggregator>();
  for (const zone of new Set(hosts.map((h) => h.zone))) {
    const aggregator = createAggregator({
      id: `agg-${zone}`,
      zone,
      // Its own name upward, so a test can cut the aggregator off from the controller alone.
      parents: [network.connect('controller', { from: `agg-${zone}-uplink` })],
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(zone.charCodeAt(0)),
    });
    network.listen(`agg-${zone}`, aggregator.handleReport);
    aggregator.start();
    aggregators.set(zone, aggregator);
  }
  const { limiters, run, buckets, impliedAdmittedRps } = startLoadedHosts(
    network,
    clock,
    hosts.map((h) => ({ zone: h.zone, aggregator: `agg-${h.zone}`, rps: h.rps })),
    { bucket: 'pay', intervalMs: INTERVAL_MS, stepMs: STEP_MS },
  );

  return {
    clock,
    network,
    aggregators,
    run,
    buckets,
    impliedAdmittedRps,
    get controller() {
      return controller;
    },
    kill() {
      controller.stop();
      void server?.close();
    },
    restart: startController,
    async stop() {
      controller.stop();
      // Stopping waits for reports in flight, which need virtual time to settle.
      const stopped = Promise.all([
        ...limiters.map((l) => l.stop()),
        ...[...aggregators.values()].map((a) => a.stop()),
      ]);
      await run(100);
      await stopped;
    },
  };
}

describe('controller restart in virtual time', () => {
  it('after a long outage, hosts apply the new epoch within 5% of the limit about an interval after it listens', async (t) => {
    const fleet = buildFleet([
      { zone: 'a', rps: 100 },
      { zone: 'a', rps: 200 },
      { zone: 'a', rps: 300 },
    ]);
    await fleet.run(6_000);
    assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
    fleet.kill();
    // TTL 4 s, hold 3 s, then the decay: the held ratio is well below the steady one by now.
    await fleet.run(9_000);
    const decayed = fleet.impliedAdmittedRps();
    assert.ok(decayed > 1.1 * LIMIT_RPS, `decayed: ${decayed.toFixed(0)} rps admitted`);

    const epoch = fleet.restart('ctl-2').epoch;
    const recoveredMs = await fleet.run(10 * INTERVAL_MS, () => {
      const buckets = fleet.buckets();
      return (
        buckets.every((b) => b.epoch === epoch) &&
        Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS
      );
    });
    assert.ok(recoveredMs !== undefined, 'recovered');
    t.diagnostic(`within 5% of the limit on the new epoch ${recoveredMs} ms after the restart`);
    // The aggregator's forward goes when the controller listens (not at its next interval), its
    // reply carries the ratio, and every host's next report (within 1.1 intervals) brings it.
    assert.ok(
      recoveredMs <= 1.2 * INTERVAL_MS,
      `within 5% on the new epoch ${recoveredMs} ms after the restart (was 2-3 intervals)`,
    );
    const forwards = fleet.aggregators.get('a')!.snapshot().counters.reconnectForwards;
    assert.equal(forwards, 1, 'one forward at once when the controller came back');
    await fleet.stop();
  });

  it('several zones: a first forward’s partial sum never loosens the ratio hosts still hold', async () => {
    // Three zones of equal load: the first zone's forward to the new controller is a third of the
    // fleet's offered rate, whose ratio (0) would let that zone admit everything.
    const fleet = buildFleet([
      { zone: 'a', rps: 200 },
      { zone: 'b', rps: 200 },
      { zone: 'c', rps: 200 },
    ]);
    await fleet.run(6_000);
    fleet.kill();
    await fleet.run(2_000); // within TTL: every host still holds the steady ratio
    const held = fleet.buckets().map((b) => b.effectiveRatio);
    assert.ok(
      held.every((r) => Math.abs(r - 0.5) < 0.05),
      `held ${held.join(', ')}`,
    );

    const epoch = fleet.restart('ctl-2').epoch;
    let lowest = Number.POSITIVE_INFINITY;
    let highestAdmitted = 0;
    const recoveredMs = await fleet.run(10 * INTERVAL_MS, () => {
      for (const b of fleet.buckets()) lowest = Math.min(lowest, b.effectiveRatio);
      highestAdmitted = Math.max(highestAdmitted, fleet.impliedAdmittedRps());
      return fleet.buckets().every((b) => b.epoch === epoch) && highestAdmitted > 0;
    });
    assert.ok(recoveredMs !== undefined, 'every host on the new epoch');
    assert.ok(lowest >= 0.45, `no host loosened past its held ratio: lowest ${lowest}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    await fleet.stop();
  });

  it('a zone cut off from the new controller: the zones back first keep the ratio they hold until it returns', async () => {
    // The first tick after the restart sums zones a and b only (c's aggregator cannot reach the new
    // controller): 400 rps against 300 is a ratio of 0.25, looser than the 0.5 every host holds
    // from the old controller. Sent, a and b would admit 150 + 150 and c, still on 0.5, 100: 400.
    const fleet = buildFleet([
      { zone: 'a', rps: 200 },
      { zone: 'b', rps: 200 },
      { zone: 'c', rps: 200 },
    ]);
    await fleet.run(6_000);
    fleet.kill();
    await fleet.run(500); // well within the TTL (4 s): held ratios stay in force throughout
    fleet.network.partition('agg-c-uplink', true);
    const epoch = fleet.restart('ctl-2').epoch;
    let lowest = Number.POSITIVE_INFINITY;
    let highestAdmitted = 0;
    const watch = () => {
      for (const b of fleet.buckets()) lowest = Math.min(lowest, b.effectiveRatio);
      highestAdmitted = Math.max(highestAdmitted, fleet.impliedAdmittedRps());
    };
    await fleet.run(2_000, () => {
      watch();
      return false;
    });
    assert.ok(fleet.controller.snapshot().counters.reports > 0, 'zones a and b reached the new controller');
    fleet.network.partition('agg-c-uplink', false);
    const recoveredMs = await fleet.run(10 * INTERVAL_MS, () => {
      watch();
      return fleet.buckets().every((b) => b.epoch === epoch && Math.abs(b.effectiveRatio - 0.5) < 0.05);
    });
    assert.ok(recoveredMs !== undefined, 'every host on the new epoch at the steady ratio');
    assert.ok(lowest >= 0.45, `no host loosened past its held ratio: lowest ${lowest}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    await fleet.stop();
  });
});
