// Regenerates docs/accuracy/*.json|svg and the generated part of docs/accuracy.md: every preset
// scenario with all four variants, a ratio-policy comparison, local rescale on and off, a
// burst-guard detector comparison and a 10,000-host run. One command:
//
//   node --import tsx scripts/accuracy.ts            (1,000 hosts, the documented figures)
//   node --import tsx scripts/accuracy.ts --quick    (100 hosts, a smoke run; writes to a temp dir)
//
// Each row states the `spillway sim` command that reproduces it.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { RatioPolicySpec } from '../src/config/index.js';
import type { BurstGuardOptions } from '../src/global/index.js';
import { presetNames, presetScenario } from '../src/sim/presets.js';
import { runSimulation, type SimOptions, type SimResult } from '../src/sim/run-simulation.js';
import {
  formatConvergence,
  formatSummaryTable,
  summaryColumns,
  summaryRow,
  summaryRows,
} from '../src/sim/summary-table.js';
import type { VariantName } from '../src/sim/variants.js';
import { writeSimResult } from '../src/sim/write-result.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean' },
    only: { type: 'string' },
    'skip-extras': { type: 'boolean' },
  },
});
const quick = values.quick === true;
const hosts = quick ? 100 : 1000;
const seed = 1;
const outDir = quick ? join(tmpdir(), 'spillway-accuracy') : 'docs/accuracy';
const docPath = 'docs/accuracy.md';
mkdirSync(outDir, { recursive: true });

const sections: string[] = [];
const results = new Map<string, SimResult>();
const startedAt = new Date();

function command(scenario: string, extra: string[] = []): string {
  return ['spillway sim', `--scenario ${scenario}`, `--hosts ${hosts}`, `--seed ${seed}`, ...extra].join(' ');
}

async function run(name: string, options: SimOptions, extra: string[] = []): Promise<SimResult> {
  const scenario = presetScenario(name)!;
  const result = await runSimulation(scenario, { hosts, seed, ...options });
  process.stderr.write(`${name} ${extra.join(' ')}\n${formatSummaryTable(result)}\n\n`);
  return result;
}

// 1. Every preset, all four variants.
for (const name of presetNames) {
  if (values.only && !values.only.split(',').includes(name)) continue;
  const result = await run(name, {});
  results.set(name, result);
  writeSimResult(result, outDir, name, command(name));
  const s = result.scenario;
  const cost = result.variants
    .filter((v) => v !== 'exact')
    .map((v) => `${v} ${((result.cost[v]?.cpuMs ?? 0) / 1000).toFixed(1)} s`)
    .join(', ');
  sections.push(
    [
      `### ${name}`,
      '',
      `${s.description} ${s.hosts} hosts, ${s.zones} zones × ${s.aggregatorsPerZone} aggregator(s), ${s.seconds} s, ` +
        `network ${s.network.delayMs}+${s.network.jitterMs} ms, loss ${s.network.lossRate * 100}%.`,
      '',
      `\`${command(name)}\` — CPU per Spillway variant: ${cost}.`,
      '',
      formatSummaryTable(result, 'markdown'),
      '',
      `![${name}](accuracy/${name}.svg)`,
      '',
    ].join('\n'),
  );
}

