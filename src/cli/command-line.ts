import { parseArgs } from 'node:util';
import { ErrorCode, isSpillwayError, SpillwayError } from '../core/errors.js';
import { formatHostPort } from '../protocol/host-port.js';

/**
 * Flag parsing, help and usage errors shared by the subcommands. Each subcommand declares its flags
 * once (`CommandSpec`); help text and validation come from that one declaration.
 */
export interface FlagSpec {
  type: 'string' | 'boolean';
  short?: string;
  /** May be given more than once (values are collected in order). */
  multiple?: boolean;
  /** Shown in help as `--flag <valueName>`. */
  valueName?: string;
  description: string;
  /** Shown in help; applied by the command itself (so "absent" stays distinguishable). */
  defaultText?: string;
  required?: boolean;
}

export interface CommandSpec {
  name: string;
  summary: string;
  /** Paragraphs after the flag list (examples, notes). */
  notes?: string[];
  flags: Record<string, FlagSpec>;
}

export type FlagValues = Record<string, string | boolean | string[] | undefined>;

const HELP_FLAG: FlagSpec = { type: 'boolean', short: 'h', description: 'show this help' };

export function commandHelp(spec: CommandSpec): string {
  const flags = { ...spec.flags, help: HELP_FLAG };
  const rows = Object.entries(flags).map(([name, flag]) => {
    const short = flag.short ? `-${flag.short}, ` : '    ';
    const value = flag.type === 'string' ? ` <${flag.valueName ?? 'value'}>` : '';
    const notes = [
      flag.required ? 'required' : '',
      flag.defaultText ? `default ${flag.defaultText}` : '',
      flag.multiple ? 'repeatable' : '',
    ]
      .filter(Boolean)
      .join('; ');
    return [`  ${short}--${name}${value}`, `${flag.description}${notes ? ` (${notes})` : ''}`] as const;
  });
  const width = Math.max(...rows.map(([left]) => left.length)) + 2;
  return [
    `Usage: spillway ${spec.name} [options]`,
    '',
    spec.summary,
    '',
    'Options:',
    ...rows.map(([left, right]) => `${left.padEnd(width)}${right}`),
    ...(spec.notes ? ['', ...spec.notes] : []),
    '',
  ].join('\n');
}

/** A malformed invocation: exit code 2, message on stderr. */
export function usageError(message: string, details?: Record<string, unknown>): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidUsage, message, details);
}

export function parseFlags(spec: CommandSpec, argv: string[]): { help: boolean; values: FlagValues } {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string; multiple?: boolean }> = {};
  for (const [name, flag] of Object.entries({ ...spec.flags, help: HELP_FLAG })) {
    options[name] = {
      type: flag.type,
      ...(flag.short ? { short: flag.short } : {}),
      ...(flag.multiple ? { multiple: true } : {}),
    };
  }
  let parsed: { values: FlagValues; positionals: string[] };
  try {
    parsed = parseArgs({ args: argv, options, strict: true, allowPositionals: true }) as typeof parsed;
  } catch (error) {
    // node:util's first line is the clear part ("Unknown option '--x'"); the rest is advice about dashes.
    const firstLine = (error instanceof Error ? error.message : String(error)).split('\n')[0]!;
    const missing = /^Option '(?:-\w, )?(--?[\w-]+)[^']*' argument (?:is ambiguous|missing)/.exec(firstLine);
    throw usageError(
      missing ? `${missing[1]} needs a value` : firstLine.replace(/\. To specify a positional.*$/, ''),
    );
  }
  if (parsed.values.help === true) return { help: true, values: parsed.values };
  if (parsed.positionals.length > 0) {
    throw usageError(`unexpected argument '${parsed.positionals[0]}'`);
  }
  for (const [name, flag] of Object.entries(spec.flags)) {
    const value = parsed.values[name];
    if (flag.required && (value === undefined || (Array.isArray(value) && value.length === 0))) {
      throw usageError(`--${name} is required`, { flag: name });
    }
    if (typeof value === 'string' && value.trim() === '')
      throw usageError(`--${name} must not be empty`, { flag: name });
  }
  return { help: false, values: parsed.values };
}

