import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  correctedRatioPolicy,
  createRatioPolicy,
  DEFAULT_RATIO_POLICY,
  ewmaRatioPolicy,
  plainRatioPolicy,
  type RatioPolicy,
} from '../../src/control/ratio-policy.js';
import { isSpillwayError } from '../../src/core/errors.js';

/**
 * A deterministic loop: `compliance` of the offered load obeys the ratio from the previous tick,
 * the rest is admitted regardless. Returns admitted / limit per tick.
 */
function loop(
  policy: RatioPolicy,
  ticks: number,
  offered: number,
  limit: number,
  compliance: number,
): number[] {
  const state = policy.createState();
  let ratio = 0;
  const out: number[] = [];
  for (let t = 0; t < ticks; t++) {
    const admitted = offered * compliance * (1 - ratio) + offered * (1 - compliance);
    out.push(admitted / limit);
    ratio = policy.nextDropRatio(state, { offeredRps: offered, admittedRps: admitted, limitRps: limit });
  }
  return out;
}

describe('ratio policies', () => {
  it('plain: the textbook ratio, no memory', () => {
    const policy = plainRatioPolicy();
    const state = policy.createState();
    assert.equal(policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 2000, limitRps: 1000 }), 0.5);
    assert.equal(policy.nextDropRatio(state, { offeredRps: 500, admittedRps: 500, limitRps: 1000 }), 0);
  });

  it('plain keeps a steady-state error when part of the load ignores directives; corrected removes it', () => {
    const plain = loop(plainRatioPolicy(), 60, 1500, 1000, 0.9);
    assert.ok(Math.abs(plain.at(-1)! - 1.05) < 1e-9, `plain settles at +5%: ${plain.at(-1)}`);
    const corrected = loop(correctedRatioPolicy({ gain: 0.2, maxCorrection: 0.5 }), 60, 1500, 1000, 0.9);
    assert.ok(Math.abs(corrected.at(-1)! - 1) < 1e-3, `corrected settles at the limit: ${corrected.at(-1)}`);
  });

  it('corrected: does not integrate while under the limit or in the first overloaded ticks (anti-windup)', () => {
    const policy = correctedRatioPolicy({ gain: 0.5, maxCorrection: 0.5 });
    const state = policy.createState();
    for (let t = 0; t < 20; t++)
      policy.nextDropRatio(state, { offeredRps: 100, admittedRps: 100, limitRps: 1000 });
    assert.equal(state.correction, 0);
    // First two overloaded ticks measure windows before any ratio applied: admitted = offered.
    policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 2000, limitRps: 1000 });
    policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 2000, limitRps: 1000 });
    assert.equal(state.correction, 0);
    policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 1200, limitRps: 1000 });
    assert.ok(Math.abs(state.correction - -0.1) < 1e-12);
  });

  it('corrected: the correction is bounded and decays once the bucket is under its limit', () => {
    const policy = correctedRatioPolicy({ gain: 1, maxCorrection: 0.25 });
    const state = policy.createState();
    for (let t = 0; t < 10; t++)
      policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 2000, limitRps: 1000 });
    assert.equal(state.correction, -0.25);
    const ratio = policy.nextDropRatio(state, { offeredRps: 2000, admittedRps: 2000, limitRps: 1000 });
    assert.ok(Math.abs(ratio - (1 - 750 / 2000)) < 1e-12);
    policy.nextDropRatio(state, { offeredRps: 500, admittedRps: 500, limitRps: 1000 });
    assert.equal(Math.abs(state.correction), 0, 'decayed to 0 with gain 1');
  });

  it('ewma: smooths offered, so a one-tick spike moves the ratio only by alpha', () => {
    const policy = ewmaRatioPolicy(0.5);
    const state = policy.createState();
    assert.equal(policy.nextDropRatio(state, { offeredRps: 1000, admittedRps: 1000, limitRps: 1000 }), 0);
    const ratio = policy.nextDropRatio(state, { offeredRps: 3000, admittedRps: 3000, limitRps: 1000 });
    assert.equal(ratio, 0.5); // smoothed offered 2000
  });

  it('createRatioPolicy builds every kind, defaults to the measured choice, rejects bad parameters', () => {
    assert.deepEqual(createRatioPolicy().spec, DEFAULT_RATIO_POLICY);
    assert.deepEqual(DEFAULT_RATIO_POLICY, { kind: 'plain' });
    assert.equal(createRatioPolicy().stateless, true, 'the controller may recompute it on every report');
    assert.notEqual(createRatioPolicy({ kind: 'ewma', alpha: 0.5 }).stateless, true);
    assert.notEqual(correctedRatioPolicy({ gain: 0.2, maxCorrection: 0.5 }).stateless, true);
    assert.equal(createRatioPolicy({ kind: 'plain' }).spec.kind, 'plain');
    assert.equal(createRatioPolicy({ kind: 'ewma', alpha: 0.3 }).spec.kind, 'ewma');
    assert.throws(
      () => correctedRatioPolicy({ gain: 0, maxCorrection: 0.5 }),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
    );
    assert.throws(
      () => ewmaRatioPolicy(1.5),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'),
    );
  });
});
