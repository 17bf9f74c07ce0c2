import { headerHash } from '../http/rules/key-template.js';
import { exitQuietlyWhenStdoutCloses } from './closed-stdout.js';
import { type CommandSpec, listFlag, runCommand } from './command-line.js';

export const spec: CommandSpec = {
  name: 'header-hash',
  summary:
    'Print what a rules file key placeholder {headerHash:name} renders for a header value: the first 16 hex ' +
    'digits of its SHA-256. Name a hashed caller this way in the limits file (a template override).',
  flags: {
    value: {
      type: 'string',
      valueName: 'text',
      description: 'the header value, exactly as clients send it',
      multiple: true,
      required: true,
    },
  },
  notes: [
    'Prints one hash per --value, in order. The value is read from the command line: mind your shell history',
    'for secrets (read it from a file: --value "$(cat key.txt)").',
    'Example: spillway header-hash --value acme   ->   822b33ad87c148a0',
    '  then, in limits.yaml:  - template: "api:caller=*"  ...  overrides: { "822b33ad87c148a0": 1000 }',
  ],
};

export function run(argv: string[]): Promise<number> {
  exitQuietlyWhenStdoutCloses();
  return runCommand(spec, argv, async (values) => {
    for (const value of listFlag(values, 'value')) process.stdout.write(`${headerHash(value)}\n`);
    return 0;
  });
}
