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
