import type { RatioPolicySpec } from '../config/index.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import type { BurstGuardOptions } from '../global/index.js';
import { presetNames, presetScenario } from '../sim/presets.js';
import { runSimulation, type SimResult } from '../sim/run-simulation.js';
import { loadScenarioFile, type Scenario } from '../sim/scenario.js';
import { formatSummaryTable } from '../sim/summary-table.js';
import { isVariantName, type VariantName, variantNames } from '../sim/variants.js';
import { writeSimResult } from '../sim/write-result.js';
import { type CommandSpec, runCommand, stringFlag } from './command-line.js';

export const spec: CommandSpec = {
  name: 'sim',
  summary:
    "Run the global limiter's real components (hosts, aggregators, controller) in virtual time over a " +
    'simulated fleet, next to an exact centralized limiter, and print accuracy figures.',
  flags: {
    scenario: {
      type: 'string',
      valueName: 'name|file',
      description: 'a preset (--list) or a scenario file (.json, .yaml; docs/accuracy.md)',
      defaultText: 'steady-1.5x',
    },
    hosts: { type: 'string', valueName: 'n', description: 'data-plane hosts', defaultText: "the scenario's" },
    zones: {
      type: 'string',
      valueName: 'n',
      description: 'zones, one aggregator tier each',
      defaultText: "the scenario's",
    },
    aggregators: {
      type: 'string',
      valueName: 'n',
      description: 'aggregators per zone',
      defaultText: "the scenario's",
    },
    seconds: {
      type: 'string',
      valueName: 's',
      description: 'simulated seconds',
      defaultText: "the scenario's",
    },
    'tick-ms': {
      type: 'string',
      valueName: 'ms',
      description: 'traffic step',
      defaultText: "the scenario's",
    },
    seed: {
      type: 'string',
      valueName: 'n',
      description: 'seed of traffic and every random draw',
      defaultText: '1',
    },
    variants: {
      type: 'string',
      valueName: 'list',
      description: `comma-separated: ${variantNames.join(', ')}`,
      defaultText: 'all',
    },
    'ratio-policy': {
      type: 'string',
      valueName: 'spec',
      description:
        'ratio policy of the spillway and guard variants: plain | ewma:<alpha> | corrected:<gain>[:<maxCorrection>]',
      defaultText: 'plain',
    },
    'guard-slack': {
      type: 'string',
      valueName: 'ratio',
      description: "burst guard: tripped rate over the host's allowance",
    },
    'guard-window-ms': {
      type: 'string',
      valueName: 'ms',
      description: 'burst guard: tripped bucket depth, in ms of allowance',
    },
    'guard-trip-units': {
      type: 'string',
      valueName: 'n',
      description: 'burst guard: detector trip level, in units at least',
    },
    'guard-drain-factor': {
      type: 'string',
      valueName: 'x',
      description: 'burst guard: detector drain, in multiples of the allowance',
    },
    out: {
      type: 'string',
      valueName: 'dir',
      description: 'write <scenario name>.json and .svg there',
      defaultText: './spillway-sim',
    },
    'no-files': { type: 'boolean', description: 'print the table only' },
    list: { type: 'boolean', description: 'list the presets' },
    'print-scenario': {
      type: 'boolean',
      description: 'print the scenario as JSON (a template for custom files) and exit',
    },
  },
  notes: [
    'Exit codes: 0 done, 2 usage or an invalid scenario (ERR_SPILLWAY_INVALID_CONFIG).',
    'Example: spillway sim --scenario step-3x --hosts 1000 --seed 1',
  ],
};

/** The guard variant's tuning flags and the `BurstGuardOptions` field each sets. */
const guardFlags = [
  ['guard-slack', 'slackRatio'],
  ['guard-window-ms', 'burstWindowMs'],
  ['guard-trip-units', 'tripUnits'],
  ['guard-drain-factor', 'drainFactor'],
] as const satisfies ReadonlyArray<readonly [string, keyof BurstGuardOptions]>;

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    if (values.list === true) {
      for (const name of presetNames) {
        process.stdout.write(`${name.padEnd(20)} ${presetScenario(name)!.description}\n`);
      }
      return 0;
    }
    const scenario = resolveScenario(stringFlag(values, 'scenario') ?? 'steady-1.5x');
    if (values['print-scenario'] === true) {
      process.stdout.write(`${JSON.stringify(scenario, null, 2)}\n`);
      return 0;
    }
    const variants = parseVariants(stringFlag(values, 'variants'));
    const ratioPolicyText = stringFlag(values, 'ratio-policy');
    const ratioPolicy = ratioPolicyText === undefined ? undefined : parseRatioPolicy(ratioPolicyText);
    const burstGuard: BurstGuardOptions = {};
    for (const [flag, option] of guardFlags) {
      const value = stringFlag(values, flag);
      if (value !== undefined) burstGuard[option] = number(`--${flag}`, value);
    }
    const secondsText = stringFlag(values, 'seconds');
    let result: SimResult;
    try {
      result = await runSimulation(scenario, {
        seed: optionalInteger('--seed', stringFlag(values, 'seed')) ?? 1,
        hosts: optionalInteger('--hosts', stringFlag(values, 'hosts')),
        zones: optionalInteger('--zones', stringFlag(values, 'zones')),
        aggregatorsPerZone: optionalInteger('--aggregators', stringFlag(values, 'aggregators')),
        seconds: secondsText === undefined ? undefined : number('--seconds', secondsText),
        tickMs: optionalInteger('--tick-ms', stringFlag(values, 'tick-ms')),
        variants,
        tuning: { ...(ratioPolicy ? { ratioPolicy } : {}), burstGuard },
      });
    } catch (error) {
      // A flag that makes the scenario invalid (--seconds not a whole number of samples...) is a usage error.
      if (isSpillwayError(error, ErrorCode.InvalidOption)) throw usageError(error.message);
      throw error;
    }
    const s = result.scenario;
    process.stdout.write(
      `${s.name}: ${s.description}\n${s.hosts} hosts, ${s.zones} zones x ${s.aggregatorsPerZone} aggregators, ` +
        `${s.seconds} s simulated, interval ${s.intervalMs} ms, tick ${s.tickMs} ms, seed ${result.seed}\n\n`,
    );
    process.stdout.write(`${formatSummaryTable(result)}\n`);
    if (values['no-files'] !== true) {
      const files = writeSimResult(
        result,
        stringFlag(values, 'out') ?? 'spillway-sim',
        s.name,
        ['spillway', 'sim', ...argv].join(' '),
      );
      process.stdout.write(`\nwrote ${files.json}\nwrote ${files.svg}\n`);
    }
    return 0;
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
