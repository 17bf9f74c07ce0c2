import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Aggregator, createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { seededRandom } from '../../src/core/clock.js';
import { type BucketHandle, createGlobalLimiter, type GlobalLimiter } from '../../src/global/index.js';
import { settle } from '../global/fixtures.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * Hosts that fail over from aggregator A to aggregator B while A stays up and keeps forwarding (the
 * hosts' links to A are cut, A's link to the controller is not): A keeps counting each host's last
 * rate for its host grace while B already counts the host's new reports, so the controller sums
 * those hosts twice for a while. Virtual time, real components over the in-memory network.
 */
const INTERVAL_MS = 1000;
const LIMIT_RPS = 300;
const HOST_RPS = 150;
const HOSTS = 4;
const STEP_MS = 10;

function buildFleet() {
  const { clock, network, config } = virtualFleetBase(INTERVAL_MS, LIMIT_RPS);
  const controller = createController({ id: 'ctl', config, scheduler: clock });
  network.listen('controller', controller.handleReport);
  controller.start();
  const aggregators: Aggregator[] = ['agg-a', 'agg-b'].map((id, i) => {
    const aggregator = createAggregator({
      id,
      zone: 'z1',
      parents: [network.connect('controller', { from: id })],
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(7 + i),
    });
    network.listen(id, aggregator.handleReport);
    aggregator.start();
    return aggregator;
  });
  const limiters: GlobalLimiter[] = [];
  const handles: BucketHandle[] = [];
  for (let i = 0; i < HOSTS; i++) {
    // One address per link, so that a host's link to A alone can be cut.
    const limiter = createGlobalLimiter({
      reporterId: `host-${i}`,
      zone: 'z1',
      clients: [
        network.connect('agg-a', { from: `host-${i}>agg-a` }),
        network.connect('agg-b', { from: `host-${i}>agg-b` }),
      ],
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(100 + i),
    });
    limiter.start();
    limiters.push(limiter);
    handles.push(limiter.bucket('pay'));
  }
  const perStep = (HOST_RPS * STEP_MS) / 1000;
  const credit = handles.map(() => 0);
  async function run(ms: number, each?: () => void): Promise<void> {
    for (let elapsed = 0; elapsed < ms; elapsed += STEP_MS) {
      handles.forEach((handle, i) => {
        credit[i]! += perStep;
        for (; credit[i]! >= 1; credit[i]!--) handle.allow();
      });
      clock.advance(STEP_MS);
      await settle();
      each?.();
    }
  }
  const controllerOfferedRps = () =>
    controller.snapshot().buckets.find((b) => b.key === 'pay')?.offeredRps ?? 0;
  const impliedAdmittedRps = () =>
    limiters.reduce(
      (sum, l) => sum + HOST_RPS * (1 - l.snapshot().buckets.find((b) => b.key === 'pay')!.effectiveRatio),
      0,
    );
  return {
    network,
    controller,
    aggregators,
    limiters,
    run,
    controllerOfferedRps,
    impliedAdmittedRps,
    async stop() {
      controller.stop();
      const stopped = Promise.all([...limiters.map((l) => l.stop()), ...aggregators.map((a) => a.stop())]);
      await run(100);
      await stopped;
    },
  };
}

describe('hosts failing over from a live aggregator to another', () => {
  it('are counted at both for about a host grace: measured, and bounded', async (t) => {
    const fleet = buildFleet();
    const truthRps = HOSTS * HOST_RPS;
    await fleet.run(6_000);
    assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
    // Every host loses its link to agg-a; agg-a stays up and keeps forwarding to the controller.
    for (let i = 0; i < HOSTS; i++) fleet.network.partition(`host-${i}>agg-a`, true);
    let overMs = 0;
    let highest = 0;
    let lowestAdmitted = Number.POSITIVE_INFINITY;
    let underMs = 0;
    await fleet.run(8 * INTERVAL_MS, () => {
      const offered = fleet.controllerOfferedRps();
      highest = Math.max(highest, offered);
      if (offered > 1.05 * truthRps) overMs += STEP_MS;
      const admitted = fleet.impliedAdmittedRps();
      lowestAdmitted = Math.min(lowestAdmitted, admitted);
      if (admitted < 0.95 * LIMIT_RPS) underMs += STEP_MS;
    });
    const moved = fleet.limiters.filter((l) => l.snapshot().reporter.clientTarget === 'agg-b').length;
    t.diagnostic(
      `${moved} of ${HOSTS} hosts moved; controller offered at most ${highest.toFixed(0)} rps against ` +
        `${truthRps} offered (over 5% for ${overMs} ms); fleet admitted as little as ` +
        `${lowestAdmitted.toFixed(0)} rps against a limit of ${LIMIT_RPS} (under 95% for ${underMs} ms)`,
    );
    assert.equal(moved, HOSTS);
    // The overlap: agg-a's host grace (2.5 intervals from each host's last report) against the
    // hosts' first reports to agg-b (2 intervals after it), plus each aggregator's forward phase.
    assert.ok(highest <= 1.6 * truthRps, `offered at most ${highest.toFixed(0)} rps`);
    assert.ok(overMs <= 2.5 * INTERVAL_MS, `over-counted for ${overMs} ms`);
    assert.ok(underMs <= 3.5 * INTERVAL_MS, `under the limit for ${underMs} ms`);
    assert.ok(
      Math.abs(fleet.controllerOfferedRps() - truthRps) <= 0.05 * truthRps,
      'counted once at the end',
    );
    assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'back at the limit');
    await fleet.stop();
  });
});
