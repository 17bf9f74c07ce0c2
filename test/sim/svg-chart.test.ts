import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { runSimulation } from '../../src/sim/run-simulation.js';
import { parseScenario } from '../../src/sim/scenario.js';
import { formatSummaryTable } from '../../src/sim/summary-table.js';
import { LEGEND_CHAR_WIDTH, renderSimChart } from '../../src/sim/svg-chart.js';

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

describe('sim chart legends (issue #35)', () => {
  it('fit inside the image, and the drop-ratio panel has its own', async () => {
    const scenario = parseScenario({
      name: 'legend',
      seconds: 10,
      hosts: 4,
      zones: 1,
      buckets: [{ key: 'a', limitRps: 10, offeredRps: [[0, 1000]] }],
    });
    const result = await runSimulation(scenario, { seed: 1 });
    const svg = renderSimChart(result);
    const width = Number(/^<svg [^>]*width="(\d+)"/.exec(svg)![1]);
    const legends = [
      ...svg.matchAll(/<text class="legend" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)<\/text>/g),
    ].map((m) => ({ x: Number(m[1]), y: Number(m[2]), label: m[3]! }));
    for (const { x, label } of legends) {
      assert.ok(
        x + label.length * LEGEND_CHAR_WIDTH <= width,
        `"${label}" ends past the image's ${width} px`,
      );
    }
    assert.ok(legends.some((l) => l.label === 'admitted: spillway + burst guard'));
    // The ratio panel starts below the rate panel (y > 336): its legend names every variant that drops.
    const ratioLabels = legends.filter((l) => l.y > 336).map((l) => l.label);
    assert.deepEqual(ratioLabels, [
      'ideal (offered over the limit)',
      'applied: plain formula',
      'applied: spillway (defaults)',
      'applied: spillway + burst guard',
    ]);
  });

  it('the terminal table says where its columns are defined', async () => {
    const scenario = parseScenario({
      name: 't',
      seconds: 2,
      hosts: 1,
      zones: 1,
      buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 2]] }],
    });
    const table = formatSummaryTable(await runSimulation(scenario, { variants: ['exact'], seed: 1 }));
    assert.match(table, /docs\/accuracy\.md, "How it is measured"/);
    assert.ok(readFileSync('docs/accuracy.md', 'utf8').includes('\n## How it is measured\n'));
  });
});
