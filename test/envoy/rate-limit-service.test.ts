import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { ManualClock } from '../../src/core/clock.js';
import { compileRateLimits } from '../../src/envoy/descriptor-rules.js';
import { createGlobalBackend } from '../../src/envoy/global-backend.js';
import { createLocalBackend } from '../../src/envoy/local-backend.js';
import { createRateLimitService, type RateLimitServiceOptions } from '../../src/envoy/rate-limit-service.js';
import { parseRateLimitConfig } from '../../src/envoy/ratelimit-config.js';
import { RequestRefusal } from '../../src/envoy/request-bounds.js';
import {
  type RateLimitRequest,
  RateLimitRequestSchema,
  type RateLimitResponse,
  RateLimitResponse_Code,
} from '../../src/gen/envoy/service/ratelimit/v3/rls_pb.js';
import { RateLimitUnit } from '../../src/gen/envoy/type/v3/ratelimit_unit_pb.js';
import { harness } from '../global/fixtures.js';

const { OK, OVER_LIMIT } = RateLimitResponse_Code;

const CONFIG = `
domain: edge
descriptors:
  - key: generic_key
    value: login
    rate_limit: { unit: minute, requests_per_unit: 3, name: login }
  - key: user
    value: vip
    rate_limit: { unit: second, requests_per_unit: 100, replaces: [{ name: login }] }
  - key: path
    value: /health
    rate_limit: { unlimited: true }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: quota
    quota_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 2 }
`;

/** 10 s past a minute boundary (and an hour's). */
const START_MS = 1_700_000_040_000 + 10_000;

function setup(options: Partial<RateLimitServiceOptions> = {}) {
  const clock = new ManualClock(START_MS);
  const limits = compileRateLimits([parseRateLimitConfig(CONFIG, 'config.yaml')]);
  const service = createRateLimitService({
    limits,
    backend: createLocalBackend({ clock }),
    clock,
    ...options,
  });
  const call = (init: Parameters<typeof create<typeof RateLimitRequestSchema>>[1]): RateLimitResponse => {
    const response = service.shouldRateLimit(create(RateLimitRequestSchema, init));
    assert.ok(!(response instanceof Promise), 'the local backend answers synchronously');
    return response;
  };
  return { clock, service, call };
}

const one = (key: string, value: string) => ({ entries: [{ key, value }] });

function refusal(fn: () => unknown, code: status, message: string | RegExp): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof RequestRefusal);
    assert.equal(error.grpcStatus, code);
    if (typeof message === 'string') assert.equal(error.message, message);
    else assert.match(error.message, message);
    return true;
  });
}

