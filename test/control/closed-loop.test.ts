import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { correctedRatioPolicy, createRatioPolicy, plainRatioPolicy } from '../../src/control/ratio-policy.js';
import { runClosedLoop, standardScenarios } from './closed-loop-harness.js';

/**
 * The loop closed in virtual time with the real controller and 20 simulated hosts (Poisson load,
 * skewed across hosts, each reporting at its own phase). Thresholds are loose enough for any seed
 * and tight enough to catch a broken loop; bench/control.bench.ts prints the full comparison.
 */
const [steady, bursty, nonCompliant, ramp, step] = standardScenarios(100);
/** The policy this small loop favours; the fleet simulator does not (docs/accuracy.md). */
const corrected = () => correctedRatioPolicy({ gain: 0.2, maxCorrection: 0.5 });

describe('closed loop', () => {
  it('every policy holds steady 1.5x overload at the limit (mean error within 1.5%)', () => {
    for (const policy of [plainRatioPolicy(), createRatioPolicy({ kind: 'ewma', alpha: 0.5 }), corrected()]) {
      const result = runClosedLoop(steady!, policy, 11);
      assert.ok(Math.abs(result.meanError) < 0.015, `${result.policy}: mean error ${result.meanError}`);
      assert.ok(result.rmsError < 0.08, `${result.policy}: rms ${result.rmsError}`);
    }
  });

  it('plain keeps the bias of hosts that ignore directives; corrected removes it', () => {
    const plain = runClosedLoop(nonCompliant!, plainRatioPolicy(), 12);
    const correctedResult = runClosedLoop(nonCompliant!, corrected(), 12);
    assert.ok(plain.meanError > 0.03, `plain overshoots: ${plain.meanError}`);
    assert.ok(Math.abs(correctedResult.meanError) < 0.015, `corrected: ${correctedResult.meanError}`);
  });

  it('corrected shrinks the overshoot of a ramp and the bias of bursty load', () => {
    const plainRamp = runClosedLoop(ramp!, plainRatioPolicy(), 13);
    const correctedRamp = runClosedLoop(ramp!, corrected(), 13);
    assert.ok(
      correctedRamp.meanError < plainRamp.meanError - 0.01,
      `${correctedRamp.meanError} vs ${plainRamp.meanError}`,
    );
    let plainBias = 0;
    let correctedBias = 0;
    for (const seed of [1, 2, 3]) {
      plainBias += runClosedLoop(bursty!, plainRatioPolicy(), seed).meanError / 3;
      correctedBias += runClosedLoop(bursty!, corrected(), seed).meanError / 3;
    }
    assert.ok(Math.abs(correctedBias) < Math.abs(plainBias), `${correctedBias} vs ${plainBias}`);
  });

  it('a step overload is cut within three intervals (the loop lag) and stays near the limit', () => {
    const result = runClosedLoop(step!, createRatioPolicy(), 14); // the default: plain
    const errors = result.series.slice(29).map((s) => s.admitted / 1000 - 1);
    assert.ok(errors[0]! > 0.3, 'the first overloaded interval passes uncut (no directive yet)');
    for (const e of errors.slice(3, 30)) assert.ok(Math.abs(e) < 0.12, `error ${e} after the lag`);
  });
});
