import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { seededRandom } from '../../src/core/clock.js';
import { ErrorCode, SpillwayError } from '../../src/core/errors.js';
import { type BucketHandle, createGlobalLimiter } from '../../src/global/index.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { settle } from '../global/fixtures.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * A zone aggregator that fails over between two region aggregators within one forward: its link to
 * the first starts to swallow requests (no reset, so each attempt waits out the report timeout),
 * and the same forward goes to the second a timeout later. The second holds the zone out while the
 * first still counts it; the hold must end when the first's grace does, not a timeout later (the
 * zone was counted nowhere for 860 ms when the retry named the acknowledgement's age as of the
 * forward's window end). Virtual time, real components over the in-memory network.
 */
const INTERVAL_MS = 1000;
const LIMIT_RPS = 300;
const HOST_RPS = 150;
const HOSTS = 4;
const STEP_MS = 10;

function buildTree() {
  const { clock, network, config } = virtualFleetBase(INTERVAL_MS, LIMIT_RPS);
  const controller = createController({ id: 'ctl', config, scheduler: clock });
  network.listen('controller', controller.handleReport);
  controller.start();
  const regions = ['r1', 'r2'].map((id, i) => {
    const region = createAggregator({
      id,
      zone: 'eu',
      childTiers: ['aggregator'],
      parents: [network.connect('controller', { from: id })],
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(11 + i),
    });
    network.listen(id, region.handleReport);
    region.start();
    return region;
  });
  let swallowing = false;
  const toR1 = network.connect('r1', { from: 'z>r1' });
  const swallowingR1: ControlClient = {
    target: 'r1',
    report: (request, options) =>
      swallowing
        ? new Promise((_, reject) =>
            clock.setTimeout(
              () => reject(new SpillwayError(ErrorCode.StoreTimeout, 'no reply from r1', {})),
              options.timeoutMs,
            ),
          )
        : toR1.report(request, options),
    close: () => toR1.close(),
  };
  const zone = createAggregator({
    id: 'z',
    zone: 'z1',
    parents: [swallowingR1, network.connect('r2', { from: 'z>r2' })],
    intervalMs: INTERVAL_MS,
    scheduler: clock,
    random: seededRandom(5),
  });
  network.listen('z', zone.handleReport);
  zone.start();
  const handles: BucketHandle[] = [];
  for (let i = 0; i < HOSTS; i++) {
    const limiter = createGlobalLimiter({
      reporterId: `h${i}`,
      zone: 'z1',
      clients: [network.connect('z', { from: `h${i}` })],
      intervalMs: INTERVAL_MS,
      scheduler: clock,
      random: seededRandom(100 + i),
    });
    limiter.start();
    handles.push(limiter.bucket('pay'));
  }
  const credit = handles.map(() => 0);
  async function run(ms: number, each?: () => void): Promise<void> {
    for (let elapsed = 0; elapsed < ms; elapsed += STEP_MS) {
      handles.forEach((handle, i) => {
        credit[i]! += (HOST_RPS * STEP_MS) / 1000;
        for (; credit[i]! >= 1; credit[i]!--) handle.allow();
      });
      clock.advance(STEP_MS);
      await settle();
      each?.();
    }
  }
  const offeredRps = () => controller.snapshot().buckets.find((b) => b.key === 'pay')?.offeredRps ?? 0;
  return { controller, regions, zone, run, offeredRps, swallow: () => (swallowing = true) };
}

describe('a zone aggregator failing over between region aggregators within one forward', () => {
  it('is held out at the second region only while the first still counts it', async (t) => {
    const truthRps = HOSTS * HOST_RPS;
    for (const offsetMs of [0, 300, 600]) {
      const tree = buildTree();
      await tree.run(6_000 + offsetMs);
      tree.swallow();
      let underMs = 0;
      let lowest = Number.POSITIVE_INFINITY;
      await tree.run(6 * INTERVAL_MS, () => {
        const offered = tree.offeredRps();
        lowest = Math.min(lowest, offered);
        if (offered < 0.95 * truthRps) underMs += STEP_MS;
      });
      const heldOut = tree.regions[1]!.snapshot().counters.heldOutReporters;
      t.diagnostic(
        `cut at +${offsetMs} ms: r2 held z out ${heldOut}×; lowest ${lowest.toFixed(0)} rps (under 5% for ${underMs} ms)`,
      );
      assert.equal(heldOut, 1, 'r2 held the zone out: r1 still counted it');
      assert.equal(underMs, 0, `the zone counted nowhere for ${underMs} ms`);
      assert.equal(tree.zone.snapshot().lastForward?.target, 'r2');
      tree.controller.stop();
      await Promise.all([tree.zone.stop(), ...tree.regions.map((r) => r.stop())]);
    }
  });
});
