import { parseArgs } from 'node:util';
import type { RatioPolicySpec } from '../config/index.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import type { BurstGuardOptions } from '../global/index.js';
import { presetNames, presetScenario } from '../sim/presets.js';
import { runSimulation } from '../sim/run-simulation.js';
import { loadScenarioFile, type Scenario } from '../sim/scenario.js';
import { formatSummaryTable } from '../sim/summary-table.js';
import { isVariantName, type VariantName, variantNames } from '../sim/variants.js';
import { writeSimResult } from '../sim/write-result.js';

const usage = `Usage: spillway sim [options]

Run the global limiter's real components (hosts, aggregators, controller) in virtual time over a
simulated fleet, next to an exact centralized limiter, and print accuracy figures.

Options:
  --scenario <name|file>   a preset (default steady-1.5x) or a scenario file (.json, .yaml)
  --hosts <n>              data-plane hosts (default: the scenario's, 1000)
  --zones <n>              zones, one aggregator tier each (default 10)
  --aggregators <n>        aggregators per zone
  --seconds <s>            simulated seconds
  --tick-ms <ms>           traffic step (default 10)
  --seed <n>               seed of traffic and every random draw (default 1)
  --variants <list>        comma-separated: ${variantNames.join(',')} (default: all)
  --ratio-policy <spec>    ratio policy of the spillway and guard variants:
                           plain | ewma:<alpha> | corrected:<gain>[:<maxCorrection>]
  --guard-slack <ratio>    burst guard: tripped rate over the host's allowance (guard variant)
  --guard-window-ms <ms>   burst guard: tripped bucket depth, in ms of allowance
  --guard-trip-units <n>   burst guard: detector trip level, in units at least
  --guard-drain-factor <x> burst guard: detector drain, in multiples of the allowance
  --out <dir>              write <scenario>.json and <scenario>.svg there (default ./spillway-sim)
  --no-files               print the table only
  --list                   list the presets
  --print-scenario         print the scenario as JSON (a template for custom files) and exit
  -h, --help               show this help
`;

/** The guard variant's tuning flags and the `BurstGuardOptions` field each sets. */
const guardFlags = [
  ['guard-slack', 'slackRatio'],
  ['guard-window-ms', 'burstWindowMs'],
  ['guard-trip-units', 'tripUnits'],
  ['guard-drain-factor', 'drainFactor'],
] as const satisfies ReadonlyArray<readonly [string, keyof BurstGuardOptions]>;

export async function run(argv: string[]): Promise<number> {
  let values: ReturnType<typeof parse>['values'];
  try {
    values = parse(argv).values;
  } catch (error) {
    process.stderr.write(`spillway sim: ${(error as Error).message}\n\n${usage}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(usage);
    return 0;
  }
  if (values.list) {
    for (const name of presetNames) {
      process.stdout.write(`${name.padEnd(20)} ${presetScenario(name)!.description}\n`);
    }
    return 0;
  }
  try {
    const scenario = resolveScenario(values.scenario ?? 'steady-1.5x');
    if (values['print-scenario']) {
      process.stdout.write(`${JSON.stringify(scenario, null, 2)}\n`);
      return 0;
    }
    const variants = parseVariants(values.variants);
    const ratioPolicy =
      values['ratio-policy'] === undefined ? undefined : parseRatioPolicy(values['ratio-policy']);
    const burstGuard: BurstGuardOptions = {};
    for (const [flag, option] of guardFlags) {
      const value = values[flag];
      if (value !== undefined) burstGuard[option] = number(`--${flag}`, value);
    }
    const result = await runSimulation(scenario, {
      seed: optionalInteger('--seed', values.seed) ?? 1,
      hosts: optionalInteger('--hosts', values.hosts),
      zones: optionalInteger('--zones', values.zones),
      aggregatorsPerZone: optionalInteger('--aggregators', values.aggregators),
      seconds: values.seconds === undefined ? undefined : number('--seconds', values.seconds),
      tickMs: optionalInteger('--tick-ms', values['tick-ms']),
      variants,
      tuning: { ...(ratioPolicy ? { ratioPolicy } : {}), burstGuard },
    });
    const s = result.scenario;
    process.stdout.write(
      `${s.name}: ${s.description}\n${s.hosts} hosts, ${s.zones} zones x ${s.aggregatorsPerZone} aggregators, ` +
        `${s.seconds} s simulated, interval ${s.intervalMs} ms, tick ${s.tickMs} ms, seed ${result.seed}\n\n`,
    );
    process.stdout.write(`${formatSummaryTable(result)}\n`);
    if (!values['no-files']) {
      const files = writeSimResult(
        result,
        values.out ?? 'spillway-sim',
        s.name,
        ['spillway', 'sim', ...argv].join(' '),
      );
      process.stdout.write(`\nwrote ${files.json}\nwrote ${files.svg}\n`);
    }
    return 0;
  } catch (error) {
    if (isSpillwayError(error)) {
      process.stderr.write(`spillway sim: ${error.message}\n`);
      return 2;
    }
    throw error;
  }
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: {
      scenario: { type: 'string' },
      hosts: { type: 'string' },
      zones: { type: 'string' },
      aggregators: { type: 'string' },
      seconds: { type: 'string' },
      'tick-ms': { type: 'string' },
      seed: { type: 'string' },
      variants: { type: 'string' },
      'ratio-policy': { type: 'string' },
      'guard-slack': { type: 'string' },
      'guard-window-ms': { type: 'string' },
      'guard-trip-units': { type: 'string' },
      'guard-drain-factor': { type: 'string' },
      out: { type: 'string' },
      'no-files': { type: 'boolean' },
      list: { type: 'boolean' },
      'print-scenario': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

function usageError(message: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidUsage, message);
}

function resolveScenario(nameOrFile: string): Scenario {
  const preset = presetScenario(nameOrFile);
  if (preset) return preset;
  if (/\.(json|ya?ml)$/.test(nameOrFile)) return loadScenarioFile(nameOrFile);
  throw usageError(
    `unknown scenario '${nameOrFile}' (presets: ${presetNames.join(', ')}; or a .json/.yaml file)`,
  );
}

function parseVariants(text: string | undefined): VariantName[] | undefined {
  if (text === undefined) return undefined;
  const names = text
    .split(',')
    .map((v) => v.trim())
    .filter(Boolean);
  for (const name of names) {
    if (!isVariantName(name)) throw usageError(`unknown variant '${name}' (${variantNames.join(', ')})`);
  }
  if (names.length === 0) throw usageError('--variants needs at least one variant');
  return names as VariantName[];
}

export function parseRatioPolicy(text: string): RatioPolicySpec {
  const [kind, ...args] = text.split(':');
  const numbers = args.map((a) => number('--ratio-policy', a));
  if (kind === 'plain' && numbers.length === 0) return { kind: 'plain' };
  if (kind === 'ewma' && numbers.length === 1) return { kind: 'ewma', alpha: numbers[0]! };
  if (kind === 'corrected' && numbers.length >= 1 && numbers.length <= 2) {
    return { kind: 'corrected', gain: numbers[0]!, maxCorrection: numbers[1] ?? 0.5 };
  }
  throw usageError(`--ratio-policy: expected plain, ewma:<alpha> or corrected:<gain>[:<max>], got '${text}'`);
}

function number(flag: string, text: string): number {
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value))
    throw usageError(`${flag} needs a number, got '${text}'`);
  return value;
}

function optionalInteger(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = number(flag, text);
  if (!Number.isSafeInteger(value)) throw usageError(`${flag} needs an integer, got '${text}'`);
  return value;
}
