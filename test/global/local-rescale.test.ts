import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  FLEET_LOCAL_Z,
  FLEET_MOVE_RATIO,
  localRescaleRatio,
  RESCALE_Z,
  type RescaleInputs,
} from '../../src/global/local-rescale.js';
import { type Harness, harness } from './fixtures.js';

/** One 1 s window of `calls` calls on `api`, then a report; returns the bucket's snapshot. */
async function windowOf(h: Harness, calls: number) {
  const handle = h.limiter.bucket('api');
  for (let i = 0; i < calls; i++) handle.allow();
  h.clock.advance(1_000);
  await h.flush();
  return h.limiter.snapshot().buckets.find((b) => b.key === 'api')!;
}

/** A host that offered `hostRps` in the window a directive (ratio, limit, fleet offered) covers. */
async function directed(
  hostRps: number,
  spec: { dropRatio: number; limitRps: number; offeredRps: number },
  options: { localRescale?: boolean } = {},
) {
  const h = harness(options);
  h.aggregator.set('api', { ...spec, ttlMs: 10_000 });
  await windowOf(h, hostRps);
  // No more directives: what follows is the host's own doing.
  h.aggregator.directives.clear();
  return h;
}

/** Rescale inputs: limit, fleet total, host rate then (over `thenWindows`), host rate now; no earlier fleet total. */
function rates(
  limitRps: number,
  globalOfferedRps: number,
  thenRps: number,
  nowRps: number,
  more: Partial<RescaleInputs> = {},
): RescaleInputs {
  return {
    limitRps,
    globalOfferedRps,
    previousGlobalOfferedRps: 0,
    directiveHostOfferedRps: thenRps,
    directiveHostWindows: 1,
    recentOfferedRps: nowRps,
    ...more,
  };
}

