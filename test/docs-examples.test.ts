import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parse } from 'yaml';
import { compileLimits, matchBucket } from '../src/config/compile-limits.js';
import { parseLimitsConfig } from '../src/config/limits-config.js';
import { parseRateLimitConfig } from '../src/envoy/ratelimit-config.js';
import { parseProxyRules } from '../src/http/rules/proxy-rules.js';
import { parseScenario } from '../src/sim/scenario.js';
import { exportedMetricNames, isExported } from './deploy/exported-metrics.js';

/**
 * Every ```yaml example in docs/ loads with the loader it is written for, so an example a reader
 * copies is never refused (README examples: test/readme.test.ts; TypeScript examples:
 * test/docs-typescript.test.ts). An example may be a fragment of a file (a `backend:` mapping, a
 * `buckets:` list): the fields it leaves out are filled with the smallest valid ones, never
 * overriding what it sets.
 */
const examples = readdirSync('docs')
  .filter((name) => name.endsWith('.md'))
  .flatMap((name) => {
    const text = readFileSync(join('docs', name), 'utf8');
    return [...text.matchAll(/^( *)```yaml\n([\s\S]*?)^\1```$/gm)].map((m) => {
      const indent = m[1]!;
      const body = m[2]!
        .split('\n')
        .map((line) => (line.startsWith(indent) ? line.slice(indent.length) : line))
        .join('\n');
      const line = text.slice(0, m.index).split('\n').length;
      return { where: `docs/${name}:${line}`, body };
    });
  });

/** The top-level fields an example leaves out, as YAML lines to put before it. */
function missing(fields: Record<string, string>, doc: Record<string, unknown>): string {
  return Object.entries(fields)
    .filter(([field]) => !(field in doc))
    .map(([field, value]) => `${field}: ${value}\n`)
    .join('');
}

function load(body: string, file: string): void {
  const doc = parse(body) as Record<string, unknown>;
  assert.equal(typeof doc, 'object', 'an example is a YAML mapping');
  if ('upstream' in doc || 'backend' in doc) {
    const filler = {
      version: '1',
      upstream: '{ url: "http://127.0.0.1:3000" }',
      backend: '{ kind: local }',
      buckets: '[]',
    };
    parseProxyRules(missing(filler, doc) + body, file);
  } else if ('seconds' in doc && 'buckets' in doc) {
    parseScenario(doc, file);
  } else if ('buckets' in doc) {
    parseLimitsConfig(missing({ version: '1' }, doc) + body, file);
  } else if ('domain' in doc) {
    parseRateLimitConfig(body, file);
  } else if ('static_resources' in doc || doc.kind === 'EnvoyFilter') {
    // Envoy's and Istio's own files (docs/envoy.md): no Envoy runs here; every type they name is
    // one of Envoy's (a typo in a type URL is what Envoy refuses first).
    for (const [, type] of body.matchAll(/"@type": (\S+)/g)) {
      assert.match(type!, /^type\.googleapis\.com\/envoy\.[a-z_.0-9]+\.v3\.[A-Za-z]+$/, `${file}: ${type}`);
    }
  } else {
    assert.fail('no loader for this example: give it a test of its own here');
  }
}

describe('docs YAML examples', () => {
  it('has examples', () => assert.ok(examples.length >= 3, `found ${examples.length}`));
  for (const { where, body } of examples) {
    it(`${where} loads`, () => load(body, where));
  }
});

describe('metric names in the docs', () => {
  it('are exported by the code', () => {
    const exported = exportedMetricNames();
    const docs = ['README.md', 'deploy/README.md', ...readdirSync('docs').map((name) => `docs/${name}`)];
    const unknown: string[] = [];
    for (const file of docs.filter((name) => name.endsWith('.md'))) {
      // A name ending in `_` is a prefix (`grep '^spillway_controller_'`), not a metric.
      for (const [name] of readFileSync(file, 'utf8').matchAll(/\bspillway_[a-z0-9_]*[a-z0-9]\b(?!_)/g)) {
        if (!isExported(exported, name)) unknown.push(`${file}: ${name}`);
      }
    }
    assert.deepEqual(unknown, []);
  });
});

/**
 * The example files go together (README "Running the global limiter"): every key the global rules
 * render is a bucket the example limits have a rule for, at the limit the rule says in
 * RateLimit-Policy, and every template rule a doc's example keys by is in examples/limits.yaml.
 * (That the override applies end to end: test/integration/examples.test.ts.)
 */
describe('the example files agree', () => {
  const limits = compileLimits(
    parseLimitsConfig(readFileSync('examples/limits.yaml', 'utf8'), 'limits.yaml'),
  );
  const rules = parseProxyRules(readFileSync('examples/proxy-rules-global.yaml', 'utf8'), 'rules.yaml');

  for (const bucket of rules.buckets) {
    it(`proxy-rules-global.yaml's ${bucket.config.name} keys a bucket limits.yaml limits as its rule says`, () => {
      const key = bucket.key.render({
        client: '203.0.113.7',
        method: 'POST',
        route: '/v1',
        params: { id: '42' },
        // A caller without an override: the rule's own limit applies.
        header: (name) => (name === 'x-api-key' ? 'zed' : undefined),
      });
      const resolved = matchBucket(limits, key);
      assert.ok(resolved, `no rule of examples/limits.yaml matches "${key}": it would not be limited`);
      assert.equal(bucket.config.limit / bucket.config.windowSec, resolved.limitRps, key);
    });
  }

  it("every template rule a doc's example keys by is in examples/limits.yaml", () => {
    const templates = new Set(limits.config.buckets.map((rule) => rule.template).filter(Boolean));
    const named = ['README.md', ...readdirSync('docs').map((name) => `docs/${name}`)]
      .filter((file) => file.endsWith('.md'))
      .flatMap((file) =>
        [...readFileSync(file, 'utf8').matchAll(/template rule `([^`]+)`/g)].map((m) => [file, m[1]!]),
      );
    assert.ok(named.length > 0);
    assert.deepEqual(
      named.filter(([, template]) => !templates.has(template)),
      [],
    );
  });
});
