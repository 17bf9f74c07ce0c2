import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { hostShareRps } from '../../src/global/index.js';
import { advance, type Harness, harness } from './fixtures.js';

/** A host that offered 100 rps for a second, told: limit 1000 rps, fleet offered 1000 rps. */
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

describe('burst guard', () => {
  it('sizes the host share from the directive and the host offered rate', () => {
    assert.equal(hostShareRps(1_000, 100, 1_000, 0.25), 125);
    assert.equal(hostShareRps(1_000, 100, 50, 0), 1_000, 'a host cannot have more than all of the limit');
    assert.equal(hostShareRps(1_000, 0, 1_000, 0.25), 0, 'no measured share');
    assert.equal(hostShareRps(0, 100, 1_000, 0.25), 0, 'no limit');
  });

  it('cuts a spike within the same interval, where the ratio alone would not', async () => {
    const guarded = harness({ burstGuard: {} });
    const handle = await warmedUp(guarded);
    const snap = guarded.limiter.snapshot().buckets[0]!;
    assert.equal(snap.guardArmed, true);
    assert.equal(snap.guardCapacity, 125);
    await guarded.flush();
    assert.equal(
      guarded.limiter.snapshot().buckets[0]!.guardCapacity,
      125,
      'a report window cut short by a flush measures no rate and does not resize the guard',
    );
    let admitted = 0;
    for (let i = 0; i < 2_000; i++) if (handle.allow()) admitted++;
    assert.equal(admitted, 125, 'a full burst window of share, then nothing');
    guarded.clock.advance(100);
    for (let i = 0; i < 2_000; i++) if (handle.allow()) admitted++;
    assert.equal(admitted, 125 + 12, '100 ms refills 12.5 units at 125 rps');
    const decision = handle.decide();
    assert.equal(decision.allowed, false);
    assert.equal(decision.retryAfterMs, 4, 'until one unit has refilled');
    const after = guarded.limiter.snapshot().buckets[0]!;
    assert.equal(after.droppedByGuard, 4_001 - 137);
    assert.equal(after.dropped, 0, 'guard drops are counted apart from ratio drops');

    const unguarded = harness();
    const plain = await warmedUp(unguarded);
    let plainAdmitted = 0;
    for (let i = 0; i < 2_000; i++) if (plain.allow()) plainAdmitted++;
    assert.equal(plainAdmitted, 2_000, 'without the guard the spike passes until the loop reacts');
  });

  it('sizes the share from the host rate of the windows the directive covers, not its newest rate', async () => {
    // The directive keeps saying "fleet offered 1000 rps": a total measured before this host
    // surged. The reply to report k was computed from reports k-1 and k-2 (the zone's last forward
    // and the other zones' older ones), so the guard sizes from their mean, never from report k:
    // a host's newest rate over a stale fleet total would grant every host of a fleet-wide spike
    // the spike (the bug: 3x step, 180% overshoot with the guard).
    const h = harness({ burstGuard: {}, localRescale: false });
    const handle = await warmedUp(h);
    const surge = async () => {
      for (let i = 0; i < 1_000; i++) handle.allow();
      h.clock.advance(1_000);
      await h.flush();
      return h.limiter.snapshot().buckets[0]!;
    };
    const first = await surge();
    assert.equal(first.hostOfferedRps, 1_000);
    assert.equal(first.guardCapacity, 125, 'report k-1: 100 rps');
    const second = await surge();
    assert.equal(second.guardCapacity, 687.5, 'mean of reports k-1 (1000 rps) and k-2 (100 rps)');
    const third = await surge();
    assert.equal(third.guardCapacity, 1_250, 'a sustained rate counts once the fleet total can hold it');
  });

  it('maxShareGrowthRatio caps how fast the share grows per directive', async () => {
    const h = harness({ burstGuard: { maxShareGrowthRatio: 0.2 } });
    const handle = await warmedUp(h);
    assert.equal(h.limiter.snapshot().buckets[0]!.guardCapacity, 125);
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 1_000; i++) handle.allow();
      h.clock.advance(1_000);
      await h.flush();
    }
    // Round 1 sizes from report k-1 (100 rps): 125, under the cap; round 2 would grow to 687.5.
    assert.equal(h.limiter.snapshot().buckets[0]!.guardCapacity, 150);
  });

  it('reports guard drops as offered but not admitted', async () => {
    const h = harness({ burstGuard: { slackRatio: 0, burstWindowMs: 500 } });
    const handle = await warmedUp(h);
    assert.equal(h.limiter.snapshot().buckets[0]!.guardCapacity, 50);
    for (let i = 0; i < 200; i++) handle.allow();
    await h.flush();
    const usage = h.aggregator.last.buckets.find((b) => b.bucket === 'api')!;
    assert.equal(usage.offered, 200);
    assert.equal(usage.admitted, 50);
  });

  it('is not armed in shadow mode, before a directive, or for a host with no measured traffic', async () => {
    const shadow = harness({ burstGuard: {} });
    const shadowHandle = await warmedUp(shadow, { mode: 'shadow' });
    for (let i = 0; i < 2_000; i++) assert.equal(shadowHandle.allow(), true);
    assert.equal(shadow.limiter.snapshot().buckets[0]!.guardArmed, false);

    const cold = harness({ burstGuard: {} });
    const coldHandle = cold.limiter.bucket('api');
    assert.equal(cold.limiter.snapshot().buckets[0]!.guardArmed, false);
    cold.aggregator.set('api', { dropRatio: 0, limitRps: 1_000, offeredRps: 1_000 });
    await cold.flush();
    assert.equal(cold.limiter.snapshot().buckets[0]!.guardArmed, false);
    for (let i = 0; i < 2_000; i++) assert.equal(coldHandle.allow(), true);
  });

  it('disarms when the stale policy lets go of the directive, and refills every tick', async () => {
    const h = harness({ burstGuard: {}, stalePolicy: { kind: 'open' } });
    const handle = await warmedUp(h);
    for (let i = 0; i < 200; i++) handle.allow();
    h.network.partition('agg-1', true);
    h.limiter.start();
    await advance(h.clock, 1_000, 100);
    const refilled = h.limiter.snapshot().buckets[0]!;
    assert.equal(refilled.guardArmed, true);
    assert.equal(refilled.guardTokens, 125, 'a tick tops the guard up');
    await advance(h.clock, 3_000, 100);
    assert.equal(h.limiter.snapshot().buckets[0]!.guardArmed, false, 'stale: fail open');
    for (let i = 0; i < 2_000; i++) assert.equal(handle.allow(), true);
    await h.limiter.stop();
  });

  it('applies after the ratio: the guard caps what the ratio admits', async () => {
    const h = harness({ burstGuard: {} }, 21);
    const handle = await warmedUp(h, { dropRatio: 0.5 });
    let admitted = 0;
    for (let i = 0; i < 2_000; i++) if (handle.allow()) admitted++;
    assert.equal(admitted, 125);
    const snap = h.limiter.snapshot().buckets[0]!;
    assert.ok(Math.abs(snap.dropped / 2_000 - 0.5) < 0.05);
    assert.equal(
      snap.dropped + snap.droppedByGuard + snap.admitted,
      snap.offered,
      'every offered unit is admitted or dropped by exactly one of the two',
    );
  });
});
