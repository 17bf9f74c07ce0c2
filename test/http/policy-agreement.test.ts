import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { watchPolicyAgreement } from '../../src/http/proxy/policy-agreement.js';
import { compileKeyTemplate } from '../../src/http/rules/key-template.js';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { harness } from '../global/fixtures.js';

/**
 * A proxy rule's own limit / windowSec feed RateLimit-Policy; with the global backend the
 * controller's limitRps is what is enforced. When the two disagree the proxy warns (issue #35),
 * once per rule and limit.
 */
const rules = parseProxyRules(
  `version: 1
upstream: { url: "http://127.0.0.1:9" }
backend: { kind: global, aggregators: ["127.0.0.1:9"], zone: z1 }
buckets:
  - name: payments
    key: payments:charge
    limit: 500
    windowSec: 1
  - name: per-caller
    key: "api:caller={headerHash:x-api-key}"
    limit: 600
    windowSec: 60
`,
  'r.yaml',
);

describe('proxy rule limits against the controller', () => {
  it('warns once per rule and limit when the controller enforces another limit', async () => {
    const { limiter, aggregator, flush } = harness();
    limiter.bucket('payments:charge');
    limiter.allow('api:caller=822b33ad87c148a0');
    limiter.allow('api:caller=0123456789abcdef');
    aggregator.set('payments:charge', { dropRatio: 0, limitRps: 500 });
    aggregator.set('api:caller=822b33ad87c148a0', { dropRatio: 0, limitRps: 1000 });
    aggregator.set('api:caller=0123456789abcdef', { dropRatio: 0, limitRps: 1000 });
    await flush();
    const lines: [Record<string, unknown>, string][] = [];
    const stop = watchPolicyAgreement({
      limiter,
      buckets: () => rules.buckets,
      logger: { warn: (obj, msg) => lines.push([obj as Record<string, unknown>, msg]) },
      checkEveryMs: 5,
    });
    try {
      await delay(60);
      assert.equal(lines.length, 1, JSON.stringify(lines));
      const [fields, message] = lines[0]!;
      assert.equal(fields.bucket, 'per-caller');
      assert.equal(fields.controllerLimitRps, 1000);
      assert.match(
        message,
        /says 600 per 60 s \(10\/s\) in RateLimit-Policy, but the controller limits "api:caller=[0-9a-f]{16}" to 1000\/s/,
      );
    } finally {
      stop();
    }
  });

  it('says nothing when they agree', async () => {
    const { limiter, aggregator, flush } = harness();
    limiter.bucket('payments:charge');
    aggregator.set('payments:charge', { dropRatio: 0, limitRps: 500 });
    await flush();
    const lines: string[] = [];
    const stop = watchPolicyAgreement({
      limiter,
      buckets: () => rules.buckets,
      logger: { warn: (_obj, msg) => lines.push(msg) },
      checkEveryMs: 5,
    });
    await delay(40);
    stop();
    assert.deepEqual(lines, []);
  });
});

describe('KeyTemplate.matches', () => {
  it('tells the keys a template renders from others', () => {
    const template = compileKeyTemplate('api:caller={headerHash:x-api-key}:m={method}', []);
    assert.equal(template.matches('api:caller=822b33ad87c148a0:m=GET'), true);
    assert.equal(
      template.matches('api:caller=:m=GET'),
      false,
      'a placeholder renders at least one character',
    );
    assert.equal(template.matches('payments:caller=x:m=GET'), false);
    assert.equal(template.matches(`api:caller=~h.${'a'.repeat(32)}`), true, 'a folded long key');
    assert.equal(compileKeyTemplate('payments:charge', []).matches('payments:charge'), true);
    assert.equal(compileKeyTemplate('payments:charge', []).matches('payments:charged'), false);
    assert.equal(
      compileKeyTemplate('a.b={client}', []).matches('aXb=1'),
      false,
      'literal text is not a pattern',
    );
  });
});
