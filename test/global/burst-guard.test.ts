import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { BucketHandle } from '../../src/global/index.js';
import { addLimiterMetrics } from '../../src/ops/limiter-metrics.js';
import { createMetrics } from '../../src/ops/metrics.js';
import { advance, type Harness, harness } from './fixtures.js';

/**
 * A host that offered 100 rps for a second, told: limit 1000 rps, fleet offered 1000 rps. Its
 * allowance is 100 rps (ratio 0: its share of the limit; ratio r: 100 * (1 - r)), so with the
 * default guard the detector drains at 220 rps and trips at 6 units.
 */
async function warmedUp(h: Harness, spec: { dropRatio?: number; mode?: 'enforce' | 'shadow' } = {}) {
  const handle = h.limiter.bucket('api');
  for (let i = 0; i < 100; i++) handle.allow();
  h.clock.advance(1_000);
  h.aggregator.set('api', {
    dropRatio: spec.dropRatio ?? 0,
    mode: spec.mode,
    limitRps: 1_000,
    offeredRps: 1_000,
  });
  await h.flush();
  return handle;
}

/** `calls` calls spread evenly over `ms` of virtual time; returns how many were admitted. */
function spread(h: Harness, handle: BucketHandle, calls: number, ms: number): number {
  let admitted = 0;
  for (let i = 0; i < calls; i++) {
    if (handle.allow()) admitted++;
    h.clock.advance(ms / calls);
  }
  return admitted;
}

const snapshot = (h: Harness) => h.limiter.snapshot().buckets[0]!;