describe('local rescale', () => {
  it('keeps the allowance of the directive when the host rate moves beyond noise', () => {
    // Allowance 200 * (1 - 0.5) = 100 rps; now 800 rps offered: drop 1 - 100 / 800.
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 800), 1_000), 0.875);
    // Ratio 0: the allowance is the host's share of the limit, 50 * 100 / 50.
    assert.equal(localRescaleRatio(0, rates(100, 50, 50, 400), 1_000), 0.75);
    // The load fell under the allowance: nothing to drop.
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 60), 1_000), 0);
  });

  it('is neutral within Poisson noise, and without a share to scale from', () => {
    // 200 vs 230 calls: |30| < 3 * sqrt(430).
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 230), 1_000), 0.5);
    const edge = 200 + RESCALE_Z * Math.sqrt(400) * 0.99;
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, edge), 1_000), 0.5);
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 0, 800), 1_000), 0.5, 'no rate then');
    assert.equal(localRescaleRatio(0, rates(0, 200, 200, 800), 1_000), 0, 'no limit');
    assert.equal(localRescaleRatio(0, rates(100, 0, 200, 800), 1_000), 0, 'no fleet total');
    // The same rates over a 100 ms window are 20 vs 80 calls: still beyond noise (60 > 3 * 10).
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 800), 100), 0.875);
  });

  it('counts a rate then measured over two windows with half the noise of one', () => {
    // 200 vs 260: 60^2 = 3,600 > 9 * (200 / 2 + 260) = 3,240, but not > 9 * (200 + 260) = 4,140.
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 260), 1_000), 0.5, 'one window: noise');
    const twoWindows = localRescaleRatio(0.5, rates(100, 200, 200, 260, { directiveHostWindows: 2 }), 1_000);
    assert.ok(Math.abs(twoWindows - (1 - 100 / 260)) < 1e-12, `${twoWindows}`);
    // 200 vs 250: 2,500 < 3,150 either way.
    assert.equal(localRescaleRatio(0.5, rates(100, 200, 200, 250, { directiveHostWindows: 2 }), 1_000), 0.5);
  });

  it('rescales a change within host noise when the fleet total moved the same way', () => {
    // The thin host of a 3x step: 40 calls then (two windows), 60 now: 20 < 3 * sqrt(20 + 60).
    const step = rates(20_000, 40_000, 40, 60, { directiveHostWindows: 2 });
    assert.equal(localRescaleRatio(0.5, step, 1_000), 0.5, 'no earlier fleet total: noise');
    // The fleet total rose from 17,000 to 40,000 between directives: keep the allowance 40 * 0.5.
    const rose = localRescaleRatio(0.5, { ...step, previousGlobalOfferedRps: 17_000 }, 1_000);
    assert.ok(Math.abs(rose - (1 - 20 / 60)) < 1e-12, `${rose}`);
    // Not when the fleet moved the other way, less than FLEET_MOVE_RATIO, or the host barely moved.
    assert.equal(
      localRescaleRatio(0.5, { ...step, previousGlobalOfferedRps: 60_000 }, 1_000),
      0.5,
      'opposite',
    );
    const small = 40_000 / (1 + FLEET_MOVE_RATIO * 0.9);
    assert.equal(
      localRescaleRatio(0.5, { ...step, previousGlobalOfferedRps: small }, 1_000),
      0.5,
      'small move',
    );
    // 40 vs 47: 7 < FLEET_LOCAL_Z * sqrt(20 + 47).
    assert.ok(7 < FLEET_LOCAL_Z * Math.sqrt(67));
    const still = { ...step, previousGlobalOfferedRps: 17_000, recentOfferedRps: 47 };
    assert.equal(localRescaleRatio(0.5, still, 1_000), 0.5, 'host within one standard deviation');
    // A tiny fleet moving by 50% is still Poisson noise: 4 vs 6 calls.
    const tiny = rates(3, 6, 2, 3, { previousGlobalOfferedRps: 4 });
    assert.equal(localRescaleRatio(0.5, tiny, 1_000), 0.5, 'fleet total within noise');
  });

  it('rescales with the fleet total between directives, from the directives a host receives', async () => {
    const run = async (stepOfferedRps: number) => {
      const h = harness();
      h.aggregator.set('api', { dropRatio: 0, limitRps: 20_000, offeredRps: 15_000, ttlMs: 10_000 });
      await windowOf(h, 20);
      await windowOf(h, 20);
      await windowOf(h, 60);
      // The next reply: the fleet total of the step's first window; this host's 40 then, 60 now.
      h.aggregator.set('api', {
        dropRatio: 0.5,
        limitRps: 20_000,
        offeredRps: stepOfferedRps,
        ttlMs: 10_000,
      });
      return windowOf(h, 60);
    };
    const rose = await run(40_000);
    assert.equal(rose.dropRatio, 0.5);
    assert.ok(Math.abs(rose.effectiveRatio - (1 - 20 / 60)) < 1e-9, `${rose.effectiveRatio}`);
    const wobble = await run(17_000);
    assert.equal(wobble.effectiveRatio, 0.5, 'a total 13% up is not a fleet-wide change');
  });

  it('cuts a host spike at its next report, with no new directive, and lets go when it ends', async () => {
    const h = await directed(200, { dropRatio: 0.5, limitRps: 100, offeredRps: 200 });
    let snap = h.limiter.snapshot().buckets[0]!;
    assert.equal(snap.effectiveRatio, 0.5, 'same rate as the directive saw: its ratio as is');
    snap = await windowOf(h, 800);
    assert.equal(snap.dropRatio, 0.5, 'the held directive is unchanged');
    assert.ok(Math.abs(snap.effectiveRatio - 0.875) < 1e-6, `${snap.effectiveRatio}`);
    snap = await windowOf(h, 200);
    assert.equal(snap.effectiveRatio, 0.5);
    snap = await windowOf(h, 230);
    assert.equal(snap.effectiveRatio, 0.5, 'noise is not rescaled');
    snap = await windowOf(h, 50);
    assert.equal(snap.effectiveRatio, 0, 'under its allowance the host drops nothing');
  });

  it('also applies under the limit (ratio 0), from the host share of the limit', async () => {
    const h = await directed(50, { dropRatio: 0, limitRps: 100, offeredRps: 50 });
    const snap = await windowOf(h, 400);
    assert.ok(Math.abs(snap.effectiveRatio - 0.75) < 1e-6, `${snap.effectiveRatio}`);
  });

  it('is off with localRescale: false, and never applies to a stale directive', async () => {
    const off = await directed(
      200,
      { dropRatio: 0.5, limitRps: 100, offeredRps: 200 },
      { localRescale: false },
    );
    assert.equal((await windowOf(off, 800)).effectiveRatio, 0.5);

    const stale = harness({ stalePolicy: { kind: 'hold' } });
    stale.aggregator.set('api', { dropRatio: 0.5, limitRps: 100, offeredRps: 200, ttlMs: 500 });
    await windowOf(stale, 200);
    stale.aggregator.directives.clear();
    const snap = await windowOf(stale, 800);
    assert.equal(snap.stale, true);
    assert.equal(snap.effectiveRatio, 0.5, 'held, not rescaled: the stale policy decides');
  });

  it('rejects a non-boolean option', () => {
    assert.throws(
      () => harness({ localRescale: 'yes' as unknown as boolean }),
      /localRescale must be a boolean/,
    );
  });
});
