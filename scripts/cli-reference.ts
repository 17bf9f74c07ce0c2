// Writes docs/cli.md from the commands' flag declarations: `npm run docs:cli`.
import { writeFileSync } from 'node:fs';
import { renderCliReference } from '../src/cli/cli-reference.js';
import { loadCommandSpecs } from '../src/cli/command-specs.js';

writeFileSync('docs/cli.md', renderCliReference(await loadCommandSpecs()));
console.log('wrote docs/cli.md');
