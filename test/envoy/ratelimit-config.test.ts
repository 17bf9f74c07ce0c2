import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { compileLimits, matchBucket } from '../../src/config/compile-limits.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { escapeComponent, instanceKey, MAX_BUCKET_KEY_BYTES } from '../../src/envoy/bucket-key.js';
import { compileRateLimits, globMatch, matchDescriptor } from '../../src/envoy/descriptor-rules.js';
import { limitsFromRateLimits, OVERRIDE_LIMIT_RPS } from '../../src/envoy/envoy-limits.js';
import { loadRateLimitConfig, parseRateLimitConfig } from '../../src/envoy/ratelimit-config.js';

const fixtures = join(import.meta.dirname, 'fixtures');

/** One fixture per failure, each with the exact message an operator sees (envoyproxy/ratelimit's habit, and its words). */
const failures: [file: string, message: string][] = [
  [
    'duplicate-descriptor.yaml',
    "duplicate-descriptor.yaml:8:10: descriptors[1].key: duplicate descriptor composite key 'mongo_cps.database_users'",
  ],
  ['duplicate-yaml-key.yaml', 'duplicate-yaml-key.yaml:4:5: YAML syntax error: Map keys must be unique'],
  ['empty-domain.yaml', 'empty-domain.yaml:1:9: domain: config file cannot have empty domain'],
  ['empty-key.yaml', 'empty-key.yaml:5:9: descriptors[0].descriptors[0].key: descriptor has empty key'],
  [
    'empty-replaces.yaml',
    'empty-replaces.yaml:9:11: descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry',
  ],
  [
    'invalid-unit.yaml',
    "invalid-unit.yaml:5:13: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'",
  ],
  [
    'misplaced-key.yaml',
    'misplaced-key.yaml:7:7: descriptors[0].rate_limit: unknown field "shadow_mode" (allowed: unit, requests_per_unit, unlimited, name, replaces)',
  ],
  ['missing-unit.yaml', "missing-unit.yaml:5:7: descriptors[0].rate_limit.unit: invalid rate limit unit ''"],
  [
    'negative-requests.yaml',
    'negative-requests.yaml:6:26: descriptors[0].rate_limit.requests_per_unit: must be >= 0, got -1',
  ],
  [
    'requests-not-a-number.yaml',
    'requests-not-a-number.yaml:6:26: descriptors[0].rate_limit.requests_per_unit: expected number, got "lots"',
  ],
  [
    'self-replaces.yaml',
    'self-replaces.yaml:9:17: descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor',
  ],
  [
    'share-threshold-without-wildcard.yaml',
    "share-threshold-without-wildcard.yaml:5:22: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'path_/users'",
  ],
  [
    'top-level-unknown.yaml',
    'top-level-unknown.yaml:2:1: top level: unknown field "descriptor"; did you mean "descriptors"? (allowed: domain, descriptors)',
  ],
  [
    'unknown-key.yaml',
    'unknown-key.yaml:5:7: descriptors[0].rate_limit: unknown field "units"; did you mean "unit"? (allowed: unit, requests_per_unit, unlimited, name, replaces)',
  ],
  [
    'unlimited-with-unit.yaml',
    'unlimited-with-unit.yaml:7:13: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited',
  ],
];

describe('envoyproxy/ratelimit YAML: refused files', () => {
  for (const [file, message] of failures) {
    it(file, () => {
      const text = readFileSync(join(fixtures, 'bad', file), 'utf8');
      assert.throws(
        () => parseRateLimitConfig(text, file),
        (error: unknown) => {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'));
          assert.equal(error.message, message);
          return true;
        },
      );
    });
  }

  it('two files of one directory with the same domain', async () => {
    await assert.rejects(loadRateLimitConfig(join(fixtures, 'dup-domains')), {
      message: `${join(fixtures, 'dup-domains', 'b.yaml')}: duplicate domain 'api' in config file`,
    });
  });

  it('a descriptor path too long to name its buckets', () => {
    const value = 'v'.repeat(240);
    const text = `domain: d\ndescriptors:\n  - key: k\n    value: ${value}\n    descriptors:\n      - key: ip\n        rate_limit: { unit: second, requests_per_unit: 1 }\n`;
    assert.throws(() => compileRateLimits([parseRateLimitConfig(text, 'long.yaml')]), {
      message:
        /^long\.yaml: descriptors\[0\]\.descriptors\[0\]: the descriptor path d\.k=v+\.\.\. is 247 bytes as a bucket key, over the 229 the protocol leaves it/,
    });
  });
});

