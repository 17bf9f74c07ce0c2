import assert from 'node:assert/strict';
import {
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { updateLimitsText, writeLimitsFile } from '../../src/control/tuning/limits-file-writer.js';
import { isSpillwayError } from '../../src/core/errors.js';

const dir = mkdtempSync(join(tmpdir(), 'spillway-limits-writer-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const LIMITS = `# Spillway limits (comment kept)
version: 1
intervalMs: 1000

buckets:
  # payments: tuned automatically
  - key: payments:charge
    limitRps: 500 # was 400 in January
    tuning:
      auto: true
  - key: "search:query"
    limitRps: 200
    scope: zone
  - template: "api:caller=*"
    limitRps: 100
`;

describe('limits file writer', () => {
  it('changes only the named limits and keeps comments, quoting and blank lines', () => {
    const { text, config } = updateLimitsText(LIMITS, [{ bucket: 'payments:charge', limitRps: 600 }]);
    assert.equal(text, LIMITS.replace('limitRps: 500 # was', 'limitRps: 600 # was'));
    assert.equal(config.buckets[0]!.limitRps, 600);
    const both = updateLimitsText(LIMITS, [
      { bucket: 'payments:charge', limitRps: 1.5 },
      { bucket: 'search:query', limitRps: 250 },
    ]).text;
    assert.equal(
      both,
      LIMITS.replace('limitRps: 500 #', 'limitRps: 1.5 #').replace('limitRps: 200\n', 'limitRps: 250\n'),
    );
  });

  it('refuses a change naming no key rule, a bad value or an invalid file, naming the file', () => {
    for (const [text, changes, pattern] of [
      [LIMITS, [{ bucket: 'nope', limitRps: 1 }], /^x\.yaml: has no rule with key "nope"$/],
      [LIMITS, [{ bucket: 'api:caller=*', limitRps: 1 }], /has no rule with key "api:caller=\*"/],
      [LIMITS, [{ bucket: 'payments:charge', limitRps: -1 }], /must be a finite number >= 0, got -1/],
      [LIMITS, [{ bucket: 'payments:charge', limitRps: Number.NaN }], /got NaN/],
      ['version: 2\nbuckets: []\n', [], /^x\.yaml:1:10: version: must be 1/],
    ] as const) {
      assert.throws(
        () => updateLimitsText(text, changes, 'x.yaml'),
        (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG') && pattern.test(error.message),
        String(pattern),
      );
    }
  });

  it('writes atomically: the new file replaces the old by rename, mode kept, no temp left', async () => {
    const path = join(dir, 'limits.yaml');
    writeFileSync(path, LIMITS, { mode: 0o640 });
    const inodeBefore = statSync(path).ino;
    const config = await writeLimitsFile(path, [{ bucket: 'payments:charge', limitRps: 550 }]);
    assert.equal(config.buckets[0]!.limitRps, 550);
    assert.equal(parseLimitsConfig(readFileSync(path, 'utf8')).buckets[0]!.limitRps, 550);
    assert.notEqual(
      statSync(path).ino,
      inodeBefore,
      'a new inode: replaced by rename, not rewritten in place',
    );
    assert.equal(statSync(path).mode & 0o777, 0o640);
    assert.deepEqual(readdirSync(dir), ['limits.yaml']);
  });

  it('writes through a symbolic link: the file it points to changes, the link stays a link', async () => {
    const source = mkdtempSync(join(dir, 'source-'));
    const real = join(source, 'limits.yaml');
    writeFileSync(real, LIMITS);
    const link = join(dir, 'linked.yaml');
    symlinkSync(real, link);
    await writeLimitsFile(link, [{ bucket: 'payments:charge', limitRps: 600 }]);
    assert.ok(lstatSync(link).isSymbolicLink(), 'still a link');
    assert.equal(parseLimitsConfig(readFileSync(real, 'utf8')).buckets[0]!.limitRps, 600);
    assert.deepEqual(readdirSync(source), ['limits.yaml'], 'no temp left beside the target');
  });

  it('an invalid change leaves the file untouched', async () => {
    const path = join(dir, 'untouched.yaml');
    writeFileSync(path, LIMITS);
    await assert.rejects(
      writeLimitsFile(path, [{ bucket: 'nope', limitRps: 1 }]),
      /has no rule with key "nope"/,
    );
    assert.equal(readFileSync(path, 'utf8'), LIMITS);
    await assert.rejects(writeLimitsFile(join(dir, 'missing.yaml'), []), /cannot read limits file/);
  });
});
