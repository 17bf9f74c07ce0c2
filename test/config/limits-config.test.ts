import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { compileLimits, matchBucket } from '../../src/config/compile-limits.js';
import { loadLimitsConfig, parseLimitsConfig } from '../../src/config/limits-config.js';
import { DEFAULT_RATIO_POLICY } from '../../src/control/ratio-policy.js';
import { isSpillwayError } from '../../src/core/errors.js';

const fixtures = join(import.meta.dirname, 'fixtures');

/** One fixture per failure, each with the exact message an operator sees (envoyproxy/ratelimit habit). */
const failures: [file: string, message: string][] = [
  [
    'bad-template.yaml',
    'bad-template.yaml:3:15: buckets[0].template: "api:caller=*:route=*" must contain exactly one "*", found 2',
  ],
  [
    'template-without-star.yaml',
    'template-without-star.yaml:3:15: buckets[0].template: "api:caller" must contain exactly one "*", found 0',
  ],
  [
    'duplicate-rule.yaml',
    'duplicate-rule.yaml:7:10: buckets[2].key: duplicate rule for key "payments:charge" (first at buckets[0])',
  ],
  ['duplicate-yaml-key.yaml', 'duplicate-yaml-key.yaml:5:5: YAML syntax error: Map keys must be unique'],
  [
    'key-and-template.yaml',
    'key-and-template.yaml:3:5: buckets[0]: needs exactly one of "key" or "template"',
  ],
  [
    'key-with-star.yaml',
    'key-with-star.yaml:3:10: buckets[0].key: "api:*" contains "*"; use "template" for patterns',
  ],
  ['limit-not-number.yaml', 'limit-not-number.yaml:4:15: buckets[0].limitRps: expected number, got "lots"'],
  ['missing-limit.yaml', 'missing-limit.yaml:3:5: buckets[0].limitRps: is required (number)'],
  // A typo is reported as itself, with what it was meant to be, not as the field it left out.
  [
    'misspelt-field.yaml',
    'misspelt-field.yaml:4:5: buckets[0]: unknown field "limt"; did you mean "limitRps"? (allowed: key, template, limitRps, mode, scope, overrides, maxInstances, tuning)',
  ],
  [
    'proxy-rule-fields.yaml',
    'proxy-rule-fields.yaml:5:5: buckets[0]: unknown fields "limit", "windowSec"; the limits file has no window: write limitRps, units per second (a proxy rule\'s limit / windowSec) (allowed: key, template, limitRps, mode, scope, overrides, maxInstances, tuning)',
  ],
  ['negative-limit.yaml', 'negative-limit.yaml:4:15: buckets[0].limitRps: must be >= 0, got -5'],
  ['negative-override.yaml', 'negative-override.yaml:6:13: buckets[0].overrides.acme: must be >= 0, got -1'],
  ['not-a-mapping.yaml', 'not-a-mapping.yaml:1:1: top level: expected a mapping, got a list'],
  [
    'overrides-on-key.yaml',
    'overrides-on-key.yaml:6:7: buckets[0].overrides: is only allowed on a template rule',
  ],
  [
    'ttl-below-interval.yaml',
    'ttl-below-interval.yaml:3:8: ttlMs: must be at least intervalMs (2000), got 1000',
  ],
  [
    'unknown-field.yaml',
    'unknown-field.yaml:4:5: buckets[0]: unknown field "limit"; the limits file has no window: write limitRps, units per second (a proxy rule\'s limit / windowSec) (allowed: key, template, limitRps, mode, scope, overrides, maxInstances, tuning)',
  ],
  [
    'unknown-mode.yaml',
    'unknown-mode.yaml:5:11: buckets[0].mode: must be one of "enforce", "shadow", got "block"',
  ],
  [
    'unknown-ratio-policy.yaml',
    'unknown-ratio-policy.yaml:3:9: ratioPolicy.kind: must be one of "plain", "ewma", "corrected", got "magic"',
  ],
  [
    'unknown-top-field.yaml',
    'unknown-top-field.yaml:2:1: top level: unknown field "interval"; did you mean "intervalMs"? (allowed: version, intervalMs, ttlMs, buckets, ratioPolicy)',
  ],
  [
    'tuning-auto-not-boolean.yaml',
    'tuning-auto-not-boolean.yaml:6:13: buckets[0].tuning.auto: expected boolean, got "yes-please"',
  ],
  [
    'tuning-floor-above-ceiling.yaml',
    'tuning-floor-above-ceiling.yaml:6:17: buckets[0].tuning.floorRps: must be at most ceilingRps (800), got 900',
  ],
  [
    'tuning-negative-headroom.yaml',
    'tuning-negative-headroom.yaml:7:17: buckets[0].tuning.headroom: must be >= 0, got -0.1',
  ],
  [
    'tuning-on-template.yaml',
    'tuning-on-template.yaml:6:7: buckets[0].tuning: is only allowed on a key rule',
  ],
  [
    'tuning-quantile-above-one.yaml',
    'tuning-quantile-above-one.yaml:6:17: buckets[0].tuning.quantile: must be <= 1, got 95',
  ],
  [
    'tuning-unknown-field.yaml',
    'tuning-unknown-field.yaml:7:7: buckets[0].tuning: unknown field "headrom"; did you mean "headroom"? (allowed: auto, headroom, quantile, floorRps, ceilingRps, maxChangePerDay)',
  ],
  ['wrong-version.yaml', 'wrong-version.yaml:1:10: version: must be 1, got 2'],
  // `.txt`: biome parses every .yaml file in the tree and would refuse this deliberately broken one.
  [
    'yaml-syntax.yaml.txt',
    'yaml-syntax.yaml.txt:3:1: YAML syntax error: Flow sequence in block collection must be sufficiently indented and end with a ]',
  ],
  ['unresolved-alias.yaml', 'unresolved-alias.yaml:4:15: YAML error: alias *undefined-anchor has no anchor'],
  // Read as the number 7, the key would have become "7" and limited a different instance.
  [
    'numeric-override-key.yaml',
    'numeric-override-key.yaml:6:7: YAML error: key 007 is not a string; quote it ("007") if it is a name',
  ],
  // 42 and "42" are one name: the second would silently replace the first.
  ['numeric-key-twice.yaml', 'numeric-key-twice.yaml:7:7: YAML error: key 42 is given twice'],
  // YAML 1.1 would read 16:40 as 1000 (base 60). `.txt` for biome, as above.
  [
    'yaml-1.1.yaml.txt',
    'yaml-1.1.yaml.txt:1:1: YAML error: %YAML 1.1 is not supported; Spillway files are YAML 1.2',
  ],
];