describe('burst guard', () => {
  it('sizes the allowance from the directive and the host rate of its windows', async () => {
    const h = harness({ burstGuard: {} });
    await warmedUp(h);
    const snap = snapshot(h);
    assert.equal(snap.guardArmed, true);
    assert.equal(snap.guardTripped, false);
    assert.equal(snap.guardAllowanceRps, 100, 'ratio 0: 100 rps of 1,000 offered, times the 1,000 rps limit');
    assert.equal(snap.guardCapacity, 10, '100 ms of allowance');
    await h.flush();
    assert.equal(
      snapshot(h).guardAllowanceRps,
      100,
      'a report window cut short by a flush measures no rate and does not resize the guard',
    );

    const ratio = harness({ burstGuard: {} });
    await warmedUp(ratio, { dropRatio: 0.4 });
    assert.equal(snapshot(ratio).guardAllowanceRps, 60, 'ratio 0.4: what the ratio leaves of 100 rps');
  });

  it('cuts nothing while the host stays under the detector drain, even at twice its allowance', async () => {
    const h = harness({ burstGuard: {} });
    const handle = await warmedUp(h);
    assert.equal(spread(h, handle, 1_000, 10_000), 1_000, '100 rps for 10 s');
    assert.equal(spread(h, handle, 2_000, 10_000), 2_000, '200 rps for 10 s: under the 220 rps drain');
    assert.equal(snapshot(h).droppedByGuard, 0);
    assert.equal(snapshot(h).guardTripped, false);
  });

  it('trips within a few calls of a spike and holds the host to its allowance, paying back the detection delay', async () => {
    const guarded = harness({ burstGuard: {} });
    const handle = await warmedUp(guarded);
    // 1,000 rps for a second: the level gains 1 - 0.22 units a millisecond and trips at 6.
    const admitted = spread(guarded, handle, 1_000, 1_000);
    const snap = snapshot(guarded);
    assert.equal(snap.guardTripped, true);
    assert.ok(admitted >= 97 && admitted <= 101, `${admitted} admitted in the spike's second, allowance 100`);
    assert.equal(snap.droppedByGuard, 1_000 - admitted);
    assert.equal(snap.dropped, 0, 'guard drops are counted apart from ratio drops');
    const decision = handle.decide();
    assert.equal(decision.allowed, false);
    assert.ok(
      decision.retryAfterMs > 0 && decision.retryAfterMs <= 10,
      `retry after ${decision.retryAfterMs} ms`,
    );

    const unguarded = harness();
    const plain = await warmedUp(unguarded);
    assert.equal(spread(unguarded, plain, 1_000, 1_000), 1_000, 'without the guard the spike passes');
  });

  it('a burst of calls at one instant trips at the trip level, and the calls before it are paid back', async () => {
    const h = harness({ burstGuard: {} });
    const handle = await warmedUp(h);
    let admitted = 0;
    for (let i = 0; i < 2_000; i++) if (handle.allow()) admitted++;
    assert.equal(admitted, 5, 'the sixth unit trips the detector');
    assert.equal(handle.allow(0), true, 'a zero-cost call takes nothing, so passes even in debt');
    // 5 units over an allowance of 0 ms: the bucket starts 5 units in debt, paid back at 100 rps.
    assert.equal(spread(h, handle, 100, 50), 0, 'nothing in the next 50 ms');
    assert.ok(spread(h, handle, 1_000, 1_000) >= 90, 'then the allowance');
  });

  it('releases once the calls past the ratio fall back under the drain', async () => {
    const h = harness({ burstGuard: {} });
    const handle = await warmedUp(h);
    spread(h, handle, 500, 500);
    assert.equal(snapshot(h).guardTripped, true);
    // Back to 100 rps: the level drains 0.12 units a millisecond from 6.
    spread(h, handle, 20, 200);
    assert.equal(snapshot(h).guardTripped, false);
    const before = snapshot(h).droppedByGuard;
    assert.equal(spread(h, handle, 1_000, 10_000), 1_000);
    assert.equal(snapshot(h).droppedByGuard, before);
  });

  it('exports its state: the tripped gauge and guard drops apart from ratio drops', async () => {
    const h = harness({ burstGuard: {} });
    const metrics = createMetrics({ component: 'host', id: 'host-1', processMetrics: false });
    addLimiterMetrics(metrics, h.limiter);
    const handle = await warmedUp(h);
    assert.match(await metrics.registry.metrics(), /^spillway_burst_guard_tripped\{bucket="api"\} 0$/m);
    const admitted = spread(h, handle, 500, 500);
    const text = await metrics.registry.metrics();
    assert.match(text, /^spillway_burst_guard_tripped\{bucket="api"\} 1$/m);
    assert.match(
      text,
      new RegExp(`^spillway_burst_guard_dropped_total\\{bucket="api"\\} ${500 - admitted}$`, 'm'),
    );
  });

  it('a report tick drains the detector of an idle host', async () => {
    const h = harness({ burstGuard: {} });
    const handle = await warmedUp(h);
    spread(h, handle, 500, 500);
    assert.equal(snapshot(h).guardTripped, true);
    h.limiter.start();
    await advance(h.clock, 1_000, 100);
    assert.equal(snapshot(h).guardTripped, false, 'no calls, yet released');
    await h.limiter.stop();
  });

  it('a busy host trips on a sustained excess, not on a burst of a few milliseconds', async () => {
    // Allowance 10,000 rps: the trip level is 50 ms of it (500 units), not 6.
    const h = harness({ burstGuard: {} });
    const handle = h.limiter.bucket('api');
    for (let i = 0; i < 10_000; i++) handle.allow();
    h.clock.advance(1_000);
    h.aggregator.set('api', { dropRatio: 0, limitRps: 100_000, offeredRps: 100_000 });
    await h.flush();
    assert.equal(snapshot(h).guardAllowanceRps, 10_000);
    let admitted = 0;
    for (let i = 0; i < 400; i++) if (handle.allow()) admitted++;
    assert.equal(admitted, 400, '400 calls at once: 4 ms of a 100 ms burst window');
    assert.equal(snapshot(h).guardTripped, false);
  });

  it('sizes from the host rate of the windows the directive covers, not its newest rate', async () => {
    // The directive keeps saying "fleet offered 1000 rps": a total measured before this host
    // surged. The reply to report k was computed from reports k-1 and k-2 (the zone's last forward
    // and the other zones' older ones), so the allowance comes from their mean, never from report
    // k: a host's newest rate over a stale fleet total would grant every host of a fleet-wide spike
    // the spike.
    const h = harness({ burstGuard: {}, localRescale: false });
    const handle = await warmedUp(h);
    const surge = async () => {
      for (let i = 0; i < 1_000; i++) handle.allow();
      h.clock.advance(1_000);
      await h.flush();
      return snapshot(h);
    };
    const first = await surge();
    assert.equal(first.hostOfferedRps, 1_000);
    assert.equal(first.guardAllowanceRps, 100, 'report k-1: 100 rps');
    const second = await surge();
    assert.equal(second.guardAllowanceRps, 550, 'mean of reports k-1 (1000 rps) and k-2 (100 rps)');
    const third = await surge();
    assert.equal(third.guardAllowanceRps, 1_000, 'a sustained rate counts once the fleet total can hold it');
  });

  it('reports guard drops as offered but not admitted', async () => {
    const h = harness({ burstGuard: {} });
    const handle = await warmedUp(h);
    for (let i = 0; i < 200; i++) handle.allow();
    await h.flush();
    const usage = h.aggregator.last.buckets.find((b) => b.bucket === 'api')!;
    assert.equal(usage.offered, 200);
    assert.equal(usage.admitted, 5);
  });

  it('is not armed in shadow mode, before a directive, or for a host with no measured traffic', async () => {
    const shadow = harness({ burstGuard: {} });
    const shadowHandle = await warmedUp(shadow, { mode: 'shadow' });
    for (let i = 0; i < 2_000; i++) assert.equal(shadowHandle.allow(), true);
    assert.equal(snapshot(shadow).guardArmed, false);

    const cold = harness({ burstGuard: {} });
    const coldHandle = cold.limiter.bucket('api');
    assert.equal(snapshot(cold).guardArmed, false);
    cold.aggregator.set('api', { dropRatio: 0, limitRps: 1_000, offeredRps: 1_000 });
    await cold.flush();
    assert.equal(snapshot(cold).guardArmed, false);
    for (let i = 0; i < 2_000; i++) assert.equal(coldHandle.allow(), true);
  });

  it('disarms when the stale policy lets go of the directive', async () => {
    const h = harness({ burstGuard: {}, stalePolicy: { kind: 'open' } });
    const handle = await warmedUp(h);
    h.network.partition('agg-1', true);
    h.limiter.start();
    await advance(h.clock, 1_000, 100);
    assert.equal(snapshot(h).guardArmed, true);
    await advance(h.clock, 3_000, 100);
    assert.equal(snapshot(h).guardArmed, false, 'stale: fail open');
    for (let i = 0; i < 2_000; i++) assert.equal(handle.allow(), true);
    await h.limiter.stop();
  });

  it('applies after the ratio: the guard sees only what the ratio admits', async () => {
    const h = harness({ burstGuard: {} }, 21);
    const handle = await warmedUp(h, { dropRatio: 0.5 });
    const admitted = spread(h, handle, 2_000, 1_000);
    const snap = snapshot(h);
    assert.ok(Math.abs(snap.dropped / 2_000 - 0.5) < 0.05);
    assert.ok(admitted >= 47 && admitted <= 53, `${admitted} admitted, allowance 50 rps`);
    assert.equal(
      snap.dropped + snap.droppedByGuard + snap.admitted,
      snap.offered,
      'every offered unit is admitted or dropped by exactly one of the two',
    );
  });

  it('refuses options out of range with a stable code', () => {
    for (const burstGuard of [
      { slackRatio: -1 },
      { burstWindowMs: 0 },
      { tripUnits: 0.5 },
      { tripWindowMs: -1 },
      { drainFactor: 1 },
      { drainFactor: Number.NaN },
    ]) {
      assert.throws(
        () => harness({ burstGuard }),
        (error: { code?: string }) => error.code === 'ERR_SPILLWAY_INVALID_OPTION',
        JSON.stringify(burstGuard),
      );
    }
  });
});
