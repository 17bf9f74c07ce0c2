import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { seededRandom } from '../../src/core/clock.js';
import { startLoadedHosts } from './loaded-hosts.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * Two controller replicas created in the same millisecond (an HA pair started together; any two
 * controllers in virtual time) behind an aggregator that fans out to both. Hosts order directives
 * by (epoch, version) and never go back to a lower version within an epoch, so replicas sharing an
 * epoch are one identity to them, with two version counters that drift apart.
 */
const INTERVAL_MS = 1000;
const LIMIT_RPS = 300;

describe('controller replicas started in the same millisecond', () => {
  it('get distinct epochs, so hosts follow the survivor when the leader dies', async (t) => {
    const { clock, network, config } = virtualFleetBase(INTERVAL_MS, LIMIT_RPS);
    const replicas = ['ctl-1', 'ctl-2'].map((id, i) => {
      const controller = createController({ id, config, scheduler: clock, random: seededRandom(11 + i) });
      network.listen(id, controller.handleReport);
      controller.start();
      return controller;
    });
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: replicas.map((_, i) => network.connect(`ctl-${i + 1}`, { from: 'agg' })),
      parentMode: 'fanout',
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(7),
    });
    network.listen('agg', aggregator.handleReport);
    aggregator.start();
    const fleet = startLoadedHosts(
      network,
      clock,
      [
        { zone: 'z1', aggregator: 'agg', rps: 300 },
        { zone: 'z1', aggregator: 'agg', rps: 300 },
      ],
      { bucket: 'pay', intervalMs: INTERVAL_MS, stepMs: 10 },
    );
    // The leader is the replica with the higher epoch (with equal epochs: the higher version). The
    // other misses the forwards of a 20 s partition, so its version falls behind the leader's.
    const [leader, follower] =
      replicas[0]!.epoch >= replicas[1]!.epoch ? [replicas[0]!, replicas[1]!] : [replicas[1]!, replicas[0]!];
    network.partition(follower === replicas[0] ? 'ctl-1' : 'ctl-2', true);
    await fleet.run(20_000);
    network.partition(follower === replicas[0] ? 'ctl-1' : 'ctl-2', false);
    await fleet.run(5_000);
    const before = fleet.impliedAdmittedRps();
    const versionGap = leader.snapshot().version - follower.snapshot().version;
    // The leader dies.
    leader.stop();
    network.partition(leader === replicas[0] ? 'ctl-1' : 'ctl-2', true);
    let highestAdmitted = 0;
    let overMs = 0;
    await fleet.run(20_000, () => {
      const admitted = fleet.impliedAdmittedRps();
      highestAdmitted = Math.max(highestAdmitted, admitted);
      if (admitted > 1.05 * LIMIT_RPS) overMs += 10;
      return false;
    });
    const applied = fleet
      .buckets()
      .map((b) => `${b.epoch}/${b.version} ratio ${b.effectiveRatio.toFixed(3)}`);
    t.diagnostic(
      `epochs ${replicas.map((r) => r.epoch).join(', ')}; version gap ${versionGap}; admitted ` +
        `${before.toFixed(0)} rps before the kill, at most ${highestAdmitted.toFixed(0)} after (over 5% for ${overMs} ms); hosts: ${applied.join('; ')}`,
    );
    assert.ok(
      highestAdmitted <= 1.05 * LIMIT_RPS,
      `hosts follow the surviving replica: at most ${highestAdmitted.toFixed(0)} rps admitted`,
    );
    assert.notEqual(replicas[0]!.epoch, replicas[1]!.epoch);
    for (const limiter of fleet.limiters) await limiter.stop();
    await aggregator.stop();
    follower.stop();
  });
});
