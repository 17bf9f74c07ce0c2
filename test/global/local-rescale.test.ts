import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { localRescaleRatio, RESCALE_Z } from '../../src/global/local-rescale.js';
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

describe('local rescale', () => {
  it('keeps the allowance of the directive when the host rate moves beyond noise', () => {
    // Allowance 200 * (1 - 0.5) = 100 rps; now 800 rps offered: drop 1 - 100 / 800.
    assert.equal(localRescaleRatio(0.5, 100, 200, 200, 800, 1_000), 0.875);
    // Ratio 0: the allowance is the host's share of the limit, 50 * 100 / 50.
    assert.equal(localRescaleRatio(0, 100, 50, 50, 400, 1_000), 0.75);
    // The load fell under the allowance: nothing to drop.
    assert.equal(localRescaleRatio(0.5, 100, 200, 200, 60, 1_000), 0);
  });

  it('is neutral within Poisson noise, and without a share to scale from', () => {
    // 200 vs 230 calls: |30| < 3 * sqrt(430).
    assert.equal(localRescaleRatio(0.5, 100, 200, 200, 230, 1_000), 0.5);
    const edge = 200 + RESCALE_Z * Math.sqrt(400) * 0.99;
    assert.equal(localRescaleRatio(0.5, 100, 200, 200, edge, 1_000), 0.5);
    assert.equal(localRescaleRatio(0.5, 100, 200, 0, 800, 1_000), 0.5, 'no rate then');
    assert.equal(localRescaleRatio(0, 0, 200, 200, 800, 1_000), 0, 'no limit');
    assert.equal(localRescaleRatio(0, 100, 0, 200, 800, 1_000), 0, 'no fleet total');
    // The same rates over a 100 ms window are 20 vs 80 calls: still beyond noise (60 > 3 * 10).
    assert.equal(localRescaleRatio(0.5, 100, 200, 200, 800, 100), 0.875);
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
