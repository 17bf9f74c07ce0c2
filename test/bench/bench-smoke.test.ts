// Every benchmark still runs at the head of the tree. Each bench/*.bench.ts, found in the folder
// (a new one is covered with no change here), runs in its smoke mode (BENCH_SMOKE=1,
// bench/smoke.ts): a handful of iterations through every path it measures. It must exit 0 and
// leave bench/results/ as it was. No figure is asserted: figures belong to benchmarks.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const RESULTS_DIR = join(ROOT, 'bench/results');
/** A hung benchmark fails its test instead of holding the whole run; a smoke run takes seconds. */
const HANG_GUARD_MS = 600_000;
/** Output lines shown when a benchmark fails. */
const TAIL_LINES = 60;

const benchFiles = readdirSync(join(ROOT, 'bench'))
  .filter((name) => name.endsWith('.bench.ts'))
  .sort();

/** Commands a benchmark needs beyond Node, from its `// Needs: a, b` header line. */
function neededCommands(file: string): string[] {
  const line = /^\/\/ Needs: (.+)$/m.exec(readFileSync(join(ROOT, 'bench', file), 'utf8'));
  return line ? line[1]!.split(',').map((command) => command.trim()) : [];
}

function onPath(command: string): boolean {
  return (process.env.PATH ?? '')
    .split(delimiter)
    .some((dir) => dir !== '' && existsSync(join(dir, command)));
}

/** Every results file's size and modification time. */
function resultsSnapshot(): Map<string, string> {
  const snapshot = new Map<string, string>();
  for (const name of readdirSync(RESULTS_DIR)) {
    const stat = statSync(join(RESULTS_DIR, name));
    snapshot.set(name, `${stat.size} bytes, modified ${stat.mtimeMs}`);
  }
  return snapshot;
}

/**
 * Runs one benchmark through `npm run bench`'s runner in smoke mode, with no other BENCH_*
 * setting from this environment, so every machine runs the same smoke.
 */
function runSmoke(file: string): Promise<{ code: number | null; signal: string | null; output: string }> {
  const env: NodeJS.ProcessEnv = { BENCH_SMOKE: '1' };
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith('BENCH_')) env[name] = value;
  }
  // Its own process group, so the hang guard reaches the benchmark and what it started.
  const child = spawn(process.execPath, ['scripts/run-bench.mjs', file], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let output = '';
  const keep = (chunk: Buffer) => {
    output += chunk.toString();
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const guard = setTimeout(() => {
    if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
  }, HANG_GUARD_MS);
  return new Promise((resolve) => {
    child.once('close', (code, signal) => {
      clearTimeout(guard);
      resolve({ code, signal, output });
    });
  });
}

describe('every benchmark runs in smoke mode (BENCH_SMOKE=1)', () => {
  it('finds the benchmarks', () => {
    assert.ok(benchFiles.length > 0, 'no bench/*.bench.ts found');
  });

  for (const file of benchFiles) {
    const missing = neededCommands(file).filter((command) => !onPath(command));
    // As for Redis and Chromium elsewhere: a machine without the tool skips, CI must have it.
    if (missing.length > 0 && process.env.CI === 'true') {
      throw new Error(`bench/${file} needs ${missing.join(', ')}: CI must install it (.ci/run)`);
    }
    const skip = missing.length > 0 ? `${missing.join(', ')} not installed` : false;
    it(`bench/${file} exits 0 and writes no results file`, { skip }, async () => {
      const before = resultsSnapshot();
      const run = await runSmoke(file);
      const tail = run.output.trimEnd().split('\n').slice(-TAIL_LINES).join('\n');
      assert.equal(run.code, 0, `bench/${file} exited ${run.code ?? run.signal}:\n${tail}`);
      assert.deepEqual(resultsSnapshot(), before, `bench/${file} changed bench/results/`);
    });
  }
});
