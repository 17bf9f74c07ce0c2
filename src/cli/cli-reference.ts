import type { CommandSpec, FlagSpec } from './command-line.js';

/**
 * docs/cli.md is generated from the commands' own flag declarations (the same `CommandSpec` that
 * parses flags and prints `--help`), so the reference cannot drift from the code:
 * test/cli/cli-reference.test.ts fails when the committed file differs from what this renders.
 * Regenerate with `npm run docs:cli`.
 */
export function renderCliReference(specs: CommandSpec[]): string {
  const sections = [...specs]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((spec) => {
      const rows = Object.entries(spec.flags).map(
        ([name, flag]) =>
          `| ${flagCell(name, flag)} | ${notesCell(flag)} | ${escapeCell(flag.description)} |`,
      );
      return [
        `## spillway ${spec.name}`,
        '',
        escapeCell(spec.summary),
        '',
        '| flag | default | meaning |',
        '|---|---|---|',
        ...rows,
        ...(spec.notes && spec.notes.length > 0 ? ['', ...spec.notes.map(escapeCell)] : []),
        '',
      ].join('\n');
    });
  return [
    '# Command-line reference',
    '',
    "<!-- Generated from the commands' flag declarations by `npm run docs:cli`; do not edit by hand. -->",
    '',
    'Every command also takes `-h, --help`. A malformed invocation exits 2 with',
    '`ERR_SPILLWAY_INVALID_USAGE`. See docs/operations.md for how the processes fit together.',
    '',
    ...sections,
  ].join('\n');
}

function flagCell(name: string, flag: FlagSpec): string {
  const short = flag.short ? `-${flag.short}, ` : '';
  const value = flag.type === 'string' ? ` <${flag.valueName ?? 'value'}>` : '';
  return `\`${short}--${name}${escapeCell(value)}\``;
}

function notesCell(flag: FlagSpec): string {
  return [
    flag.required ? 'required' : '',
    flag.defaultText ? escapeCell(flag.defaultText) : '',
    flag.multiple ? 'repeatable' : '',
  ]
    .filter(Boolean)
    .join('; ');
}

function escapeCell(text: string): string {
  return text.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}
