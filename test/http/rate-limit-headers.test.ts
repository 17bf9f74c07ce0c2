import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../../src/core/clock.js';
import type { Decision } from '../../src/core/decision.js';
import {
  formatRateLimit,
  formatRateLimitPolicy,
  rateLimitHeaders,
  retryAfterSeconds,
} from '../../src/http/rate-limit-headers.js';
import { createKeyedTokenBucket } from '../../src/local/index.js';

const NOW = 1_700_000_000_000;
const payments = { name: 'payments', limit: 100, windowSec: 60 };
const burst = { name: 'burst', limit: 10, windowSec: 1 };

function decision(fields: Partial<Decision>): Decision {
  return { allowed: true, limit: 100, remaining: 99, resetAtMs: NOW, retryAfterMs: 0, ...fields };
}

describe('rate limit header formatting', () => {
  it('formats RateLimit-Policy as a structured list of strings with q and w', () => {
    assert.equal(formatRateLimitPolicy([payments]), '"payments";q=100;w=60');
    assert.equal(formatRateLimitPolicy([payments, burst]), '"payments";q=100;w=60, "burst";q=10;w=1');
    assert.equal(formatRateLimitPolicy([]), '');
  });

  it('formats RateLimit with r and t', () => {
    assert.equal(formatRateLimit([{ name: 'payments', remaining: 23, resetSec: 5 }]), '"payments";r=23;t=5');
  });

  it('rounds remaining and quota down, window and reset up, and never goes negative', () => {
    assert.equal(formatRateLimit([{ name: 'a', remaining: 22.9, resetSec: 4.01 }]), '"a";r=22;t=5');
    assert.equal(formatRateLimit([{ name: 'a', remaining: -3, resetSec: -1 }]), '"a";r=0;t=0');
    assert.equal(formatRateLimitPolicy([{ name: 'a', limit: 10.7, windowSec: 0.5 }]), '"a";q=10;w=1');
    assert.equal(
      formatRateLimit([{ name: 'a', remaining: Number.NaN, resetSec: Number.POSITIVE_INFINITY }]),
      '"a";r=0;t=999999999999999',
    );
  });

  it('escapes quotes and backslashes and drops non-printable characters in names', () => {
    assert.equal(
      formatRateLimitPolicy([{ name: 'a"b\\c\r\nd\u00e9', limit: 1, windowSec: 1 }]),
      '"a\\"b\\\\cd";q=1;w=1',
    );
  });

  it('Retry-After is whole seconds rounded up, at least 1', () => {
    assert.equal(retryAfterSeconds(1), 1);
    assert.equal(retryAfterSeconds(1000), 1);
    assert.equal(retryAfterSeconds(1001), 2);
    assert.equal(retryAfterSeconds(0), 1);
    assert.equal(retryAfterSeconds(-5), 1);
    assert.equal(retryAfterSeconds(Number.NaN), 1);
    assert.equal(retryAfterSeconds(59_500), 60);
  });

  it('Retry-After allows for float noise: a 9-token wait at 9 tokens/s is 1 s, not 2', () => {
    const bucket = createKeyedTokenBucket({ capacity: 9, refillPerSec: 9, clock: new ManualClock(0) });
    const decision = bucket.limit('k', 9);
    assert.equal(decision.allowed, true);
    const rejected = bucket.limit('k', 9);
    assert.equal(rejected.allowed, false);
    assert.ok(rejected.retryAfterMs > 1000, `the float wait is ${rejected.retryAfterMs} ms, just over 1 s`);
    assert.equal(retryAfterSeconds(rejected.retryAfterMs), 1);
    assert.equal(retryAfterSeconds(1000 + 1e-3), 2, 'a real millisecond over still rounds up');
  });
});

describe('rateLimitHeaders', () => {
  it('returns no fields for no decisions', () => {
    assert.deepEqual(rateLimitHeaders([], NOW), {});
  });

  it('an allowed decision carries policy and remaining, no Retry-After', () => {
    const headers = rateLimitHeaders(
      [{ policy: payments, decision: decision({ remaining: 23, resetAtMs: NOW + 4_200 }) }],
      NOW,
    );
    assert.deepEqual(headers, {
      'RateLimit-Policy': '"payments";q=100;w=60',
      RateLimit: '"payments";r=23;t=5',
    });
  });

  it('a rejection adds Retry-After (the longest wait of the rejected) and reports r=0', () => {
    const headers = rateLimitHeaders(
      [
        { policy: payments, decision: decision({ remaining: 40, resetAtMs: NOW + 30_000 }) },
        {
          policy: burst,
          decision: decision({ allowed: false, remaining: 0.4, resetAtMs: NOW + 900, retryAfterMs: 2_100 }),
        },
      ],
      NOW,
    );
    assert.deepEqual(headers, {
      'RateLimit-Policy': '"payments";q=100;w=60, "burst";q=10;w=1',
      RateLimit: '"payments";r=40;t=30, "burst";r=0;t=3',
      'Retry-After': '3',
    });
  });

  it('caps remaining at the quota and leaves out decisions with no known limit', () => {
    const headers = rateLimitHeaders(
      [
        { policy: burst, decision: decision({ remaining: 50, limit: 50 }) },
        { policy: payments, decision: decision({ remaining: 0, limit: 0 }) },
      ],
      NOW,
    );
    assert.equal(headers.RateLimit, '"burst";r=10;t=0');
    assert.equal(headers['RateLimit-Policy'], '"burst";q=10;w=1, "payments";q=100;w=60');
  });

  it('a rejection with retryAfterMs 0 still says Retry-After: 1', () => {
    const headers = rateLimitHeaders(
      [{ policy: burst, decision: decision({ allowed: false, remaining: 0, retryAfterMs: 0 }) }],
      NOW,
    );
    assert.equal(headers['Retry-After'], '1');
    assert.equal(headers.RateLimit, '"burst";r=0;t=1');
  });

  it('formats from cached text per policy object, and a policy changed in place is formatted afresh', () => {
    const policy = { name: 'api', limit: 100, windowSec: 60 };
    const at = (remaining: number, resetAtMs: number) =>
      rateLimitHeaders([{ policy, decision: decision({ remaining, resetAtMs }) }], NOW);
    assert.deepEqual(at(50, NOW + 5_000), {
      'RateLimit-Policy': '"api";q=100;w=60',
      RateLimit: '"api";r=50;t=5',
    });
    assert.equal(at(50, NOW + 5_000).RateLimit, '"api";r=50;t=5');
    assert.equal(at(49, NOW + 5_000).RateLimit, '"api";r=49;t=5');
    assert.equal(at(49, NOW + 4_000).RateLimit, '"api";r=49;t=4');
    policy.limit = 40;
    policy.name = 'api-v2';
    assert.deepEqual(at(49, NOW + 4_000), {
      'RateLimit-Policy': '"api-v2";q=40;w=60',
      RateLimit: '"api-v2";r=40;t=4',
    });
    // Two policy objects with the same name keep their own text.
    const twin = { name: 'api-v2', limit: 7, windowSec: 1 };
    const both = rateLimitHeaders(
      [
        { policy, decision: decision({ remaining: 3, resetAtMs: NOW + 1_000 }) },
        { policy: twin, decision: decision({ remaining: 3, resetAtMs: NOW + 1_000 }) },
      ],
      NOW,
    );
    assert.equal(both['RateLimit-Policy'], '"api-v2";q=40;w=60, "api-v2";q=7;w=1');
    assert.equal(both.RateLimit, '"api-v2";r=3;t=1, "api-v2";r=3;t=1');
  });
});
