import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Aggregator, createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { Mode, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { advance, advanceUntil, hostReport } from './report-fixtures.js';

/**
 * hosts -> zone aggregators -> region aggregator -> controller, over the in-memory network (every
 * message crosses as protobuf bytes, with a delay), all in virtual time.
 */
function buildTree() {
  const clock = new ManualClock(1_700_000_000_000);
  const network = new InMemoryNetwork({ scheduler: clock, delayMs: 5, random: seededRandom(3) });
  const controller = createController({
    id: 'controller',
    scheduler: clock,
    config: {
      version: 1,
      intervalMs: 1000,
      ttlMs: 4000,
      buckets: [
        { key: 'pay', limitRps: 300, mode: 'enforce', scope: 'global' },
        { key: 'audit', limitRps: 60, mode: 'shadow', scope: 'global' },
      ],
      ratioPolicy: { kind: 'plain' },
    },
  });
  network.listen('controller', controller.handleReport);
  const region = createAggregator({
    id: 'region-eu',
    zone: 'eu',
    childTiers: ['aggregator'],
    parents: [network.connect('controller', { from: 'region-eu' })],
    scheduler: clock,
    random: seededRandom(4),
  });
  network.listen('region-eu', region.handleReport);
  const zones: Aggregator[] = [];
  for (const zone of ['a', 'b']) {
    const aggregator = createAggregator({
      id: `zone-${zone}`,
      zone,
      parents: [network.connect('region-eu', { from: `zone-${zone}` })],
      scheduler: clock,
      random: seededRandom(zone.charCodeAt(0)),
    });
    network.listen(`zone-${zone}`, aggregator.handleReport);
    zones.push(aggregator);
  }

  // Six hosts, three per zone, each offering 100 rps of `pay` and 20 rps of `audit`.
  const hosts = Array.from({ length: 6 }, (_, i) => {
    const zone = i < 3 ? 'a' : 'b';
    const client = network.connect(`zone-${zone}`, { from: `host-${i}` });
    const state = {
      id: `host-${i}`,
      zone,
      dropRatio: 0,
      auditMode: Mode.UNSPECIFIED,
      replies: 0,
      failures: 0,
      directives: 0,
    };
    let sequence = 0;
    const report = () => {
      const offered = 100;
      const request = hostReport({
        id: state.id,
        zone,
        sequence: ++sequence,
        endMs: clock.nowMs(),
        buckets: [
          { bucket: 'pay', offered, admitted: offered * (1 - state.dropRatio) },
          { bucket: 'audit', offered: 20, admitted: 20, wouldDrop: 0 },
        ],
      });
      client.report(request, { timeoutMs: 500 }).then(
        (response) => {
          state.replies++;
          state.directives = response.directives.length;
          for (const d of response.directives) {
            if (d.bucket === 'pay') state.dropRatio = d.dropRatio;
            if (d.bucket === 'audit') state.auditMode = d.mode;
          }
        },
        () => state.failures++,
      );
      clock.setTimeout(report, 1000);
    };
    clock.setTimeout(report, 100 + i * 130);
    return state;
  });
  return { clock, network, controller, region, zones, hosts };
}

describe('multi-tier chain (zone -> region -> controller)', () => {
  it('converges: the controller sees the region as one child speaking for every host, hosts apply its ratio', async () => {
    const { clock, controller, region, zones, hosts } = buildTree();
    controller.start();
    region.start();
    for (const z of zones) z.start();
    await advanceUntil(clock, () => hosts.every((h) => Math.abs(h.dropRatio - 0.5) < 1e-6), 10_000);

    const snap = controller.snapshot();
    assert.deepEqual(
      snap.children.map((c) => [c.id, c.tier, c.zone, c.hostCount]),
      [['region-eu', Tier.AGGREGATOR, 'eu', 6]],
    );
    const pay = snap.buckets.find((b) => b.key === 'pay')!;
    assert.ok(Math.abs(pay.offeredRps - 600) < 1e-6, `offered ${pay.offeredRps}`);
    assert.deepEqual(
      region.snapshot().hosts.map((h) => [h.id, h.hostCount]),
      [
        ['zone-a', 3],
        ['zone-b', 3],
      ],
    );
    assert.ok(
      hosts.every((h) => h.auditMode === Mode.SHADOW),
      'shadow mode reaches the hosts',
    );
    const relayed = region.snapshot().buckets.find((b) => b.key === 'pay')!.directive!;
    assert.equal(relayed.epoch, controller.epoch);
    controller.stop();
    await region.stop();
    for (const z of zones) await z.stop();
  });

  it('a dead controller never fails a host report; directives age out by TTL and return when it heals', async () => {
    const { clock, network, controller, region, zones, hosts } = buildTree();
    controller.start();
    region.start();
    for (const z of zones) z.start();
    await advanceUntil(clock, () => hosts.every((h) => h.directives === 2), 10_000);

    network.partition('controller', true);
    const repliesBefore = hosts.map((h) => h.replies);
    await advance(clock, 6000, 20);
    assert.ok(
      hosts.every((h) => h.failures === 0),
      'no host report failed',
    );
    assert.ok(
      hosts.every((h, i) => h.replies >= repliesBefore[i]! + 5),
      'hosts kept getting replies',
    );
    assert.ok(
      hosts.every((h) => h.directives === 0),
      'stale directives are no longer relayed (TTL 4 s)',
    );
    assert.ok(region.snapshot().counters.forwardFailures >= 3);

    network.partition('controller', false);
    await advanceUntil(
      clock,
      () => hosts.every((h) => h.directives === 2 && Math.abs(h.dropRatio - 0.5) < 1e-6),
      10_000,
    );
    controller.stop();
    // stop() waits for a forward in flight, which needs virtual time to settle.
    const stopped = Promise.all([region.stop(), ...zones.map((z) => z.stop())]);
    await advance(clock, 100);
    await stopped;
  });
});