// 2. Ratio policies, 3. local rescale, 4. the burst guard detector, 5. a 10,000-host fleet.
const extras: string[] = [];
if (!values['skip-extras'] && !values.only) {
  const policies: Array<{ label: string; flag: string; spec: RatioPolicySpec }> = [
    { label: 'plain (default)', flag: 'plain', spec: { kind: 'plain' } },
    { label: 'ewma α=0.5', flag: 'ewma:0.5', spec: { kind: 'ewma', alpha: 0.5 } },
    {
      label: 'corrected gain 0.2 (the former default)',
      flag: 'corrected:0.2:0.5',
      spec: { kind: 'corrected', gain: 0.2, maxCorrection: 0.5 },
    },
    {
      label: 'corrected gain 0.1',
      flag: 'corrected:0.1:0.5',
      spec: { kind: 'corrected', gain: 0.1, maxCorrection: 0.5 },
    },
  ];
  const policyRows: string[][] = [];
  for (const scenario of ['steady-1.5x', 'step-3x', 'lossy-reports']) {
    for (const policy of policies) {
      const extra = ['--variants spillway', `--ratio-policy ${policy.flag}`];
      const result = await run(
        scenario,
        { variants: ['spillway'], tuning: { ratioPolicy: policy.spec } },
        extra,
      );
      const row = summaryRows(result)[0]!;
      policyRows.push([scenario, policy.label, ...row.slice(1), `\`${command(scenario, extra)}\``]);
    }
  }
  extras.push(
    '### Ratio policy (spillway variant, no burst guard)',
    '',
    markdownTable(['scenario', 'policy', ...summaryColumns.slice(1), 'command'], policyRows),
    '',
  );

  // Local rescale: the spillway variant has it (the default); the same runs without it.
  const rescaleRows: string[][] = [];
  for (const scenario of ['steady-1.5x', 'step-3x', 'surge-15x', 'controller-outage']) {
    const withRescale = results.get(scenario);
    const spillway = withRescale?.summary.find((v) => v.variant === 'spillway');
    if (spillway) {
      rescaleRows.push([
        scenario,
        'on (default)',
        ...summaryRow(spillway).slice(1),
        `\`${command(scenario)}\``,
      ]);
    }
    const extra = ['--variants spillway', '(tuning.localRescale = false)'];
    const result = await run(scenario, { variants: ['spillway'], tuning: { localRescale: false } }, extra);
    rescaleRows.push([
      scenario,
      'off',
      ...summaryRows(result)[0]!.slice(1),
      `runSimulation(preset '${scenario}', { hosts: ${hosts}, seed: ${seed}, variants: ['spillway'], tuning: { localRescale: false } })`,
    ]);
  }
  extras.push(
    '### Local rescale (spillway variant)',
    '',
    markdownTable(['scenario', 'local rescale', ...summaryColumns.slice(1), 'command'], rescaleRows),
    '',
  );

  const guardRows: string[][] = [];
  // The detector's two constants around the defaults (drain 2.2x the allowance, trip at 6 units):
  // a lower drain or trip level trips sooner (less overshoot) and more often on noise (steady
  // undershoot), a higher one the reverse.
  const guardSizings: Array<{ label: string; flags: string[]; guard: BurstGuardOptions }> = [
    { label: 'drain 2.2, trip 6 units (default)', flags: [], guard: {} },
    ...[1.8, 2.0, 2.5].map((drainFactor) => ({
      label: `drain ${drainFactor}, trip 6 units`,
      flags: [`--guard-drain-factor ${drainFactor}`],
      guard: { drainFactor },
    })),
    ...[5, 8].map((tripUnits) => ({
      label: `drain 2.2, trip ${tripUnits} units`,
      flags: [`--guard-trip-units ${tripUnits}`],
      guard: { tripUnits },
    })),
  ];
  for (const scenario of ['step-3x', 'steady-1.5x']) {
    for (const sizing of guardSizings) {
      const extra = ['--variants guard', ...sizing.flags];
      const result = await run(
        scenario,
        { variants: ['guard'], tuning: { burstGuard: sizing.guard } },
        extra,
      );
      const row = summaryRows(result)[0]!;
      guardRows.push([scenario, sizing.label, ...row.slice(1), `\`${command(scenario, extra)}\``]);
    }
  }
  extras.push(
    '### Burst guard detector (guard variant)',
    '',
    markdownTable(['scenario', 'detector', ...summaryColumns.slice(1), 'command'], guardRows),
    '',
  );

  const bigHosts = quick ? 1000 : 10_000;
  const bigVariants: VariantName[] = ['exact', 'plain', 'spillway'];
  const big = await runSimulation(presetScenario('steady-1.5x')!, {
    hosts: bigHosts,
    seconds: 30,
    seed,
    variants: bigVariants,
  });
  process.stderr.write(`steady-1.5x ${bigHosts} hosts\n${formatSummaryTable(big)}\n\n`);
  writeSimResult(big, outDir, `steady-1.5x-${bigHosts}-hosts`);
  extras.push(
    `### ${bigHosts.toLocaleString('en-US')} hosts`,
    '',
    `\`spillway sim --scenario steady-1.5x --hosts ${bigHosts} --seconds 30 --seed ${seed} --variants ${bigVariants.join(',')}\` — CPU: ` +
      bigVariants
        .filter((v) => v !== 'exact')
        .map(
          (v) =>
            `${v} ${((big.cost[v]?.cpuMs ?? 0) / 1000).toFixed(1)} s (${big.cost[v]?.timersFired} timers)`,
        )
        .join(', '),
    '',
    formatSummaryTable(big, 'markdown'),
    '',
  );
}

// Targets, from the runs above.
const targetRows: string[][] = [];
const focus = (name: string, variant: VariantName) =>
  results.get(name)?.summary.find((s) => s.variant === variant)?.focus;
const pct = (v: number | null | undefined) =>
  v === null || v === undefined ? '-' : `${v > 0 ? '+' : ''}${v.toFixed(2)}%`;
