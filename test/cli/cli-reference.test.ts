import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { it } from 'node:test';
import { renderCliReference } from '../../src/cli/cli-reference.js';
import { loadCommandSpecs } from '../../src/cli/command-specs.js';

it("docs/cli.md matches the commands' flag declarations (regenerate: npm run docs:cli)", async () => {
  const specs = await loadCommandSpecs();
  assert.ok(specs.length >= 5, `only ${specs.length} commands declare flags`);
  assert.equal(readFileSync('docs/cli.md', 'utf8'), renderCliReference(specs));
});

/** The doc files whose flag tables describe one command's flags (`| flag | default | meaning |`). */
const FLAG_TABLES: Record<string, string> = {
  'docs/proxy.md': 'proxy',
  'docs/dashboard.md': 'controller',
  'docs/tuning.md': 'tune',
};

it('flag tables in the other docs name real flags, with their declared defaults', async () => {
  const specs = new Map((await loadCommandSpecs()).map((spec) => [spec.name, spec]));
  let checked = 0;
  for (const [file, command] of [...Object.entries(FLAG_TABLES), ['docs/security.md', '']] as const) {
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      if (!line.startsWith('| `--')) continue;
      const [flagCell, secondCell] = line.split(' | ');
      // docs/security.md: the second column names the commands that take the flags.
      const commands = command === '' ? secondCell!.split(', ') : [command];
      for (const flag of flagCell!.matchAll(/`--([a-z-]+)/g)) {
        for (const name of commands) {
          const declared = specs.get(name)?.flags[flag[1]!];
          assert.ok(declared, `${file}: --${flag[1]} is not a flag of spillway ${name}`);
          // A default written as one code span must be the declared one, which may go on in words
          // (`10000` for `10000 (10 s)`, not for `100000`).
          const single = /^`([^`]+)`$/.exec(secondCell!);
          if (command !== '' && single && declared.defaultText !== undefined) {
            assert.ok(
              declared.defaultText.startsWith(single[1]!) &&
                /^(?:$|[^\w.])/.test(declared.defaultText.slice(single[1]!.length)),
              `${file}: --${flag[1]} defaults to '${declared.defaultText}', not '${single[1]}'`,
            );
          }
          checked++;
        }
      }
    }
  }
  assert.ok(checked >= 20, `checked ${checked} flags`);
});
