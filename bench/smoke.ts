import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

/**
 * BENCH_SMOKE=1 runs a benchmark as a check, not a measurement: a handful of iterations through
 * every path it measures, in seconds, writing no results file and exiting non-zero when a path
 * fails. test/bench/bench-smoke.test.ts runs every bench/*.bench.ts this way under `npm test`, so
 * a benchmark that no longer runs at the head of main fails CI. A smoke run's figures mean nothing:
 * nothing asserts on them, and they are never written. A benchmark that needs commands beyond Node
 * names them in a `// Needs: a, b` header line: without them the test skips it, and fails under CI.
 */
export const SMOKE = process.env.BENCH_SMOKE === '1';

/**
 * A numeric BENCH_* setting: the variable when it is set, else the full run's default, or in a
 * smoke run the smoke default.
 */
export function benchSetting(name: `BENCH_${string}`, full: number, smoke: number): number {
  const value = process.env[name];
  if (value !== undefined && value !== '') return Number(value);
  return SMOKE ? smoke : full;
}

/** Writes a results file, creating its folder; a smoke run writes nothing. Either says which. */
export function writeResultsFile(path: string, text: string): void {
  if (SMOKE) {
    process.stdout.write(`smoke run: ${path} not written\n`);
    return;
  }
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  process.stdout.write(`wrote ${path}\n`);
}

/**
 * In a smoke run, throws unless `ok`: a path that ran without throwing but did not do what the
 * benchmark measures (a case answered nothing but errors, a process did not start). A full run
 * reports such a path in its results file instead, where a reader sees it.
 */
export function smokeCheck(ok: boolean, message: string): void {
  if (SMOKE && !ok) throw new Error(`smoke run: ${message}`);
}

/** How many items inTurn works on at once in a smoke run. */
const SMOKE_WIDTH = 4;

/**
 * Runs `work` for each item: one after another in a full run (its timings are taken), up to
 * SMOKE_WIDTH at once in a smoke run, whose timings mean nothing and whose wall time is what counts.
 */
export async function inTurn<T>(items: readonly T[], work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await work(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(SMOKE ? SMOKE_WIDTH : 1, items.length) }, worker));
}
