// README's Install section names every subpath export package.json declares (a new export is
// documented where a user looks first).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

test('README names every subpath export of package.json', () => {
  const exports = Object.keys(
    (JSON.parse(readFileSync('package.json', 'utf8')) as { exports: Record<string, unknown> }).exports,
  );
  const install = readFileSync('README.md', 'utf8').split('## Install')[1]!.split('\n## ')[0]!;
  const missing = exports
    .map((subpath) => (subpath === '.' ? 'spillway' : `spillway/${subpath.slice(2)}`))
    .filter((name) => !install.includes(`\`${name}\``));
  assert.deepEqual(missing, []);
});