describe('ShouldRateLimit answers as envoyproxy/ratelimit does', () => {
  it('refuses an empty domain or descriptor list with its words and gRPC UNKNOWN', () => {
    const { call } = setup();
    refusal(
      () => call({ domain: '', descriptors: [one('a', 'b')] }),
      status.UNKNOWN,
      'rate limit domain must not be empty',
    );
    refusal(
      () => call({ domain: 'edge', descriptors: [] }),
      status.UNKNOWN,
      'rate limit descriptor list must not be empty',
    );
  });

  it('a matched descriptor under its limit: current_limit, limit_remaining, duration_until_reset', () => {
    const { call } = setup();
    const response = call({ domain: 'edge', descriptors: [one('generic_key', 'login')] });
    assert.equal(response.overallCode, OK);
    const [statusOf] = response.statuses;
    assert.equal(statusOf?.code, OK);
    assert.deepEqual(
      [statusOf?.currentLimit?.requestsPerUnit, statusOf?.currentLimit?.unit, statusOf?.currentLimit?.name],
      [3, 2, 'login'],
    );
    assert.equal(statusOf?.limitRemaining, 2);
    assert.equal(statusOf?.durationUntilReset?.seconds, 50n, 'a minute window aligned to the epoch, 10 s in');
  });

  it('over the limit: OVER_LIMIT with remaining 0, limit and reset still set; the window resets it', () => {
    const { call, clock } = setup();
    const request = { domain: 'edge', descriptors: [one('generic_key', 'login')] };
    for (let i = 0; i < 3; i++) assert.equal(call(request).overallCode, OK);
    const over = call(request);
    assert.equal(over.overallCode, OVER_LIMIT);
    assert.equal(over.statuses[0]?.code, OVER_LIMIT);
    assert.equal(over.statuses[0]?.limitRemaining, 0);
    assert.equal(over.statuses[0]?.currentLimit?.requestsPerUnit, 3);
    assert.equal(over.statuses[0]?.durationUntilReset?.seconds, 50n);
    clock.advance(50_000);
    assert.equal(call(request).overallCode, OK);
  });

  it('statuses in request order; unmatched and unknown-domain descriptors OK with no limit', () => {
    const { call } = setup();
    const response = call({
      domain: 'edge',
      descriptors: [one('nothing', 'here'), one('path', '/health'), one('generic_key', 'login')],
    });
    assert.equal(response.statuses.length, 3);
    const [unmatched, unlimited, limited] = response.statuses;
    assert.deepEqual(
      [unmatched?.code, unmatched?.currentLimit, unmatched?.limitRemaining, unmatched?.durationUntilReset],
      [OK, undefined, 0, undefined],
    );
    assert.deepEqual(
      [unlimited?.code, unlimited?.currentLimit, unlimited?.limitRemaining, unlimited?.durationUntilReset],
      [OK, undefined, 4_294_967_295, undefined],
    );
    assert.equal(limited?.currentLimit?.requestsPerUnit, 3);
    const unknown = call({ domain: 'nowhere', descriptors: [one('a', 'b'), one('c', 'd')] });
    assert.deepEqual(
      unknown.statuses.map((s) => [s.code, s.currentLimit]),
      [
        [OK, undefined],
        [OK, undefined],
      ],
    );
    assert.equal(unknown.overallCode, OK);
  });

  it('unknown domains may be refused instead, with NOT_FOUND', () => {
    const { call } = setup({ unknownDomain: 'error' });
    refusal(
      () => call({ domain: 'nowhere', descriptors: [one('a', 'b')] }),
      status.NOT_FOUND,
      "rate limit domain 'nowhere' is not configured",
    );
  });

  it('a shadow rule is counted but never OVER_LIMIT, overall or in its status', () => {
    const { call, service } = setup();
    const request = { domain: 'edge', descriptors: [one('tenant', 'acme')] };
    call(request);
    const shadowed = call(request);
    assert.equal(shadowed.overallCode, OK);
    assert.equal(shadowed.statuses[0]?.code, OK);
    assert.equal(shadowed.statuses[0]?.limitRemaining, 0, 'other fields as computed');
    assert.equal(service.stats.rule('edge.tenant').shadowOverLimit, 1);
  });

  it('quota mode: OVER_LIMIT only when every quota-mode descriptor is over', () => {
    const { call } = setup();
    call({ domain: 'edge', descriptors: [one('quota', 'a')] });
    assert.equal(
      call({ domain: 'edge', descriptors: [one('quota', 'a'), one('quota', 'b')] }).overallCode,
      OK,
    );
    assert.equal(
      call({ domain: 'edge', descriptors: [one('quota', 'a'), one('quota', 'b')] }).overallCode,
      OVER_LIMIT,
    );
    const withOther = call({ domain: 'edge', descriptors: [one('quota', 'c'), one('blocked', 'x')] });
    assert.equal(withOther.overallCode, OVER_LIMIT, 'a non-quota descriptor over is enough');
  });

  it('requests_per_unit 0 refuses the first request', () => {
    const { call } = setup();
    assert.equal(call({ domain: 'edge', descriptors: [one('blocked', '1.2.3.4')] }).overallCode, OVER_LIMIT);
  });

  it('hits_addend: the request-level one (0 means 1), overridden per descriptor (0 is check only)', () => {
    const { call } = setup();
    const response = call({ domain: 'edge', descriptors: [one('remote_address', 'a')], hitsAddend: 2 });
    assert.equal(response.statuses[0]?.limitRemaining, 0);
    const check = call({
      domain: 'edge',
      descriptors: [{ ...one('remote_address', 'a'), hitsAddend: 0n }],
      hitsAddend: 5,
    });
    assert.deepEqual([check.overallCode, check.statuses[0]?.limitRemaining], [OK, 0], 'checked, not counted');
    assert.equal(call({ domain: 'edge', descriptors: [one('remote_address', 'a')] }).overallCode, OVER_LIMIT);
    const own = call({
      domain: 'edge',
      descriptors: [{ ...one('remote_address', 'b'), hitsAddend: 1n }],
      hitsAddend: 9,
    });
    assert.equal(own.statuses[0]?.limitRemaining, 1, 'the descriptor hits_addend wins over the request one');
  });

  it("a request's own limit replaces the configured one (and needs a unit)", () => {
    const { call } = setup();
    const limited = {
      ...one('generic_key', 'login'),
      limit: { requestsPerUnit: 1, unit: RateLimitUnit.HOUR },
    };
    const first = call({ domain: 'edge', descriptors: [limited] });
    assert.deepEqual(
      [
        first.statuses[0]?.currentLimit?.requestsPerUnit,
        first.statuses[0]?.currentLimit?.unit,
        first.statuses[0]?.currentLimit?.name,
      ],
      [1, 3, ''],
    );
    assert.equal(call({ domain: 'edge', descriptors: [limited] }).overallCode, OVER_LIMIT);
    const anyKey = call({
      domain: 'edge',
      descriptors: [{ ...one('no', 'rule'), limit: { requestsPerUnit: 5, unit: RateLimitUnit.SECOND } }],
    });
    assert.equal(anyKey.statuses[0]?.limitRemaining, 4, 'applies with no rule for the descriptor');
    refusal(
      () => call({ domain: 'edge', descriptors: [{ ...one('a', 'b'), limit: { requestsPerUnit: 5 } }] }),
      status.INVALID_ARGUMENT,
      'descriptors[0].limit.unit must be SECOND, MINUTE, HOUR, DAY, MONTH or YEAR, got 0',
    );
  });

  it('replaces: a rule named by another matched rule is OK with no limit and not counted', () => {
    const { call, service } = setup();
    const response = call({ domain: 'edge', descriptors: [one('generic_key', 'login'), one('user', 'vip')] });
    assert.deepEqual(
      response.statuses.map((s) => [s.code, s.currentLimit?.requestsPerUnit]),
      [
        [OK, undefined],
        [OK, 100],
      ],
    );
    assert.equal(service.stats.rules.get('edge.generic_key=login'), undefined);
  });

  it('response headers: the IETF RateLimit and RateLimit-Policy fields, Retry-After when over', () => {
    const { call } = setup({ responseHeaders: true });
    const headers = (response: RateLimitResponse) =>
      Object.fromEntries(response.responseHeadersToAdd.map((h) => [h.key, h.value]));
    const request = { domain: 'edge', descriptors: [one('generic_key', 'login'), one('tenant', 'a')] };
    assert.deepEqual(headers(call(request)), {
      'RateLimit-Policy': '"login";q=3;w=60',
      RateLimit: '"login";r=2;t=50',
    });
    call(request);
    call(request);
    assert.deepEqual(headers(call(request)), {
      'RateLimit-Policy': '"login";q=3;w=60',
      RateLimit: '"login";r=0;t=50',
      'Retry-After': '50',
    });
    assert.deepEqual(headers(call({ domain: 'edge', descriptors: [one('none', 'x')] })), {});
  });

  it('service-wide shadow mode answers OK overall, statuses as computed', () => {
    const { call } = setup({ shadowMode: true });
    const response = call({ domain: 'edge', descriptors: [one('blocked', 'x')] });
    assert.equal(response.overallCode, OK);
    assert.equal(response.statuses[0]?.code, OVER_LIMIT);
  });

  it('bounds: 10,000 descriptors, a 1 MB value, an empty entry list are INVALID_ARGUMENT', () => {
    const { call } = setup();
    const many: RateLimitRequest['descriptors'] = [];
    for (let i = 0; i < 10_000; i++)
      many.push(create(RateLimitRequestSchema, { descriptors: [one('k', String(i))] }).descriptors[0]!);
    refusal(
      () => call({ domain: 'edge', descriptors: many }),
      status.INVALID_ARGUMENT,
      'the request has 10000 descriptors, more than the 256 allowed',
    );
    refusal(
      () => call({ domain: 'edge', descriptors: [one('k', 'v'.repeat(1_000_000))] }),
      status.INVALID_ARGUMENT,
      'descriptors[0].entries[0].value is 1000000 bytes, more than the 65536 allowed',
    );
    refusal(
      () => call({ domain: 'edge', descriptors: [{ entries: [] }] }),
      status.INVALID_ARGUMENT,
      'descriptors[0] has no entries',
    );
  });
});

