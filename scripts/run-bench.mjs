#!/usr/bin/env node
// Runs every benchmark (bench/*.bench.ts) one after another, each in its own process so one
// benchmark's JIT state and garbage do not skew the next. Results land in bench/results/.
// Arguments narrow the run: `npm run bench -- local`. BENCH_SMOKE=1 makes each a quick check that
// writes nothing (bench/smoke.ts); test/bench/bench-smoke.test.ts runs every benchmark so.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';

const filters = process.argv.slice(2);
const files = readdirSync('bench')
  .filter((f) => f.endsWith('.bench.ts'))
  .filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
  .sort();
let failed = 0;
for (const file of files) {
  console.log(`\n=== bench/${file}`);
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--expose-gc', `bench/${file}`], {
    stdio: 'inherit',
  });
  if (r.status !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);
