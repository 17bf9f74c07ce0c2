import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { presetScenario } from '../../src/sim/presets.js';
import { runSimulation, type SimResult } from '../../src/sim/run-simulation.js';

const withoutCost = (result: SimResult) => ({ ...result, cost: undefined });

describe('runSimulation determinism', () => {
  it('the same seed gives the same result; another seed does not', async () => {
    const options = { hosts: 30, zones: 3, seconds: 8, variants: ['exact', 'plain', 'guard'] as const };
    const scenario = presetScenario('lossy-reports')!;
    const a = await runSimulation(scenario, { ...options, seed: 5 });
    const b = await runSimulation(scenario, { ...options, seed: 5 });
    const c = await runSimulation(scenario, { ...options, seed: 6 });
    assert.deepEqual(withoutCost(a), withoutCost(b));
    assert.notDeepEqual(withoutCost(a).series, withoutCost(c).series);
    // Every variant saw the very same requests.
    assert.ok(a.cost.plain!.allowCalls > 0);
    assert.equal(a.cost.plain!.allowCalls, a.cost.exact!.allowCalls);
    assert.equal(a.cost.guard!.allowCalls, a.cost.exact!.allowCalls);
  });

  it('host churn and aggregator faults replay identically', async () => {
    const options = { hosts: 40, zones: 4, seconds: 25, seed: 9, variants: ['spillway'] as const };
    for (const name of ['host-churn', 'aggregator-outage']) {
      const a = await runSimulation(presetScenario(name)!, options);
      const b = await runSimulation(presetScenario(name)!, options);
      assert.deepEqual(withoutCost(a), withoutCost(b), name);
    }
  });
});
