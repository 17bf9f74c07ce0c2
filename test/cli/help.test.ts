import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { it } from 'node:test';

// Runs the real bin against the compiled package (npm test builds first), as a user would.
it('spillway --help prints usage and exits 0', () => {
  const out = execFileSync(process.execPath, ['bin/spillway.js', '--help'], { encoding: 'utf8' });
  assert.match(out, /Usage: spillway <command>/);
});

it('spillway with an unknown command exits 2', () => {
  assert.throws(
    () => execFileSync(process.execPath, ['bin/spillway.js', 'no-such-command'], { stdio: 'pipe' }),
    (error: { status?: number }) => error.status === 2,
  );
});
