import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { AUTO_TUNE_MARKER, createAutoTuner } from '../../src/control/tuning/auto-tuner.js';
import { DAY_MS } from '../../src/control/tuning/history-store.js';
import { createMemoryHistoryStore } from '../../src/control/tuning/memory-history-store.js';
import { ManualClock } from '../../src/core/clock.js';
import { NOW_MS, recordDays, TODAY_MS } from './generated-history.js';

const dir = mkdtempSync(join(tmpdir(), 'spillway-auto-tuner-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const LIMITS = `version: 1
buckets:
  - key: auto
    limitRps: 1000 # opted in
    tuning: { auto: true }
  - key: manual
    limitRps: 1000
`;

function limitOf(path: string, key: string): number | undefined {
  return parseLimitsConfig(readFileSync(path, 'utf8')).buckets.find((b) => b.key === key)?.limitRps;
}

describe('auto tuner', () => {
  it('applies opted-in proposals once per UTC day, leaves the others for review', async () => {
    const path = join(dir, 'limits.yaml');
    writeFileSync(path, LIMITS);
    const store = createMemoryHistoryStore();
    recordDays(store, 'auto', 28, () => 1000);
    recordDays(store, 'manual', 28, () => 1000);
    const clock = new ManualClock(NOW_MS);
    const applied: string[][] = [];
    const logged: string[] = [];
    const tuner = createAutoTuner({
      store,
      configPath: path,
      scheduler: clock,
      logger: { info: (_f, m) => logged.push(m), warn: (_f, m) => logged.push(m) },
      onApplied: (changes) => applied.push(changes.map((c) => `${c.bucket}=${c.limitRps}`)),
    });

    const first = await tuner.runIfDue();
    assert.equal(first.outcome, 'applied');
    assert.deepEqual(applied, [['auto=1200']]);
    assert.equal(limitOf(path, 'auto'), 1200);
    assert.equal(limitOf(path, 'manual'), 1000, 'not opted in: proposed, not applied');
    assert.match(readFileSync(path, 'utf8'), /limitRps: 1200 # opted in/);
    assert.deepEqual(logged, [
      'tuning: limit changed (tuning.auto)',
      'tuning: limit change proposed for review',
    ]);
    assert.equal(store.getMarker(AUTO_TUNE_MARKER), TODAY_MS);

    // Same day (a restart, or the hourly check): no second step.
    clock.advance(3_600_000);
    assert.equal((await tuner.runIfDue()).outcome, 'skipped');
    assert.equal(limitOf(path, 'auto'), 1200);

    // Next day: one more step, 1200 -> 1300 (p95 1000 x 1.3 is within +20%).
    clock.advance(DAY_MS);
    const next = await tuner.runIfDue();
    assert.equal(next.outcome, 'applied');
    assert.equal(limitOf(path, 'auto'), 1300);
    clock.advance(DAY_MS);
    assert.equal((await tuner.runIfDue()).outcome, 'nothing-to-apply');
  });

  it('a marker dated after today counts as today: a clock that ran ahead and came back takes no second step', async () => {
    const path = join(dir, 'skew.yaml');
    writeFileSync(path, LIMITS);
    const store = createMemoryHistoryStore();
    recordDays(store, 'auto', 28, () => 2000);
    const warnings: string[] = [];
    const tunerAt = (clock: ManualClock) =>
      createAutoTuner({
        store,
        configPath: path,
        scheduler: clock,
        logger: { info: () => {}, warn: (_f, m) => warnings.push(m) },
      });
    assert.equal((await tunerAt(new ManualClock(NOW_MS)).runIfDue()).outcome, 'applied');
    assert.equal(limitOf(path, 'auto'), 1200);
    // The clock jumps a day ahead: that is, as far as anyone can tell, tomorrow's step.
    assert.equal((await tunerAt(new ManualClock(NOW_MS + DAY_MS)).runIfDue()).outcome, 'applied');
    assert.equal(limitOf(path, 'auto'), 1440);
    // Corrected, still the real today: a third step would make two in one real day.
    const corrected = await tunerAt(new ManualClock(NOW_MS + 3_600_000)).runIfDue();
    assert.equal(corrected.outcome, 'skipped');
    assert.equal(limitOf(path, 'auto'), 1440);
    assert.match(warnings.join('\n'), /dated after today/);
    // A marker years ahead is a bad reading, not a step taken: ignored, with a warning.
    store.setMarker(AUTO_TUNE_MARKER, TODAY_MS + 4000 * DAY_MS);
    assert.equal((await tunerAt(new ManualClock(NOW_MS + 2 * DAY_MS)).runIfDue()).outcome, 'applied');
    assert.match(warnings.join('\n'), /more than a day ahead/);
  });

  it('the timer checks every checkEveryMs; a failure is logged and retried, never thrown', async () => {
    const path = join(dir, 'broken.yaml');
    writeFileSync(path, 'version: 2\n');
    const store = createMemoryHistoryStore();
    recordDays(store, 'auto', 28, () => 1000);
    const clock = new ManualClock(NOW_MS);
    const warnings: string[] = [];
    const tuner = createAutoTuner({
      store,
      configPath: path,
      scheduler: clock,
      checkEveryMs: 60_000,
      logger: { info: () => {}, warn: (_f, m) => warnings.push(m) },
    });
    tuner.start();
    await waitUntil(() => warnings.length === 1);
    assert.equal(warnings[0], 'tuning: automatic run failed; limits unchanged');
    assert.equal(store.getMarker(AUTO_TUNE_MARKER), undefined, 'a failed run does not count as today’s');
    writeFileSync(path, LIMITS);
    clock.advance(60_000);
    await waitUntil(() => limitOf(path, 'auto') === 1200);
    await tuner.stop();
    clock.advance(DAY_MS);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(limitOf(path, 'auto'), 1200, 'stopped: no more runs');
  });
});

async function waitUntil(condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