for (const variant of ['plain', 'spillway', 'guard'] as const) {
  const steady = focus('steady-1.5x', variant);
  if (steady) {
    targetRows.push([
      'steady 1.5x: admitted within 2% of the limit',
      variant,
      pct(steady.steadyErrorPct),
      mark(steady.steadyErrorPct !== null && Math.abs(steady.steadyErrorPct) <= 2),
    ]);
  }
  const step = focus('step-3x', variant);
  const stepUp = step?.convergence.find((c) => c.atS === 20);
  if (stepUp) {
    targetRows.push([
      'after a 3x step: within 5% in <= 3 s',
      variant,
      stepUp.convergedAfterS === null ? 'never' : `${stepUp.convergedAfterS.toFixed(1)} s`,
      mark(stepUp.convergedAfterS !== null && stepUp.convergedAfterS <= 3),
    ]);
  }
  for (const name of ['zipf-hosts', 'hot-caller']) {
    const skewed = focus(name, variant);
    if (skewed && steady) {
      const gap = Math.abs((skewed.steadyErrorPct ?? 0) - (steady.steadyErrorPct ?? 0));
      targetRows.push([
        `${name}: same accuracy as uniform (steady error within 1 point of steady-1.5x)`,
        variant,
        `${pct(skewed.steadyErrorPct)} vs ${pct(steady.steadyErrorPct)}`,
        mark(gap <= 1),
      ]);
    }
  }
  const outage = focus('controller-outage', variant);
  const restart = outage?.convergence.find((c) => c.atS === 35);
  if (outage && restart) {
    // "Keep serving": every 100 ms sample of the outage (20-35 s) admits at least 90% of what the
    // limit allows then, min(offered, limit): hosts neither stop nor starve on their last ratios.
    const result = results.get('controller-outage')!;
    const series = result.series[0]!;
    const sampleS = result.sampleMs / 1000;
    let duringOutage = 0;
    let worstShare = Number.POSITIVE_INFINITY;
    for (let i = 20 / sampleS; i < 35 / sampleS; i++) {
      const allowed = Math.min(series.offered[i]!, series.limitRps[i]! * sampleS);
      duringOutage += series.admitted[variant]![i]!;
      worstShare = Math.min(worstShare, allowed > 0 ? series.admitted[variant]![i]! / allowed : 1);
    }
    targetRows.push([
      'controller outage: every sample admits >= 90% of min(offered, limit); after restart within 5% in <= 3 intervals',
      variant,
      `${duringOutage.toLocaleString('en-US')} admitted during the outage, the worst 100 ms ${(worstShare * 100).toFixed(1)}% of min(offered, limit); ${
        restart.convergedAfterS === null ? 'never' : `${restart.convergedAfterS.toFixed(1)} s`
      } after restart`,
      mark(worstShare >= 0.9 && restart.convergedAfterS !== null && restart.convergedAfterS <= 3),
    ]);
  }
}
for (const name of ['step-3x', 'surge-15x']) {
  const guard = focus(name, 'guard');
  if (guard) {
    targetRows.push([
      `${name}: with the burst guard, peak overshoot <= 25%`,
      'guard',
      `${guard.peakOvershootPct.toFixed(1)}% (without: ${focus(name, 'spillway')?.peakOvershootPct.toFixed(1)}%)`,
      mark(guard.peakOvershootPct <= 25),
    ]);
  }
}
const steadyResult = results.get('steady-1.5x');
if (steadyResult) {
  for (const variant of ['plain', 'spillway', 'guard'] as const) {
    const cpu = (steadyResult.cost[variant]?.cpuMs ?? 0) / 1000;
    targetRows.push([
      `speed: ${hosts} hosts, ${steadyResult.scenario.seconds} simulated s in <= 10 s on one core`,
      variant,
      `${cpu.toFixed(1)} s CPU (${((steadyResult.cost[variant]?.wallMs ?? 0) / 1000).toFixed(1)} s wall)`,
      mark(cpu <= 10),
    ]);
  }
}

const generated = [
  '<!-- generated by scripts/accuracy.ts: do not edit by hand -->',
  '',
  `Generated ${startedAt.toISOString().slice(0, 10)} on ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}, ` +
    `by \`node --import tsx scripts/accuracy.ts\`${quick ? ' --quick' : ''}. Seed ${seed}, ${hosts} hosts unless stated.`,
  '',
  '### Targets',
  '',
  markdownTable(['target', 'variant', 'measured', 'met'], targetRows),
  '',
  ...sections,
  ...extras,
].join('\n');

if (quick) {
  writeFileSync(join(outDir, 'accuracy-generated.md'), generated);
  process.stderr.write(`quick run: wrote ${outDir}/accuracy-generated.md (docs untouched)\n`);
} else {
  const doc = readFileSync(docPath, 'utf8');
  const begin = '<!-- accuracy:begin -->';
  const end = '<!-- accuracy:end -->';
  const from = doc.indexOf(begin);
  const to = doc.indexOf(end);
  if (from < 0 || to < from) throw new Error(`${docPath} lacks the ${begin} / ${end} markers`);
  writeFileSync(docPath, `${doc.slice(0, from + begin.length)}\n${generated}\n${doc.slice(to)}`);
  process.stderr.write(`rewrote the generated part of ${docPath}\n`);
}

function markdownTable(header: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

function mark(met: boolean): string {
  return met ? 'yes' : '**no**';
}

export { formatConvergence };