describe('envoyproxy/ratelimit YAML: matching as the reference server does', () => {
  const spec = parseRateLimitConfig(
    readFileSync(join(fixtures, 'everything.yaml'), 'utf8'),
    'everything.yaml',
  );
  const compiled = compileRateLimits([spec]);
  const domain = compiled.domains.get('edge')!;
  const match = (...pairs: [string, string][]) =>
    matchDescriptor(
      domain,
      pairs.map(([key, value]) => ({ key, value })),
    );

  it('reads every field', () => {
    assert.equal(spec.domain, 'edge');
    const byId = new Map(compiled.rules.map((r) => [r.id, r]));
    assert.deepEqual(
      [...byId.keys()],
      [
        'edge.generic_key=login',
        'edge.remote_address',
        'edge.remote_address.path',
        'edge.path=/api/%2A',
        'edge.path=/static/%2A',
        'edge.path=/health',
        'edge.tenant=beta',
        'edge.quota',
        'edge.blocked_ip=10%2E6%2E6%2E6',
        'edge.user=vip',
        'edge.week',
        'edge.nested.inner=42.leaf',
      ],
    );
    const login = byId.get('edge.generic_key=login')!;
    assert.deepEqual(
      [login.requestsPerUnit, login.unit, login.limitRps, login.name],
      [600, 'minute', 10, 'login'],
    );
    assert.equal(byId.get('edge.path=/health')!.unlimited, true);
    assert.equal(byId.get('edge.tenant=beta')!.shadowMode, true);
    assert.equal(byId.get('edge.tenant=beta')!.detailedMetric, true);
    assert.equal(byId.get('edge.quota')!.quotaMode, true);
    assert.equal(byId.get('edge.quota')!.valueToMetric, true);
    assert.deepEqual(byId.get('edge.user=vip')!.replaces, ['login']);
    assert.deepEqual([byId.get('edge.week')!.unitSeconds, byId.get('edge.week')!.responseUnit], [604_800, 7]);
    assert.equal(spec.descriptors[8]!.metadata?.tier, 'gold');
  });

  it('exact value, then wildcard, then key-only; the limit only at the last entry', () => {
    assert.equal(match(['generic_key', 'login'])?.bucketKey, 'edge.generic_key=login');
    assert.equal(match(['generic_key', 'other']), undefined, 'no key-only generic_key rule');
    assert.equal(match(['remote_address', '10.0.0.1'])?.bucketKey, 'edge.remote_address#10%2E0%2E0%2E1');
    assert.equal(
      match(['remote_address', '10.0.0.1'], ['path', '/a'])?.bucketKey,
      'edge.remote_address.path#10%2E0%2E0%2E1|/a',
    );
    assert.equal(
      match(['remote_address', '10.0.0.1'], ['path', '/a'], ['x', 'y']),
      undefined,
      'deeper than the rule',
    );
    assert.equal(match(['path', '/api/users'])?.bucketKey, 'edge.path=/api/%2A#/api/users');
    assert.equal(
      match(['path', '/static/app.js'])?.bucketKey,
      'edge.path=/static/%2A',
      'shared by every value',
    );
    assert.equal(match(['path', '/health'])?.rule.unlimited, true);
    assert.equal(match(['path', '/other']), undefined);
    assert.equal(match(['nested', 'x']), undefined, 'no rate_limit at that level');
    assert.equal(
      match(['nested', 'x'], ['inner', '42'], ['leaf', 'z'])?.bucketKey,
      'edge.nested.inner=42.leaf#x|z',
    );
    assert.equal(match(['nested', 'x'], ['inner', '43'], ['leaf', 'z']), undefined);
  });

  it('the controller enforces the same file under the same bucket keys', () => {
    const limits = compileLimits(limitsFromRateLimits(compiled));
    for (const [pairs, limitRps, mode] of [
      [[['generic_key', 'login']], 10, 'enforce'],
      [[['remote_address', '10.0.0.1']], 10, 'enforce'],
      [
        [
          ['remote_address', '10.0.0.1'],
          ['path', '/a'],
        ],
        2,
        'enforce',
      ],
      [[['path', '/api/users']], 100, 'enforce'],
      [[['path', '/static/app.js']], 10, 'enforce'],
      [[['tenant', 'beta']], 1, 'shadow'],
      [[['blocked_ip', '10.6.6.6']], 0, 'enforce'],
      [
        [
          ['nested', 'x'],
          ['inner', '42'],
          ['leaf', 'z'],
        ],
        3,
        'enforce',
      ],
    ] as [[string, string][], number, string][]) {
      const key = match(...pairs)!.bucketKey;
      const resolved = matchBucket(limits, key);
      assert.equal(resolved?.limitRps, limitRps, key);
      assert.equal(resolved?.mode, mode, key);
    }
    assert.equal(matchBucket(limits, 'edge.path=/health'), undefined, 'unlimited rules are not tracked');
    assert.equal(matchBucket(limits, 'edge.!override#generic_key%3Dx')?.limitRps, OVERRIDE_LIMIT_RPS);
  });

  it('names a template instance by the values that vary, hashed past 256 bytes, never ambiguous', () => {
    assert.equal(escapeComponent('a.b=c*d#e|f!g%h'), 'a%2Eb%3Dc%2Ad%23e%7Cf%21g%25h');
    assert.equal(instanceKey('d.k', ['']), 'd.k#%00');
    const long = instanceKey('d.k', ['x'.repeat(1_000_000)]);
    assert.match(long, /^d\.k#%H[A-Za-z0-9_-]{24}$/);
    assert.ok(Buffer.byteLength(instanceKey('d.k', ['é'.repeat(200)])) <= MAX_BUCKET_KEY_BYTES);
    assert.notEqual(instanceKey('d.k', ['a|b']), instanceKey('d.k', ['a', 'b']));
  });

  it('glob: * is zero or more characters', () => {
    assert.ok(globMatch('/api/*', '/api/'));
    assert.ok(globMatch('*a*b*', 'xxaxxbxx'));
    assert.ok(!globMatch('a*b', 'ac'));
    assert.ok(globMatch('*', ''));
    const started = performance.now();
    assert.ok(!globMatch('*a*a*a*a*a*b', 'a'.repeat(65_536)));
    assert.ok(performance.now() - started < 2_000, 'no catastrophic backtracking');
  });
});
