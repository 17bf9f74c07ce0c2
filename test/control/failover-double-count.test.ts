import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Aggregator, createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { seededRandom } from '../../src/core/clock.js';
import { type BucketHandle, createGlobalLimiter, type GlobalLimiter } from '../../src/global/index.js';
import { settle } from '../global/fixtures.js';
import { virtualFleetBase } from './virtual-fleet-base.js';

/**
 * Hosts that fail over from aggregator A to aggregator B. While A stays up and keeps forwarding
 * (the hosts' links to A are cut, A's link to the controller is not), A keeps counting each host's
 * last rate for its host grace: B holds the hosts out of its sums until then (their reports name
 * A as the last to acknowledge them), so the controller counts them once. When A is down instead,
 * the controller keeps A's last sum for a child expiry, about as long. Both measured at several
 * phases. Virtual time, real components over the in-memory network.
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

interface Excursion {
  /** Highest offered rate the controller saw, and how long it was over the truth by 5%. */
  highestOffered: number;
  overCountedMs: number;
  /** Lowest offered rate the controller saw, and how long it was under the truth by 5%. */
  lowestOffered: number;
  underCountedMs: number;
  /** Least and most the fleet admitted, and how long under 95% / over 105% of the limit. */
  lowestAdmitted: number;
  underLimitMs: number;
  highestAdmitted: number;
  overLimitMs: number;
}

/** Runs `ms` of the fleet after `cut`, tracking how far the controller's view and the fleet stray. */
async function excursion(
  fleet: ReturnType<typeof buildFleet>,
  cut: () => void,
  ms: number,
): Promise<Excursion> {
  const truthRps = HOSTS * HOST_RPS;
  const e: Excursion = {
    highestOffered: 0,
    overCountedMs: 0,
    lowestOffered: Number.POSITIVE_INFINITY,
    underCountedMs: 0,
    lowestAdmitted: Number.POSITIVE_INFINITY,
    underLimitMs: 0,
    highestAdmitted: 0,
    overLimitMs: 0,
  };
  cut();
  await fleet.run(ms, () => {
    const offered = fleet.controllerOfferedRps();
    e.highestOffered = Math.max(e.highestOffered, offered);
    e.lowestOffered = Math.min(e.lowestOffered, offered);
    if (offered > 1.05 * truthRps) e.overCountedMs += STEP_MS;
    if (offered < 0.95 * truthRps) e.underCountedMs += STEP_MS;
    const admitted = fleet.impliedAdmittedRps();
    e.lowestAdmitted = Math.min(e.lowestAdmitted, admitted);
    e.highestAdmitted = Math.max(e.highestAdmitted, admitted);
    if (admitted < 0.95 * LIMIT_RPS) e.underLimitMs += STEP_MS;
    if (admitted > 1.05 * LIMIT_RPS) e.overLimitMs += STEP_MS;
  });
  return e;
}

function describeExcursion(e: Excursion): string {
  const f = (n: number) => n.toFixed(0);
  return (
    `controller offered ${f(e.lowestOffered)}..${f(e.highestOffered)} rps against ${HOSTS * HOST_RPS} ` +
    `(over 5% for ${e.overCountedMs} ms, under for ${e.underCountedMs} ms); fleet admitted ` +
    `${f(e.lowestAdmitted)}..${f(e.highestAdmitted)} rps against a limit of ${LIMIT_RPS} ` +
    `(under 95% for ${e.underLimitMs} ms, over 105% for ${e.overLimitMs} ms)`
  );
}

/** Moments, after the fleet settles, at which the cut comes: against each side's report and forward phase. */
const CUT_OFFSETS_MS = [0, 250, 500, 750];

describe('hosts failing over from one aggregator to another', () => {
  it('from a live aggregator (their links to it cut): counted once, the new one holds them out until the old one stops', async (t) => {
    const truthRps = HOSTS * HOST_RPS;
    for (const offsetMs of CUT_OFFSETS_MS) {
      const fleet = buildFleet();
      await fleet.run(6_000 + offsetMs);
      assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
      // Every host loses its link to agg-a; agg-a stays up and keeps forwarding to the controller.
      const e = await excursion(
        fleet,
        () => {
          for (let i = 0; i < HOSTS; i++) fleet.network.partition(`host-${i}>agg-a`, true);
        },
        8 * INTERVAL_MS,
      );
      const moved = fleet.limiters.filter((l) => l.snapshot().reporter.clientTarget === 'agg-b').length;
      const heldOut = fleet.aggregators[1]!.snapshot().counters.heldOutReporters;
      t.diagnostic(`cut at +${offsetMs} ms: ${moved} moved, ${heldOut} held out; ${describeExcursion(e)}`);
      assert.equal(moved, HOSTS);
      assert.equal(heldOut, HOSTS);
      // Before agg-b held them out: 901 rps against 600 (over 5% for 1.6 s) and the fleet down to 200 rps.
      assert.ok(e.highestOffered <= 1.1 * truthRps, `offered at most ${e.highestOffered.toFixed(0)} rps`);
      assert.ok(e.lowestAdmitted >= 0.85 * LIMIT_RPS, `admitted at least ${e.lowestAdmitted.toFixed(0)} rps`);
      assert.ok(
        Math.abs(fleet.controllerOfferedRps() - truthRps) <= 0.05 * truthRps,
        'counted once at the end',
      );
      assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'back at the limit');
      await fleet.stop();
    }
  });

  it('from a dead aggregator: never uncounted while held out; its parent keeps its last sum a little longer', async (t) => {
    const truthRps = HOSTS * HOST_RPS;
    for (const offsetMs of CUT_OFFSETS_MS) {
      const fleet = buildFleet();
      await fleet.run(6_000 + offsetMs);
      assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'settled');
      // agg-a is gone for everyone: hosts and controller alike.
      const e = await excursion(fleet, () => fleet.network.partition('agg-a', true), 8 * INTERVAL_MS);
      const moved = fleet.limiters.filter((l) => l.snapshot().reporter.clientTarget === 'agg-b').length;
      t.diagnostic(`agg-a down at +${offsetMs} ms: ${moved} moved; ${describeExcursion(e)}`);
      assert.equal(moved, HOSTS);
      // The hold never leaves the moved hosts uncounted: the controller still has agg-a's last sum.
      assert.ok(e.lowestOffered >= 0.95 * truthRps, `offered at least ${e.lowestOffered.toFixed(0)} rps`);
      assert.equal(e.overLimitMs, 0, 'never admitted over the limit');
      // What remains: the controller keeps agg-a's last sum for its child expiry (3 intervals from
      // agg-a's last forward), longer than agg-b's hold (2.5 from each host's last report there).
      // Measured 20–1020 ms over by 5% (up to 1,199 rps against 600); without the hold 1,050–1,840 ms.
      assert.ok(e.overCountedMs <= 1.25 * INTERVAL_MS, `over-counted for ${e.overCountedMs} ms`);
      assert.ok(
        Math.abs(fleet.controllerOfferedRps() - truthRps) <= 0.05 * truthRps,
        'counted once at the end',
      );
      assert.ok(Math.abs(fleet.impliedAdmittedRps() - LIMIT_RPS) <= 0.05 * LIMIT_RPS, 'back at the limit');
      await fleet.stop();
    }
  });
});
