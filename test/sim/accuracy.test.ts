import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { presetScenario } from '../../src/sim/presets.js';
import { runSimulation, type SimResult } from '../../src/sim/run-simulation.js';
import { parseScenario } from '../../src/sim/scenario.js';
import type { VariantName } from '../../src/sim/variants.js';

/**
 * The accuracy targets on small fleets (100 hosts, fixed seeds), so a change that worsens the
 * loop fails CI. Every target here is asserted; docs/accuracy.md has the full-size figures and the
 * reasons.
 */
const HOSTS = 100;

function focus(result: SimResult, variant: VariantName) {
  return result.summary.find((s) => s.variant === variant)!.focus;
}

function convergedAfter(result: SimResult, variant: VariantName, atS: number): number {
  const entry = focus(result, variant).convergence.find((c) => c.atS === atS);
  assert.ok(entry, `no change at ${atS} s`);
  return entry.convergedAfterS ?? Number.POSITIVE_INFINITY;
}

const steadyRun = runSimulation(presetScenario('steady-1.5x')!, { hosts: HOSTS, seconds: 20, seed: 11 });
// step-3x compressed: 0.75x, 3x from 10 s, 0.75x again from 20 s.
const stepScenario = parseScenario({
  name: 'step-3x-short',
  seconds: 28,
  buckets: [
    {
      key: 'api:search',
      limitRps: 20_000,
      offeredRps: [
        [0, 15_000],
        [10, 15_000],
        [10, 60_000],
        [20, 60_000],
        [20, 15_000],
      ],
    },
  ],
});
const stepRun = runSimulation(stepScenario, { hosts: HOSTS, seed: 12 });
// Swallow here; each test awaits the promise it needs and fails with the error.
steadyRun.catch(() => {});
stepRun.catch(() => {});

