import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Aggregator, createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { startLoadedHosts } from './loaded-hosts.js';
import { call, hostReport } from './report-fixtures.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * The controller cut off from every aggregator for longer than its child expiry (3 intervals), in
 * virtual time: GlobalLimiter hosts -> aggregators -> controller over the in-memory network. Every
 * child expires at the controller, so a bucket's sums are empty when the partition heals, and the
 * aggregators come back one forward at a time. The first forward's sum is only its own hosts'
 * share of the fleet: a ratio from it alone would let those hosts admit far more than the limit
 * allows (test/faults/netns-partition.test.ts saw 0.008 instead of 0.34 for an interval). Last,
 * hosts cut off one after the other: an aggregator's forwards between the two cuts are short of
 * the other's hosts, and the directive they bring back must not reach a host that comes back.
 */
const INTERVAL_MS = 1000;
const LIMIT_RPS = 300;
const STEP_MS = 10;

interface HostSpec {
  /** The aggregator this host reports to. */
  aggregator: string;
  rps: number;
}

function buildFleet(hosts: readonly HostSpec[], aggregatorIds: readonly string[]) {
  const { clock, network, config } = virtualFleetBase(INTERVAL_MS, LIMIT_RPS);
  const controller = createController({ id: 'ctl', config, scheduler: clock });
  network.listen('controller', controller.handleReport);
  controller.start();
  const aggregators: Aggregator[] = aggregatorIds.map((id, i) => {
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
  const { limiters, run, buckets, impliedAdmittedRps } = startLoadedHosts(
    network,
    clock,
    hosts.map((h) => ({ zone: 'z1', aggregator: h.aggregator, rps: h.rps })),
    { bucket: 'pay', intervalMs: INTERVAL_MS, stepMs: STEP_MS },
  );

  return {
    clock,
    network,
    controller,
    aggregators,
    run,
    buckets,
    impliedAdmittedRps,
    async stop() {
      controller.stop();
      const stopped = Promise.all([...limiters.map((l) => l.stop()), ...aggregators.map((a) => a.stop())]);
      await run(100);
      await stopped;
    },
  };
}

/**
 * Settles, cuts `addresses` off for 3.5 intervals (the controller: every child expires, 3
 * intervals; the hosts: their aggregators stop forwarding the bucket after 2.5), heals, and
 * watches the hosts until they are back within 5% of the limit with directives computed after the
 * heal. Returns the lowest ratio any host applied and the most the fleet admitted meanwhile.
 */
async function partitionAndHeal(
  fleet: ReturnType<typeof buildFleet>,
  addresses = ['controller'],
  healGapMs = 0,
) {
  await fleet.run(6_000);
  assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
  for (const address of addresses) fleet.network.partition(address, true);
  await fleet.run(3.5 * INTERVAL_MS);
  const pay = fleet.controller.snapshot().buckets.find((b) => b.key === 'pay');
  assert.equal(pay?.children, 0, "no child's usage of the bucket counts at the controller");
  const held = fleet.buckets().map((b) => b.effectiveRatio);
  assert.ok(
    held.every((r) => Math.abs(r - 0.5) < 0.05),
    `hosts hold their ratio through the partition: ${held.join(', ')}`,
  );
  // Directives computed after the heal (an aggregator may relay one cached before the partition).
  const versionAtHeal = fleet.controller.snapshot().version;
  let lowest = Number.POSITIVE_INFINITY;
  let highestAdmitted = 0;
  const watch = () => {
    for (const b of fleet.buckets()) lowest = Math.min(lowest, b.effectiveRatio);
    highestAdmitted = Math.max(highestAdmitted, fleet.impliedAdmittedRps());
    return false;
  };
  for (const [i, address] of addresses.entries()) {
    if (i > 0) await fleet.run(healGapMs, watch);
    fleet.network.partition(address, false);
  }
  const recoveredMs = await fleet.run(10 * INTERVAL_MS, () => {
    const buckets = fleet.buckets();
    for (const b of buckets) lowest = Math.min(lowest, b.effectiveRatio);
    highestAdmitted = Math.max(highestAdmitted, fleet.impliedAdmittedRps());
    return (
      buckets.every((b) => b.version > versionAtHeal) &&
      Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS
    );
  });
  return { held, lowest, highestAdmitted, recoveredMs };
}

describe('controller cut off from every child, then healed', () => {
  it('hosts split over two aggregators: the first forward back never loosens what its hosts hold', async (t) => {
    // Each aggregator carries half the fleet's load: either one's forward alone is 300 rps, the
    // limit, whose ratio (0) would let its hosts admit everything.
    const fleet = buildFleet(
      [
        { aggregator: 'agg-1', rps: 300 },
        { aggregator: 'agg-2', rps: 300 },
      ],
      ['agg-1', 'agg-2'],
    );
    const { held, lowest, highestAdmitted, recoveredMs } = await partitionAndHeal(fleet);
    t.diagnostic(
      `held ${held.map((r) => r.toFixed(3)).join(', ')}; lowest after the heal ${lowest.toFixed(3)}; ` +
        `at most ${highestAdmitted.toFixed(0)} rps admitted; back within 5% in ${recoveredMs} ms`,
    );
    assert.ok(lowest >= 0.45, `no host loosened past its held ratio (0.5): lowest ${lowest.toFixed(3)}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    assert.ok(
      recoveredMs !== undefined && recoveredMs <= 2.5 * INTERVAL_MS,
      `recovered in ${recoveredMs} ms`,
    );
    await fleet.stop();
  });

  it('hosts cut off from their aggregators: the first forward that brings the bucket back never loosens it either', async (t) => {
    const fleet = buildFleet(
      [
        { aggregator: 'agg-1', rps: 300 },
        { aggregator: 'agg-2', rps: 300 },
      ],
      ['agg-1', 'agg-2'],
    );
    // One host's link comes back 300 ms before the other's (netns-partition.test.ts: 171 and 320 ms).
    const { lowest, highestAdmitted, recoveredMs } = await partitionAndHeal(fleet, ['host-0', 'host-1'], 300);
    t.diagnostic(
      `lowest ${lowest.toFixed(3)}; at most ${highestAdmitted.toFixed(0)} rps admitted; back in ${recoveredMs} ms`,
    );
    assert.ok(lowest >= 0.45, `lowest ${lowest.toFixed(3)}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    assert.ok(
      recoveredMs !== undefined && recoveredMs <= 2.5 * INTERVAL_MS,
      `recovered in ${recoveredMs} ms`,
    );
    await fleet.stop();
  });

  it('a backup aggregator without hosts: its forward carries no usage of the bucket, nothing to loosen', async () => {
    const fleet = buildFleet(
      [
        { aggregator: 'agg-primary', rps: 200 },
        { aggregator: 'agg-primary', rps: 400 },
      ],
      ['agg-primary', 'agg-backup'],
    );
    const { lowest, highestAdmitted, recoveredMs } = await partitionAndHeal(fleet);
    assert.ok(lowest >= 0.45, `lowest ${lowest.toFixed(3)}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    assert.ok(
      recoveredMs !== undefined && recoveredMs <= 2.5 * INTERVAL_MS,
      `recovered in ${recoveredMs} ms`,
    );
    await fleet.stop();
  });

  it('the controller alone: an emptied bucket regathers for a child expiry, across ticks', () => {
    const clock = new ManualClock(1_700_000_000_000);
    const controller = createController({
      id: 'ctl',
      config: {
        version: 1,
        intervalMs: INTERVAL_MS,
        ttlMs: 4 * INTERVAL_MS,
        buckets: [{ key: 'pay', limitRps: LIMIT_RPS, mode: 'enforce', scope: 'global' }],
      },
      scheduler: clock,
    });
    let sequence = 0;
    // Each aggregator forwards 300 rps of which its hosts admit 150 (they apply 0.5).
    const forward = (id: string) =>
      call(
        controller.handleReport,
        hostReport({
          id,
          sequence: ++sequence,
          endMs: clock.nowMs(),
          tier: Tier.AGGREGATOR,
          buckets: [{ bucket: 'pay', offered: 300, admitted: 150 }],
        }),
      ).directives.find((d) => d.bucket === 'pay');
    const tickAfter = (ms: number) => {
      clock.advance(ms);
      controller.tick();
    };
    forward('agg-1');
    forward('agg-2');
    tickAfter(INTERVAL_MS);
    assert.equal(forward('agg-1')!.dropRatio, 0.5);
    for (let i = 0; i < 4; i++) tickAfter(INTERVAL_MS);
    assert.equal(controller.snapshot().children.length, 0, 'both expired');

    assert.equal(forward('agg-1'), undefined, 'alone, 300 rps says 0: withheld');
    tickAfter(INTERVAL_MS / 2);
    assert.equal(forward('agg-1'), undefined, 'a tick that counted agg-1 alone does not end it');
    assert.equal(forward('agg-2')!.dropRatio, 0.5, 'both back: the ratio in force, sent');
    assert.equal(forward('agg-1')!.dropRatio, 0.5);

    // Cut off again; this time agg-2 never comes back.
    for (let i = 0; i < 4; i++) tickAfter(INTERVAL_MS);
    assert.equal(forward('agg-1'), undefined);
    tickAfter(INTERVAL_MS);
    tickAfter(INTERVAL_MS);
    assert.equal(forward('agg-1'), undefined, 'within a child expiry of its return');
    tickAfter(INTERVAL_MS);
    // As long as agg-2 would have had to come back: agg-1's sum is the fleet now.
    assert.equal(forward('agg-1')!.dropRatio, 0, 'after it');
  });
});

describe('hosts cut off from their aggregators one after the other, then healed', () => {
  it('a directive cached from the partial sum is not relayed to a host back from the cut', async (t) => {
    // host-1 (agg-2) is cut off first, host-0 (agg-1) 1.5 s later. Between the end of agg-2's grace
    // for host-1 (2.5 intervals after its last report) and the end of agg-1's for host-0, agg-1's
    // forward is the controller's whole sum (300 rps, the limit) and comes back with a ratio near
    // 0, which agg-1 caches. Both hosts come back 3 s after host-0's cut, while that directive is
    // fresh (TTL 4 intervals) and before host-1's held one decays; host-0 rejoins agg-1's sums (past
    // its grace). Its first report back must not get the cached ratio: computed without host-0, it
    // is a newer version than the 0.5 host-0 applies, and took the fleet to 449 rps for 1.9 s.
    // (netns-partition.test.ts saw it at 2 of 60 heals: ~0.9 s with a ratio near 0.)
    const fleet = buildFleet(
      [
        { aggregator: 'agg-1', rps: 300 },
        { aggregator: 'agg-2', rps: 300 },
      ],
      ['agg-1', 'agg-2'],
    );
    await fleet.run(6_000);
    assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
    fleet.network.partition('host-1', true);
    await fleet.run(1.5 * INTERVAL_MS);
    fleet.network.partition('host-0', true);
    await fleet.run(3 * INTERVAL_MS);
    const cached = fleet.aggregators[0]!.snapshot().buckets.find((b) => b.key === 'pay')?.directive;
    assert.ok(
      cached !== undefined && cached.dropRatio < 0.1 && cached.remainingTtlMs > INTERVAL_MS,
      `agg-1 caches a loose directive from host-0's share alone: ${JSON.stringify(cached)}`,
    );
    const held = fleet.buckets().map((b) => b.effectiveRatio);
    assert.ok(
      held.every((r) => Math.abs(r - 0.5) < 0.05),
      `hosts hold their ratio through the partition: ${held.join(', ')}`,
    );
    fleet.network.partition('host-0', false);
    fleet.network.partition('host-1', false);
    let lowest = Number.POSITIVE_INFINITY;
    let highestAdmitted = 0;
    let looseMs = 0;
    await fleet.run(6 * INTERVAL_MS, () => {
      const ratios = fleet.buckets().map((b) => b.effectiveRatio);
      lowest = Math.min(lowest, ...ratios);
      const admitted = fleet.impliedAdmittedRps();
      highestAdmitted = Math.max(highestAdmitted, admitted);
      if (admitted > 1.05 * LIMIT_RPS) looseMs += STEP_MS;
      return false;
    });
    const settled = fleet.impliedAdmittedRps();
    const withheld = fleet.aggregators.reduce((n, a) => n + a.snapshot().counters.withheldDirectives, 0);
    t.diagnostic(
      `agg-1 cached ratio ${cached.dropRatio.toFixed(3)} (${cached.remainingTtlMs} ms TTL left); after the heal: ` +
        `lowest host ratio ${lowest.toFixed(3)}, at most ${highestAdmitted.toFixed(0)} rps admitted against ` +
        `${LIMIT_RPS} (over 5% for ${looseMs} ms), ${settled.toFixed(0)} rps at the end; directives withheld ${withheld}`,
    );
    assert.ok(lowest >= 0.45, `no host loosened past its held ratio (0.5): lowest ${lowest.toFixed(3)}`);
    assert.ok(highestAdmitted <= 1.05 * LIMIT_RPS, `admitted at most ${highestAdmitted.toFixed(0)} rps`);
    assert.ok(
      Math.abs(settled - LIMIT_RPS) <= 0.05 * LIMIT_RPS,
      `back at the limit: ${settled.toFixed(0)} rps`,
    );
    await fleet.stop();
  });
});