describe('limits config', () => {
  for (const [file, message] of failures) {
    it(`refuses ${file} with its exact message`, () => {
      const text = readFileSync(join(fixtures, file), 'utf8');
      assert.throws(
        () => parseLimitsConfig(text, file),
        (error) => {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'), String(error));
          assert.equal(error.message, message);
          const [, line, column] = /^[^:]+:(\d+):(\d+):/.exec(message)!;
          assert.equal(error.details?.file, file);
          assert.equal(error.details?.line, Number(line));
          assert.equal(error.details?.column, Number(column));
          return true;
        },
      );
    });
  }

  it('every fixture file is covered by a case above', async () => {
    const { readdirSync } = await import('node:fs');
    const files = readdirSync(fixtures).filter((f) => f !== 'valid.yaml');
    assert.deepEqual(files.sort(), failures.map(([f]) => f).sort());
  });

  it("docs/limits-config.md's error examples are the messages asserted above", () => {
    const doc = readFileSync(join(import.meta.dirname, '../../docs/limits-config.md'), 'utf8');
    const rows = [...doc.matchAll(/^\| `([^`]+\.yaml(?:\.txt)?)` \| `(.+)` \|$/gm)].map(
      (m) => [m[1]!, m[2]!] as const,
    );
    assert.ok(rows.length >= 10, `found ${rows.length} rows`);
    const expected = new Map(failures);
    for (const [file, message] of rows) assert.equal(message, expected.get(file), file);
  });

  it('details carry the path of the field at fault', () => {
    try {
      parseLimitsConfig(readFileSync(join(fixtures, 'unknown-mode.yaml'), 'utf8'), 'x.yaml');
      assert.fail('should throw');
    } catch (error) {
      assert.ok(isSpillwayError(error));
      assert.deepEqual(error.details, { file: 'x.yaml', line: 5, column: 11, path: 'buckets[0].mode' });
    }
  });

  it('takes a whole number written as it prints as an override key (a tenant id): its text is its name', () => {
    const config = parseLimitsConfig(
      'version: 1\nbuckets:\n  - template: "tenant:*"\n    limitRps: 10\n    overrides:\n      42: 500\n      -3: 5\n',
      'l.yaml',
    );
    assert.deepEqual(config.buckets[0]!.overrides, { '42': 500, '-3': 5 });
  });

  it('parses a valid file and fills defaults', () => {
    const config = parseLimitsConfig(readFileSync(join(fixtures, 'valid.yaml'), 'utf8'));
    assert.deepEqual(config, {
      version: 1,
      intervalMs: 1000,
      ttlMs: 4000,
      buckets: [
        { key: 'payments:charge', limitRps: 500, mode: 'enforce', scope: 'global' },
        {
          template: 'api:caller=*',
          limitRps: 100,
          mode: 'shadow',
          scope: 'zone',
          overrides: { acme: 1000 },
          maxInstances: 10_000,
        },
      ],
    });
  });

  it("keeps a key rule's tuning settings, auto defaulting to false", () => {
    const config = parseLimitsConfig(
      'version: 1\nbuckets:\n  - key: a\n    limitRps: 10\n    tuning:\n      headroom: 0.5\n      ceilingRps: 90\n',
    );
    assert.deepEqual(config.buckets[0]?.tuning, { auto: false, headroom: 0.5, ceilingRps: 90 });
  });

  it('parses examples/limits.yaml (the documented example stays valid)', async () => {
    const config = await loadLimitsConfig(join(import.meta.dirname, '../../examples/limits.yaml'));
    // Six rules: issue #35 added `payments:caller=*` (docs/middleware.md's example keys by it), #36
    // `api:client=*` (the example rules pair the per-caller bucket with a per-client one).
    assert.equal(config.buckets.length, 6);
    // It shows the default policy, as its comment says.
    assert.deepEqual(config.ratioPolicy, DEFAULT_RATIO_POLICY);
  });

  it('loadLimitsConfig: a missing file is ERR_SPILLWAY_INVALID_CONFIG naming the path', async () => {
    await assert.rejects(loadLimitsConfig('/nonexistent/limits.yaml'), (error) => {
      assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'));
      assert.match(error.message, /^\/nonexistent\/limits\.yaml: cannot read limits file: ENOENT/);
      return true;
    });
  });

  it('compileLimits validates configs built in code with the same rules (path, no position)', () => {
    assert.throws(
      () =>
        compileLimits({
          version: 1,
          intervalMs: 1000,
          ttlMs: 4000,
          buckets: [{ template: 'a:*:*', limitRps: 1, mode: 'enforce', scope: 'global' }],
        }),
      (error) =>
        isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG') &&
        error.message === 'buckets[0].template: "a:*:*" must contain exactly one "*", found 2',
    );
  });
});

describe('matchBucket', () => {
  const limits = compileLimits({
    version: 1,
    intervalMs: 1000,
    ttlMs: 4000,
    buckets: [
      { key: 'api:caller=vip', limitRps: 7, mode: 'enforce', scope: 'global' },
      { template: 'api:*', limitRps: 1, mode: 'enforce', scope: 'global' },
      {
        template: 'api:caller=*',
        limitRps: 100,
        mode: 'shadow',
        scope: 'zone',
        overrides: { acme: 1000 },
        maxInstances: 5,
      },
      { template: '*:read', limitRps: 3, mode: 'enforce', scope: 'global' },
    ],
  });

  it('exact key first, then the most specific template, with overrides by the matched text', () => {
    assert.equal(matchBucket(limits, 'api:caller=vip')?.limitRps, 7);
    assert.deepEqual(matchBucket(limits, 'api:caller=acme'), {
      key: 'api:caller=acme',
      limitRps: 1000,
      mode: 'shadow',
      scope: 'zone',
      rule: 'api:caller=*',
      instance: 'acme',
      maxInstances: 5,
    });
    assert.equal(matchBucket(limits, 'api:caller=zed')?.limitRps, 100);
    assert.equal(matchBucket(limits, 'api:other')?.rule, 'api:*');
    assert.equal(matchBucket(limits, 'files:read')?.instance, 'files');
  });

  it('the star matches at least one character; no rule means undefined', () => {
    assert.equal(matchBucket(limits, 'api:caller=')?.rule, 'api:*');
    assert.equal(matchBucket(limits, 'api:'), undefined);
    assert.equal(matchBucket(limits, ':read'), undefined);
    assert.equal(matchBucket(limits, 'payments'), undefined);
  });
});