describe('ShouldRateLimit on the global backend', () => {
  it('decides by the drop ratio; a shadow directive answers OK; a request limit applies to the fleet rate', async () => {
    const h = harness();
    const service = createRateLimitService({
      limits: compileRateLimits([parseRateLimitConfig(CONFIG, 'config.yaml')]),
      backend: createGlobalBackend(h.limiter, () => 0.5),
      clock: h.clock,
    });
    const call = (init: Parameters<typeof create<typeof RateLimitRequestSchema>>[1]) =>
      service.shouldRateLimit(create(RateLimitRequestSchema, init)) as RateLimitResponse;
    const login = { domain: 'edge', descriptors: [one('generic_key', 'login')] };
    const first = call(login);
    assert.deepEqual(
      [first.overallCode, first.statuses[0]?.limitRemaining],
      [OK, 3],
      'remaining is the limit',
    );
    h.aggregator.set('edge.generic_key=login', { dropRatio: 1, limitRps: 0.05 });
    h.aggregator.set('edge.tenant#a', { dropRatio: 1, mode: 'shadow' });
    const override = 'edge.!override#no%3Drule';
    h.aggregator.set(override, { dropRatio: 0, limitRps: 1e12, offeredRps: 40 });
    call({ domain: 'edge', descriptors: [one('tenant', 'a')] });
    const request = {
      domain: 'edge',
      descriptors: [{ ...one('no', 'rule'), limit: { requestsPerUnit: 10, unit: RateLimitUnit.SECOND } }],
    };
    call(request);
    await h.flush();
    assert.equal(call(login).overallCode, OVER_LIMIT);
    const shadow = call({ domain: 'edge', descriptors: [one('tenant', 'a')] });
    assert.deepEqual([shadow.overallCode, shadow.statuses[0]?.code], [OK, OK]);
    assert.equal(service.stats.rule('edge.tenant').shadowOverLimit, 1);
    // 40 offered against 10: drop 75%; the injected draw of 0.5 drops.
    assert.equal(call(request).overallCode, OVER_LIMIT);
  });
});
