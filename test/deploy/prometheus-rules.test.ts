import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parse } from 'yaml';
import { exportedMetricNames, isExported } from './exported-metrics.js';

/**
 * deploy/prometheus/alerts.yml: valid rules (`promtool check rules`), alerts that fire and stay quiet
 * when its cases say (`promtool test rules alerts.test.yml`), and only metrics the processes export.
 * promtool comes with Debian's `prometheus` package, which .ci/run installs; without it the two
 * promtool checks are skipped (the metric names are still checked).
 */
const DIR = join(import.meta.dirname, '../../deploy/prometheus');
const PROMTOOL = spawnSync('promtool', ['--version']).status === 0 ? 'promtool' : undefined;
const promtoolMissing =
  PROMTOOL === undefined ? 'promtool not installed (apt-get install prometheus)' : false;

interface Rule {
  alert: string;
  expr: string;
  for?: string;
  labels: { severity: string };
  annotations: { summary: string; description: string };
}

function promtool(...args: string[]): { status: number | null; output: string } {
  const result = spawnSync(PROMTOOL!, args, { cwd: DIR, encoding: 'utf8', timeout: 60_000 });
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

describe('deploy/prometheus/alerts.yml', () => {
  const text = readFileSync(join(DIR, 'alerts.yml'), 'utf8');
  const rules = (parse(text) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

  it('is valid for promtool', { skip: promtoolMissing }, () => {
    const { status, output } = promtool('check', 'rules', 'alerts.yml');
    assert.equal(status, 0, output);
    assert.match(output, new RegExp(`SUCCESS: ${rules.length} rules found`));
  });

  it("fires, and stays quiet, as alerts.test.yml's cases say", { skip: promtoolMissing }, () => {
    const { status, output } = promtool('test', 'rules', 'alerts.test.yml');
    assert.equal(status, 0, output);
  });

  it('names only metrics the processes export, in expressions and in the text operators read', () => {
    const exported = exportedMetricNames();
    const named = new Set([...text.matchAll(/\bspillway_[a-z0-9_]+/g)].map((m) => m[0]));
    assert.ok(named.size >= 15, `${named.size} metrics named`);
    for (const name of named) assert.ok(isExported(exported, name), `${name} is exported by src/`);
  });

  it('gives every alert a severity the routing knows, a summary and a description', () => {
    const names = new Set<string>();
    for (const rule of rules) {
      assert.ok(!names.has(rule.alert), `${rule.alert} is defined once`);
      names.add(rule.alert);
      assert.ok(['page', 'warning', 'info'].includes(rule.labels.severity), rule.alert);
      assert.ok(rule.annotations.summary.length > 0 && rule.annotations.description.length > 0, rule.alert);
    }
    // The loss of enforcement pages; so does a controller that is gone.
    assert.equal(rules.find((r) => r.alert === 'SpillwayControllerDown')?.labels.severity, 'page');
    assert.equal(rules.find((r) => r.alert === 'SpillwayDirectivesStaleEverywhere')?.labels.severity, 'page');
  });

  it('every alert has a case in alerts.test.yml', () => {
    const tests = readFileSync(join(DIR, 'alerts.test.yml'), 'utf8');
    const tested = new Set([...tests.matchAll(/alertname: (\w+)/g)].map((m) => m[1]!));
    assert.deepEqual(
      rules.map((r) => r.alert).filter((alert) => !tested.has(alert)),
      [],
    );
  });
});