/**
 * Runs a subcommand body with the shared conventions: `--help` prints help and exits 0; a usage or
 * configuration error prints `spillway <name>: <message> (<code>)` and exits 2; anything else
 * propagates (exit 1 with a stack, from the entry point).
 */
export async function runCommand(
  spec: CommandSpec,
  argv: string[],
  body: (values: FlagValues) => Promise<number>,
): Promise<number> {
  try {
    const { help, values } = parseFlags(spec, argv);
    if (help) {
      process.stdout.write(commandHelp(spec));
      return 0;
    }
    return await body(values);
  } catch (error) {
    if (isSpillwayError(error, ErrorCode.InvalidUsage) || isSpillwayError(error, ErrorCode.InvalidConfig)) {
      process.stderr.write(`spillway ${spec.name}: ${error.message} (${error.code})\n`);
      if (error.code === ErrorCode.InvalidUsage)
        process.stderr.write(`Run 'spillway ${spec.name} --help' for usage.\n`);
      return 2;
    }
    throw error;
  }
}

export function stringFlag(values: FlagValues, name: string): string | undefined {
  const value = values[name];
  if (Array.isArray(value)) return value.at(-1);
  return typeof value === 'string' ? value : undefined;
}

/** A repeatable flag whose values may also be comma-separated: `--x a,b --x c` is `[a, b, c]`. */
export function listFlag(values: FlagValues, name: string): string[] {
  const value = values[name];
  const raw = Array.isArray(value) ? value : typeof value === 'string' ? [value] : [];
  return raw
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter((v) => v.length > 0);
}

export interface HostPort {
  host: string;
  port: number;
}

/** `host:port`, `[v6]:port` or `:port` (127.0.0.1). Port 0 asks the OS for a free one. */
export function parseHostPort(flag: string, value: string): HostPort {
  const match = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(value.trim());
  const port = match ? Number(match[3]) : Number.NaN;
  if (!match || port > 65_535) {
    throw usageError(`--${flag} must be host:port (port 0-65535), got '${value}'`, { flag });
  }
  return { host: match[1] ?? (match[2] || '127.0.0.1'), port };
}

/**
 * A list of `host:port` targets to connect to (port 0 is not a target), written out in full:
 * `:7000` becomes `127.0.0.1:7000`, as it means when listening (gRPC cannot resolve an empty host).
 */
export function parseTargets(flag: string, values: string[]): string[] {
  if (values.length === 0) throw usageError(`--${flag} needs at least one host:port`, { flag });
  return values.map((value) => {
    const { host, port } = parseHostPort(flag, value);
    if (port === 0) throw usageError(`--${flag}: port 0 is not a valid target in '${value}'`, { flag });
    return formatHostPort(host, port);
  });
}

/** The longest a Node timer waits (2^31 - 1 ms, 24.8 days), in whole seconds: a longer delay fires at once. */
export const MAX_TIMER_SECONDS = Math.floor((2 ** 31 - 1) / 1000);

export function numberFlag(
  values: FlagValues,
  name: string,
  fallback: number,
  {
    min = 0,
    max = Number.POSITIVE_INFINITY,
    integer = false,
  }: { min?: number; max?: number; integer?: boolean } = {},
): number {
  const text = stringFlag(values, name);
  if (text === undefined) return fallback;
  const value = Number(text);
  if (
    text.trim() === '' ||
    !Number.isFinite(value) ||
    value < min ||
    value > max ||
    (integer && !Number.isInteger(value))
  ) {
    const range = max === Number.POSITIVE_INFINITY ? `>= ${min}` : `from ${min} to ${max}`;
    throw usageError(`--${name} must be ${integer ? 'an integer' : 'a number'} ${range}, got '${text}'`, {
      flag: name,
    });
  }
  return value;
}
