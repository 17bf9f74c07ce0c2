import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { run } from '../../src/cli/sim.js';

/** Captures what `run` writes to stdout and stderr. */
async function capture(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const write = (sink: 'out' | 'err') => (chunk: string | Uint8Array) => {
    if (sink === 'out') out += String(chunk);
    else err += String(chunk);
    return true;
  };
  const stdoutWrite = process.stdout.write;
  const stderrWrite = process.stderr.write;
  process.stdout.write = write('out') as typeof process.stdout.write;
  process.stderr.write = write('err') as typeof process.stderr.write;
  try {
    const code = await run(argv);
    return { code, out, err };
  } finally {
    process.stdout.write = stdoutWrite;
    process.stderr.write = stderrWrite;
  }
}

describe('spillway sim', () => {
  it('runs a preset, prints the table and writes the JSON and SVG', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'spillway-sim-cli-'));
    const { code, out } = await capture([
      '--scenario',
      'step-3x',
      '--hosts',
      '20',
      '--zones',
      '2',
      '--seconds',
      '8',
      '--variants',
      'exact,plain',
      '--out',
      dir,
    ]);
    assert.equal(code, 0);
    assert.match(out, /exact centralized/);
    assert.match(out, /plain formula/);
    assert.match(out, /peak overshoot %/);
    const json = JSON.parse(readFileSync(join(dir, 'step-3x.json'), 'utf8'));
    assert.equal(json.scenario.hosts, 20);
    assert.match(json.command, /--hosts 20/);
    assert.ok(existsSync(join(dir, 'step-3x.svg')));
    assert.match(
      readFileSync(join(dir, 'step-3x.svg'), 'utf8'),
      /^<svg[^>]*>[\s\S]*<polyline[\s\S]*<\/svg>\n$/,
    );
  });

  it('lists presets and prints a scenario as a file template', async () => {
    const list = await capture(['--list']);
    assert.equal(list.code, 0);
    assert.match(list.out, /surge-15x/);
    const printed = await capture(['--scenario', 'hot-caller', '--print-scenario']);
    assert.equal(printed.code, 0);
    assert.equal(JSON.parse(printed.out).name, 'hot-caller');
  });

  it('exits 2 on bad usage', async () => {
    for (const argv of [
      ['--scenario', 'no-such-scenario'],
      ['--variants', 'exact,bogus'],
      ['--hosts', 'many'],
      ['--ratio-policy', 'ewma'],
      ['--unknown-flag'],
      // Valid flags that make the run invalid: the last 100 ms sample would be partial.
      ['--seconds', '2.05', '--hosts', '5', '--zones', '1', '--no-files'],
    ]) {
      const { code, err } = await capture(argv);
      assert.equal(code, 2, argv.join(' '));
      assert.match(
        err,
        /^spillway sim: .* \(ERR_SPILLWAY_INVALID_USAGE\)\nRun 'spillway sim --help' for usage\.\n$/,
      );
    }
    // A scenario file that fails validation names itself, as every config error does.
    const dir = mkdtempSync(join(tmpdir(), 'spillway-sim-cli-'));
    const file = join(dir, 'bad.yaml');
    writeFileSync(file, 'name: team/checkout\nbuckets: [{ key: a, limitRps: 1, offeredRps: [[0, 5]] }]\n');
    const bad = await capture(['--scenario', file, '--no-files']);
    assert.equal(bad.code, 2);
    assert.match(bad.err, /ERR_SPILLWAY_INVALID_CONFIG/);
    assert.ok(bad.err.includes(file), bad.err);
    assert.match(bad.err, /name/);
  });
});
