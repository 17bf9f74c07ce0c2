import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { rateLimitedBody, rateLimitedJson } from '../../src/http/rate-limited-response.js';

describe('the 429 body shared by the proxy and the middleware', () => {
  it('names every rejecting policy and the Retry-After seconds, in the documented field order', () => {
    assert.equal(
      rateLimitedJson(['per-caller', 'payments'], 3),
      '{"error":"rate_limited","message":"rate limit exceeded: per-caller, payments","policies":["per-caller","payments"],"retryAfterSeconds":3}\n',
    );
  });

  it("is a copy: changing the caller's array afterwards does not change the body", () => {
    const policies = ['api'];
    const body = rateLimitedBody(policies, 1);
    policies.push('other');
    assert.deepEqual(body.policies, ['api']);
  });

  it('escapes a policy name JSON cannot carry as is', () => {
    const body = JSON.parse(rateLimitedJson(['a"b\\c\u0001'], 1));
    assert.deepEqual(body.policies, ['a"b\\c\u0001']);
  });
});