describe('accuracy targets (100 hosts)', () => {
  it('the exact baseline admits exactly min(offered, limit) and converges in the first full window', async () => {
    const result = await stepRun;
    const exact = focus(result, 'exact');
    assert.equal(exact.steadyErrorPct, 0);
    assert.equal(exact.peakOvershootPct, 0);
    assert.equal(convergedAfter(result, 'exact', 10), 1);
  });

  it('steady 1.5x: the plain formula admits within 2% of the limit', async () => {
    const plain = focus(await steadyRun, 'plain');
    assert.ok(
      plain.steadyErrorPct !== null && Math.abs(plain.steadyErrorPct) <= 2,
      `${plain.steadyErrorPct}%`,
    );
  });

  it('steady 1.5x: Spillway with its defaults, and with the burst guard, admits within 2% of the limit', async () => {
    for (const variant of ['spillway', 'guard'] as const) {
      const error = focus(await steadyRun, variant).steadyErrorPct;
      assert.ok(error !== null && Math.abs(error) <= 2, `${variant}: ${error}%`);
    }
  });

  it('steady 1.5x: every variant keeps its error bounded (regression bound)', async () => {
    const result = await steadyRun;
    for (const variant of ['plain', 'spillway', 'guard'] as const) {
      const error = focus(result, variant).steadyErrorPct;
      assert.ok(error !== null && Math.abs(error) <= 8, `${variant}: ${error}%`);
    }
  });

  it('3x step: the loop gets back within 5% (regression bound: 6 s for plain)', async () => {
    const result = await stepRun;
    assert.ok(convergedAfter(result, 'plain', 10) <= 6, `plain: ${convergedAfter(result, 'plain', 10)} s`);
    assert.ok(
      convergedAfter(result, 'plain', 20) <= 6,
      `plain down: ${convergedAfter(result, 'plain', 20)} s`,
    );
  });

  // At 1,000 hosts too since local rescale follows fleet-wide moves (median 2.9 s over 12 seeds,
  // docs/accuracy.md); the test below holds that fleet to a regression bound.
  it('3x step (100 hosts): Spillway (recompute on report, local rescale) gets within 5% in <= 3 s', async () => {
    const result = await stepRun;
    // The plain variant (the formula alone, no local rescale) keeps the regression bound above.
    for (const variant of ['spillway', 'guard'] as const) {
      assert.ok(
        convergedAfter(result, variant, 10) <= 3,
        `${variant}: ${convergedAfter(result, variant, 10)} s`,
      );
    }
  });

  it('3x step (1,000 hosts): Spillway gets back within 5% (regression bound: 3.5 s)', async () => {
    // 20 calls per host a second: a host's own windows cannot tell the step from noise in time,
    // local rescale's fleet-wide test carries it. This shorter scenario: 3.3 s for seed 1, 2.9 and
    // 3.1 s for seeds 2 and 3 (4.4, 4.2, 3.9 s before). The preset's median over seeds 1-12 is
    // 2.9 s (2.4-3.1; was 4.1 s, docs/accuracy.md); one seed is a bound, not the target's proof.
    const result = await runSimulation(stepScenario, {
      hosts: 1_000,
      seed: 1,
      variants: ['spillway'],
    });
    assert.ok(convergedAfter(result, 'spillway', 10) <= 3.5, `${convergedAfter(result, 'spillway', 10)} s`);
  });

  it('3x step: the burst guard never makes the overshoot worse', async () => {
    const result = await stepRun;
    assert.ok(focus(result, 'guard').peakOvershootPct <= focus(result, 'spillway').peakOvershootPct + 1);
  });

  it('3x step: with the default burst guard, peak overshoot <= 25%', async () => {
    // 100 hosts see 200 calls each a second, so the guard's detector trips about 60 ms after the
    // step: 4.6% here (6.8% and 4.7% for seeds 1 and 2); without the guard, 175%.
    const result = await stepRun;
    assert.ok(focus(result, 'guard').peakOvershootPct <= 25, `${focus(result, 'guard').peakOvershootPct}%`);
  });

  it('3x step (1,000 hosts): the default burst guard holds the peak overshoot to 25% at 20 calls per host a second', async () => {
    // The preset's figures are in docs/accuracy.md (18.0% peak for seed 1; 17.3-18.0% for seeds
    // 2-4). This shorter scenario at 1,000 hosts, seed 1: 18.3% peak, -0.04% steady, 3.3 s.
    const result = await runSimulation(stepScenario, { hosts: 1_000, seed: 1, variants: ['guard'] });
    const guard = focus(result, 'guard');
    assert.ok(guard.peakOvershootPct <= 25, `${guard.peakOvershootPct}%`);
    assert.ok(Math.abs(guard.steadyErrorPct!) <= 2, `steady ${guard.steadyErrorPct}%`);
    assert.ok(convergedAfter(result, 'guard', 10) <= 3.5, `${convergedAfter(result, 'guard', 10)} s`);
  });

  it('skewed hosts and a hot caller: same steady accuracy as uniform traffic (plain, defaults, guard)', async () => {
    const zipf = await runSimulation(presetScenario('zipf-hosts')!, {
      hosts: HOSTS,
      seconds: 20,
      seed: 11,
      variants: ['plain', 'spillway', 'guard'],
    });
    const hot = await runSimulation(presetScenario('hot-caller')!, {
      hosts: HOSTS,
      seconds: 20,
      seed: 11,
      variants: ['plain', 'spillway', 'guard'],
    });
    for (const variant of ['plain', 'spillway', 'guard'] as const) {
      const uniform = focus(await steadyRun, variant).steadyErrorPct!;
      for (const [name, result] of [
        ['zipf-hosts', zipf],
        ['hot-caller', hot],
      ] as const) {
        const error = focus(result, variant).steadyErrorPct!;
        assert.ok(Math.abs(error - uniform) <= 1, `${variant} ${name}: ${error}% vs uniform ${uniform}%`);
      }
    }
    // The hot caller's neighbours under their limits are not starved by it.
    const quiet = hot.summary[0]!.buckets['api:caller=c10']!;
    assert.ok(
      quiet.wronglyDropped <= quiet.offeredTotal * 0.01,
      `c10 wrongly dropped ${quiet.wronglyDropped}`,
    );
  });

  it('controller outage: hosts keep serving, and a restarted controller closes the loop again', async () => {
    const scenario = parseScenario({
      name: 'outage-short',
      seconds: 24,
      buckets: [{ key: 'api:search', limitRps: 20_000, offeredRps: [[0, 30_000]] }],
      events: [
        { atS: 8, kind: 'controller-down' },
        { atS: 14, kind: 'controller-restart' },
      ],
    });
    const result = await runSimulation(scenario, { hosts: HOSTS, seed: 13, variants: ['plain', 'spillway'] });
    const series = result.series[0]!;
    for (const variant of ['plain', 'spillway'] as const) {
      const admitted = series.admitted[variant]!;
      // 8..14 s: no directives can arrive, yet every 100 ms sample admits traffic.
      for (let sample = 80; sample < 140; sample++) assert.ok(admitted[sample]! > 0, `sample ${sample}`);
      // Target: back within 5% in <= 3 intervals.
      const afterRestart = convergedAfter(result, variant, 14);
      assert.ok(afterRestart <= 3, `${variant}: ${afterRestart} s after restart`);
    }
  });
});
