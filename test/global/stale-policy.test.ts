import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ErrorCode } from '../../src/core/errors.js';
import {
  createGlobalLimiter,
  directiveHeld,
  type StalePolicy,
  staleDropRatio,
} from '../../src/global/index.js';
import { advance, harness } from './fixtures.js';

describe('staleDropRatio', () => {
  const expiresAtMs = 10_000;
  it('hold-then-decay holds for holdMs, then decays linearly to 0 over decayMs', () => {
    const policy: StalePolicy = { holdMs: 3_000, decayMs: 10_000 };
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 9_999), 0.6);
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 10_000), 0.6);
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 12_999), 0.6);
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 13_000), 0.6);
    assert.ok(Math.abs(staleDropRatio(policy, 0.6, expiresAtMs, 15_500) - 0.45) < 1e-12);
    assert.ok(Math.abs(staleDropRatio(policy, 0.6, expiresAtMs, 18_000) - 0.3) < 1e-12);
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 23_000), 0);
    assert.equal(staleDropRatio(policy, 0.6, expiresAtMs, 1e12), 0);
    assert.equal(staleDropRatio({ holdMs: 0, decayMs: 0 }, 0.6, expiresAtMs, 10_000), 0);
  });

  it('hold keeps the ratio forever; open drops it at expiry', () => {
    assert.equal(staleDropRatio({ kind: 'hold' }, 0.6, expiresAtMs, 1e12), 0.6);
    assert.equal(staleDropRatio({ kind: 'open' }, 0.6, expiresAtMs, 9_999), 0.6);
    assert.equal(staleDropRatio({ kind: 'open' }, 0.6, expiresAtMs, 10_000), 0);
  });

  it('directiveHeld follows the same phases', () => {
    assert.equal(directiveHeld({ holdMs: 3_000, decayMs: 1 }, expiresAtMs, 12_999), true);
    assert.equal(directiveHeld({ holdMs: 3_000, decayMs: 1 }, expiresAtMs, 13_000), false);
    assert.equal(directiveHeld({ kind: 'hold' }, expiresAtMs, 1e12), true);
    assert.equal(directiveHeld({ kind: 'open' }, expiresAtMs, 10_000), false);
  });

  it('validates the policy option', () => {
    for (const stalePolicy of [
      { holdMs: -1, decayMs: 1 },
      { holdMs: 1, decayMs: Number.NaN },
      { kind: 'sometimes' },
    ] as StalePolicy[]) {
      assert.throws(() => createGlobalLimiter({ reporterId: 'h', clients: [], stalePolicy }), {
        code: ErrorCode.InvalidOption,
      });
    }
  });
});

describe('stale policy on a live limiter (reporter tick evaluates it, the hot path only reads it)', () => {
  /** Directive of ratio 0.5 with TTL 3 s at t0, then the aggregator goes away; ratios sampled at each tick. */
  async function ratiosAfterOutage(stalePolicy: StalePolicy | undefined, sampleAtMs: number[]) {
    const h = harness(stalePolicy ? { stalePolicy } : {});
    const handle = h.limiter.bucket('b');
    h.aggregator.set('b', { dropRatio: 0.5, ttlMs: 3_000 });
    await h.flush();
    assert.equal(handle.effectiveRatio, 0.5);
    h.network.partition('agg-1', true);
    h.limiter.start();
    const t0 = h.clock.nowMs();
    const ratios: number[] = [];
    for (const atMs of sampleAtMs) {
      await advance(h.clock, t0 + atMs - h.clock.nowMs(), 100);
      ratios.push(Math.round(handle.effectiveRatio * 1e9) / 1e9);
    }
    const snap = h.limiter.snapshot().buckets[0]!;
    await h.limiter.stop();
    return { ratios, snap, handle };
  }

  it('default: holds 3 intervals after the TTL, then decays to 0 over 10 s', async () => {
    const { ratios, snap } = await ratiosAfterOutage(
      undefined,
      [2_000, 3_000, 6_000, 7_000, 11_000, 16_000, 30_000],
    );
    // TTL ends at 3 s, hold until 6 s, then 0.5 * (1 - elapsed / 10 s).
    assert.deepEqual(ratios, [0.5, 0.5, 0.5, 0.45, 0.25, 0, 0]);
    assert.equal(snap.stale, true);
    assert.equal(snap.dropRatio, 0.5, 'the held directive is kept for metrics');
  });

  it('hold-then-decay with explicit values', async () => {
    const { ratios } = await ratiosAfterOutage(
      { holdMs: 1_000, decayMs: 4_000 },
      [3_000, 4_000, 5_000, 6_000, 8_000],
    );
    assert.deepEqual(ratios, [0.5, 0.5, 0.375, 0.25, 0]);
  });

  it('hold keeps the ratio through a long outage', async () => {
    const { ratios } = await ratiosAfterOutage({ kind: 'hold' }, [2_000, 3_000, 60_000]);
    assert.deepEqual(ratios, [0.5, 0.5, 0.5]);
  });

  it('open drops the ratio to 0 at the first tick after the TTL', async () => {
    const { ratios, handle } = await ratiosAfterOutage({ kind: 'open' }, [2_000, 3_000, 4_000]);
    assert.deepEqual(ratios, [0.5, 0, 0]);
    for (let i = 0; i < 1000; i++) assert.equal(handle.allow(), true, 'fails open');
  });

  it('a fresh directive after the outage replaces the decayed ratio at once', async () => {
    const h = harness();
    const handle = h.limiter.bucket('b');
    h.aggregator.set('b', { dropRatio: 0.5, ttlMs: 1_000 });
    await h.flush();
    await advance(h.clock, 20_000, 1000);
    h.network.partition('agg-1', true);
    h.limiter.start();
    await advance(h.clock, 30_000, 500);
    assert.equal(handle.effectiveRatio, 0);
    h.network.partition('agg-1', false);
    h.aggregator.set('b', { dropRatio: 0.2, ttlMs: 1_000 });
    await advance(h.clock, 1_000, 100);
    assert.equal(handle.effectiveRatio, 0.2);
    await h.limiter.stop();
  });
});
