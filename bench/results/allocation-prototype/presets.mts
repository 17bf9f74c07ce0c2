// Runs every preset with the spillway-defaults and plain variants; prints one line per preset.
// usage (from a worktree root): node --import tsx /work/tools/presets.ts [hosts] [seed] [variants]
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
const root = process.cwd();
const { presetNames, presetScenario } = await import(pathToFileURL(resolve(root, 'src/sim/presets.ts')).href);
const { runSimulation } = await import(pathToFileURL(resolve(root, 'src/sim/run-simulation.ts')).href);
const hosts = Number(process.argv[2] ?? 100);
const seed = Number(process.argv[3] ?? 1);
const variants = (process.argv[4] ?? 'plain,spillway').split(',');
const only = process.argv[5]?.split(',');
for (const name of presetNames as string[]) {
  if (only && !only.includes(name)) continue;
  const result = await runSimulation(presetScenario(name), { hosts, seed, variants });
  for (const s of result.summary) {
    const b = Object.values(s.buckets)[0] as any;
    const focus = result.scenario.focusBucket ? s.buckets[result.scenario.focusBucket] : b;
    console.log(JSON.stringify({ preset: name, variant: s.variant, steadyErr: round(focus.steadyErrorPct), meanAbs: round(focus.steadyAbsErrorPct), within: focus.convergence.map((c: any) => `${c.atS}:${c.convergedAfterS}`).join(" "), overshoot: round(focus.peakOvershootPct), excess: Math.round(s.excessAdmitted), wrong: Math.round(s.wronglyDropped) }));
  }
}
function round(x: number | undefined) { return x === undefined || x === null ? x : Math.round(x * 100) / 100; }
