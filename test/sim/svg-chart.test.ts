import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { runSimulation } from '../../src/sim/run-simulation.js';
import { parseScenario } from '../../src/sim/scenario.js';
import { renderSimChart } from '../../src/sim/svg-chart.js';

describe('sim chart', () => {
  it('draws a run of more samples than a function call takes arguments', async () => {
    // 15,000 s at 100 ms samples: 150,000 values per series, past what Math.max(...values) takes.
    const scenario = parseScenario({
      name: 'long',
      seconds: 15_000,
      tickMs: 100,
      hosts: 1,
      zones: 1,
      buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 2]] }],
    });
    const result = await runSimulation(scenario, { variants: ['exact'], seed: 1 });
    assert.equal(result.series[0]!.offered.length, 150_000);
    const svg = renderSimChart(result);
    assert.match(svg, /^<svg /);
  });

  it('refuses a run whose last sample would be partial', async () => {
    const scenario = parseScenario({
      name: 'partial',
      seconds: 2.05,
      hosts: 1,
      zones: 1,
      buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 2]] }],
    });
    await assert.rejects(
      async () => runSimulation(scenario, { variants: ['exact'], seed: 1 }),
      (error) =>
        isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION') &&
        /whole number of samples/.test(String(error)),
    );
  });
});
