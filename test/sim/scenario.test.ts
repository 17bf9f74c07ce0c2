import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { presetNames, presetScenario } from '../../src/sim/presets.js';
import { changeTimesS, limitAt, loadScenarioFile, parseScenario, rateAt } from '../../src/sim/scenario.js';

describe('scenarios', () => {
  it('every preset parses, with a description and its focus bucket among its buckets', () => {
    assert.ok(presetNames.length >= 10);
    for (const name of presetNames) {
      const scenario = presetScenario(name)!;
      assert.equal(scenario.name, name);
      assert.ok(scenario.description.length > 20, name);
      assert.ok(
        scenario.buckets.some((b) => b.key === scenario.focusBucket),
        name,
      );
    }
    assert.equal(presetScenario('no-such'), undefined);
  });

  it('fills defaults and rejects malformed input with ERR_SPILLWAY_INVALID_CONFIG', () => {
    const scenario = parseScenario({
      name: 'x',
      buckets: [{ key: 'a', limitRps: 10, offeredRps: [[0, 5]] }],
    });
    assert.equal(scenario.hosts, 1000);
    assert.equal(scenario.zones, 10);
    assert.equal(scenario.intervalMs, 1000);
    assert.equal(scenario.focusBucket, 'a');
    const bad: unknown[] = [
      { name: 'x', buckets: [] },
      { name: 'x', buckets: [{ key: 'a', limitRps: -1, offeredRps: [[0, 5]] }] },
      {
        name: 'x',
        buckets: [
          {
            key: 'a',
            limitRps: 1,
            offeredRps: [
              [5, 5],
              [1, 5],
            ],
          },
        ],
      },
      { name: 'x', typo: 1, buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }] },
      { name: 'x', focusBucket: 'b', buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }] },
      {
        name: 'x',
        events: [{ atS: 1, kind: 'explode' }],
        buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }],
      },
      { name: 'x', seconds: 1.005, buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }] },
      // The name names the result files: no directories, no way out of --out.
      { name: 'team/checkout', buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }] },
      { name: '../x', buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 5]] }] },
      // 1e15 requests a second would run for ever, one allow() call each.
      { name: 'x', buckets: [{ key: 'a', limitRps: 1, offeredRps: [[0, 1e15]] }] },
    ];
    for (const input of bad) {
      assert.throws(
        () => parseScenario(input),
        (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'),
      );
    }
  });

  it('interpolates rates linearly, steps on repeated times, and lists change instants', () => {
    const scenario = presetScenario('step-3x')!;
    const points = scenario.buckets[0]!.offeredRps;
    assert.equal(rateAt(points, 0), 15_000);
    assert.equal(rateAt(points, 19.99), 15_000);
    assert.equal(rateAt(points, 20), 60_000);
    assert.equal(rateAt(points, 40), 15_000);
    assert.equal(
      rateAt(
        [
          [0, 0],
          [10, 100],
        ],
        2.5,
      ),
      25,
    );
    assert.deepEqual(changeTimesS(scenario), [0, 20, 40]);
    const limited = parseScenario({
      name: 'l',
      buckets: [{ key: 'a', limitRps: 10, offeredRps: [[0, 5]] }],
      events: [{ atS: 5, kind: 'limit', bucket: 'a', limitRps: 20 }],
    });
    assert.equal(limitAt(limited, 'a', 4.9), 10);
    assert.equal(limitAt(limited, 'a', 5), 20);
  });

  it('refuses an unknown field at any depth, naming it before what it leaves out (issue #35)', () => {
    const bucket = { key: 'a', limitRps: 1, offeredRps: [[0, 5]] };
    const cases: [unknown, string][] = [
      [
        { name: 'x', buckets: [{ key: 'a', limt: 1, offeredRps: [[0, 5]] }] },
        'x: buckets[0]: unknown field "limt"; did you mean "limitRps"?',
      ],
      [
        { name: 'x', buckets: [bucket], network: { delay: 5 } },
        'x: network: unknown field "delay"; did you mean "delayMs"?',
      ],
      [
        { name: 'x', buckets: [bucket], events: [{ atS: 1, kind: 'controller-down', zone: 1 }] },
        'x: events[0]: unknown field "zone"',
      ],
    ];
    for (const [input, message] of cases) {
      assert.throws(
        () => parseScenario(input, 'x'),
        (error) => {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'));
          assert.ok(error.message.startsWith(message), error.message);
          return true;
        },
      );
    }
  });

  it("points at the line and column of a scenario file's error", () => {
    const dir = mkdtempSync(join(tmpdir(), 'spillway-sim-'));
    const path = join(dir, 'typo.yaml');
    writeFileSync(
      path,
      'name: typo\nbuckets:\n  - key: a\n    limitRps: 10\n    offeredRps: [[0, 5]]\nnetwork:\n  lossrate: 0.1\n',
    );
    assert.throws(
      () => loadScenarioFile(path),
      (error) => {
        assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'));
        assert.equal(
          error.message,
          `${path}:7:3: network: unknown field "lossrate"; did you mean "lossRate"? (allowed: delayMs, jitterMs, lossRate)`,
        );
        return true;
      },
    );
  });

  it('loads JSON and YAML files and names the file in errors', () => {
    const dir = mkdtempSync(join(tmpdir(), 'spillway-sim-'));
    const yamlPath = join(dir, 'custom.yaml');
    writeFileSync(
      yamlPath,
      [
        'name: custom',
        'hosts: 50',
        'buckets:',
        '  - key: api:search',
        '    limitRps: 1000',
        '    offeredRps: [[0, 1500], [10, 1500], [10, 3000]]',
        'events:',
        '  - { atS: 5, kind: controller-down }',
        '',
      ].join('\n'),
    );
    const scenario = loadScenarioFile(yamlPath);
    assert.equal(scenario.hosts, 50);
    assert.equal(scenario.events[0]!.kind, 'controller-down');
    const jsonPath = join(dir, 'custom.json');
    writeFileSync(jsonPath, JSON.stringify({ ...scenario, name: 'from-json' }));
    assert.equal(loadScenarioFile(jsonPath).name, 'from-json');
    writeFileSync(jsonPath, '{"name": "broken", "buckets": []}');
    assert.throws(
      () => loadScenarioFile(jsonPath),
      new RegExp(jsonPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')),
    );
  });
});
