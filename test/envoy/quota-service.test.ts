import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { compileRateLimits } from '../../src/envoy/descriptor-rules.js';
import { matchBucketId } from '../../src/envoy/quota-bucket-id.js';
import { StreamRefusal } from '../../src/envoy/quota-stream.js';
import { parseRateLimitConfig } from '../../src/envoy/ratelimit-config.js';
import {
  type RateLimitQuotaResponse,
  RateLimitQuotaUsageReportsSchema,
} from '../../src/gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import { RateLimitStrategy_BlanketRule } from '../../src/gen/envoy/type/v3/ratelimit_strategy_pb.js';
import { quotaLoop } from './quota-loop.js';

// The RLQS side in virtual time: simulated Envoys (sim-envoy.ts) on streams of the quota service,
// one `spillway rls` data plane reporting their usage to a real controller reading the file.

const CONFIG = `
domain: mesh
descriptors:
  - key: route
    value: checkout
    rate_limit: { unit: second, requests_per_unit: 600 }
  - key: route
    value: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: route
    value: health
    rate_limit: { unlimited: true }
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: minute, requests_per_unit: 600 }
`;
const CHECKOUT = { route: 'checkout' };
const total = (envoys: { allowed: number }[]) => envoys.reduce((sum, e) => sum + e.allowed, 0);

describe('RLQS: Envoys enforce, Spillway coordinates', () => {
  for (const seed of [7, 11]) {
    it(`a dozen Envoys at 3x the limit admit within 5% of it in total; one that vanishes gives its share back (seed ${seed})`, async () => {
      const loop = quotaLoop(CONFIG, {}, seed);
      for (let i = 0; i < 12; i++) {
        loop.addEnvoy({ domain: 'mesh', bucket: CHECKOUT, rps: 150, reportIntervalMs: 1000 });
      }
      await loop.run(20_000);
      const before = total(loop.envoys);
      await loop.run(40_000);
      const allowedRps = (total(loop.envoys) - before) / 40;
      assert.ok(
        Math.abs(allowedRps - 600) <= 30,
        `12 Envoys admitted ${allowedRps}/s against a limit of 600/s`,
      );

      const [gone, stay] = [loop.envoys.slice(0, 4), loop.envoys.slice(4)];
      const stayBefore = total(stay);
      for (const envoy of gone) loop.drop(envoy);
      await loop.run(15_000);
      const recovered = total(stay);
      await loop.run(20_000);
      const afterRps = (total(stay) - recovered) / 20;
      assert.equal(loop.service.streamCount, 8);
      assert.ok(Math.abs(afterRps - 600) <= 30, `the 8 left admit ${afterRps}/s, the whole limit of 600/s`);
      assert.ok((recovered - stayBefore) / 15 > 420, 'their share grew as soon as the others left');
      await loop.stop();
    });
  }

  it('Envoys of different sizes each keep their own offered x (1 - ratio)', async () => {
    const loop = quotaLoop(CONFIG, {}, 3);
    const rates = [20, 60, 100, 140, 180, 220, 260, 300, 520];
    for (const rps of rates) loop.addEnvoy({ domain: 'mesh', bucket: CHECKOUT, rps, reportIntervalMs: 1000 });
    await loop.run(20_000);
    const before = loop.envoys.map((e) => e.allowed);
    await loop.run(40_000);
    const allowed = loop.envoys.map((e, i) => (e.allowed - before[i]!) / 40);
    const sum = allowed.reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(sum - 600) <= 30, `${sum}/s in total`);
    rates.forEach((rps, i) => {
      const expected = (rps * 600) / 1800;
      assert.ok(
        Math.abs(allowed[i]! - expected) <= Math.max(3, 0.1 * expected),
        `${rps}/s offered: ${allowed[i]}/s, expected ${expected}`,
      );
    });
    await loop.stop();
  });

  it('ALLOW_ALL under the limit, DENY_ALL at 0, ALLOW_ALL for unlimited and unmatched buckets', async () => {
    const loop = quotaLoop(CONFIG);
    const last = new Map<string, RateLimitQuotaResponse>();
    const under = loop.addEnvoy({ domain: 'mesh', bucket: CHECKOUT, rps: 100, reportIntervalMs: 1000 });
    const blocked = loop.addEnvoy({
      domain: 'mesh',
      bucket: { route: 'blocked' },
      rps: 10,
      reportIntervalMs: 1000,
    });
    const health = loop.addEnvoy({
      domain: 'mesh',
      bucket: { route: 'health' },
      rps: 10,
      reportIntervalMs: 1000,
    });
    const nothing = loop.addEnvoy({
      domain: 'mesh',
      bucket: { other: 'x' },
      rps: 10,
      reportIntervalMs: 1000,
    });
    for (const [name, envoy] of Object.entries({ under, blocked, health, nothing })) {
      const original = envoy.onResponse.bind(envoy);
      envoy.onResponse = (response) => {
        last.set(name, response);
        original(response);
      };
    }
    await loop.run(10_000);
    const rule = (name: string) => {
      const action = last.get(name)?.bucketAction[0]?.bucketAction;
      assert.equal(action?.case, 'quotaAssignmentAction');
      const strategy = action.value.rateLimitStrategy?.strategy;
      assert.equal(strategy?.case, 'blanketRule');
      return strategy.value;
    };
    assert.equal(rule('under'), RateLimitStrategy_BlanketRule.ALLOW_ALL);
    assert.equal(rule('blocked'), RateLimitStrategy_BlanketRule.DENY_ALL);
    assert.equal(rule('health'), RateLimitStrategy_BlanketRule.ALLOW_ALL);
    assert.equal(rule('nothing'), RateLimitStrategy_BlanketRule.ALLOW_ALL);
    assert.equal(blocked.allowed, 1, 'only the request before the first assignment');
    const ttl = (
      last.get('under')!.bucketAction[0]!.bucketAction.value as { assignmentTimeToLive?: { seconds: bigint } }
    ).assignmentTimeToLive;
    assert.equal(ttl?.seconds, 3n, "the stale policy's hold: 3 intervals");
    await loop.stop();
  });

  it('a bucket not reported past its assignment TTL is abandoned', async () => {
    const loop = quotaLoop(CONFIG);
    const envoy = loop.addEnvoy({ domain: 'mesh', bucket: CHECKOUT, rps: 50, reportIntervalMs: 1000 });
    await loop.run(3_000);
    assert.equal(envoy.abandoned, 0);
    // The Envoy stops reporting the bucket (its traffic moved elsewhere and its stream stays open).
    const advance = envoy.advance.bind(envoy);
    envoy.advance = () => {};
    await loop.run(5_000);
    assert.equal(envoy.abandoned, 1);
    assert.equal(loop.service.stats.abandons, 1);
    assert.equal(loop.service.stats.buckets, 0);
    envoy.advance = advance;
    await loop.stop();
  });
});

describe('RLQS: bad input ends one stream with a clear status, and only that one', () => {
  const report = (usages: object[], domain = 'mesh') =>
    create(RateLimitQuotaUsageReportsSchema, { domain, bucketQuotaUsages: usages as never });
  const usage = (bucket: Record<string, string>, seconds = 1n, allowed = 1n) => ({
    bucketId: { bucket },
    timeElapsed: { seconds, nanos: 0 },
    numRequestsAllowed: allowed,
    numRequestsDenied: 0n,
  });

  function open(loop: ReturnType<typeof quotaLoop>) {
    const ended: { refusal?: StreamRefusal | undefined; done: boolean } = { done: false };
    const responses: RateLimitQuotaResponse[] = [];
    const session = loop.service.open(
      (response) => responses.push(response),
      (refusal) => {
        ended.done = true;
        ended.refusal = refusal;
      },
    );
    return { session, ended, responses };
  }

  const refusedWith = (ended: { refusal?: StreamRefusal | undefined }, code: status, message: RegExp) => {
    assert.ok(ended.refusal instanceof StreamRefusal, 'ended with a status');
    assert.equal(ended.refusal.grpcStatus, code);
    assert.match(ended.refusal.message, message);
  };

  it('a flood of new BucketIds on one stream: RESOURCE_EXHAUSTED past the cap, memory bounded, others served', async () => {
    const loop = quotaLoop(CONFIG, { maxBucketsPerStream: 1_000 });
    const other = loop.addEnvoy({ domain: 'mesh', bucket: CHECKOUT, rps: 100, reportIntervalMs: 1000 });
    const flood = open(loop);
    for (let i = 0; i < 5_000 && !flood.ended.done; i++) {
      flood.session.receive(report([usage({ tenant: `t${i}`, plan: 'free' })], i === 0 ? 'mesh' : ''));
    }
    refusedWith(flood.ended, status.RESOURCE_EXHAUSTED, /more than 1000 buckets/);
    assert.equal(flood.responses.length, 1_000);
    assert.equal(loop.service.stats.buckets, 0, "the stream's buckets went with it");
    await loop.run(3_000);
    assert.ok(other.allowed > 250, 'the other stream is served');
    assert.equal(loop.ended[0], undefined);
    await loop.stop();
  });

  it('absurd or missing time_elapsed, counts no data plane reaches, a missing domain or BucketId: INVALID_ARGUMENT', async () => {
    const loop = quotaLoop(CONFIG);
    const cases: [object, RegExp][] = [
      [
        report([usage(CHECKOUT, 1_000_000_000n)]),
        /time_elapsed must be between 0 and 3600 s, got 1000000000s 0ns/,
      ],
      [report([usage(CHECKOUT, -5n)]), /time_elapsed must be between/],
      [
        report([{ ...usage(CHECKOUT), timeElapsed: undefined }]),
        /bucket_quota_usages\[0\]\.time_elapsed is required/,
      ],
      [report([usage(CHECKOUT, 1n, 2n ** 62n)]), /is not a believable rate/],
      [report([usage(CHECKOUT)], ''), /the first report of a stream must name its domain/],
      [report([{ ...usage(CHECKOUT), bucketId: undefined }]), /bucket_id is required/],
      [report([usage({})]), /bucket_id has no pairs/],
      [report([usage({ route: '' })]), /must not be empty/],
      [report([]), /at least one bucket_quota_usages entry/],
    ];
    for (const [message, expected] of cases) {
      const stream = open(loop);
      stream.session.receive(message as never);
      refusedWith(stream.ended, status.INVALID_ARGUMENT, expected);
    }
    const changed = open(loop);
    changed.session.receive(report([usage(CHECKOUT)]));
    changed.session.receive(report([usage(CHECKOUT)], 'other'));
    refusedWith(changed.ended, status.INVALID_ARGUMENT, /a stream keeps its domain \('mesh'\)/);
    assert.equal(loop.service.streamCount, 0);
    await loop.stop();
  });

  it('a stream that never reports is ended with DEADLINE_EXCEEDED; streams past the cap get RESOURCE_EXHAUSTED', async () => {
    const loop = quotaLoop(CONFIG, { silentStreamMs: 5_000, maxStreams: 2 });
    const silent = open(loop);
    const second = open(loop);
    const third = open(loop);
    refusedWith(third.ended, status.RESOURCE_EXHAUSTED, /2 streams are open/);
    second.session.receive(report([usage(CHECKOUT)]));
    await loop.run(6_500, 100);
    refusedWith(silent.ended, status.DEADLINE_EXCEEDED, /no usage report for 5000 ms/);
    assert.equal(loop.service.streamCount, 0, 'the one that reported once went silent too');
    await loop.stop();
  });

  it('unknown domains: ALLOW_ALL by default, NOT_FOUND when asked to refuse them', async () => {
    const lenient = quotaLoop(CONFIG);
    const stream = open(lenient);
    stream.session.receive(report([usage(CHECKOUT)], 'elsewhere'));
    assert.equal(stream.ended.done, false);
    assert.equal(stream.responses[0]?.bucketAction[0]?.bucketAction.case, 'quotaAssignmentAction');
    await lenient.stop();
    const strict = quotaLoop(CONFIG, { unknownDomain: 'error' });
    const refused = open(strict);
    refused.session.receive(report([usage(CHECKOUT)], 'elsewhere'));
    refusedWith(refused.ended, status.NOT_FOUND, /rate limit domain 'elsewhere' is not configured/);
    await strict.stop();
  });
});

describe('RLQS BucketId to bucket key', () => {
  const domain = compileRateLimits([parseRateLimitConfig(CONFIG, 'c.yaml')]).domains.get('mesh')!;
  it('takes the rule whose path uses every pair, in whatever order the map holds them', () => {
    const free = matchBucketId(domain, [
      ['plan', 'free'],
      ['tenant', 'acme'],
    ]);
    assert.equal(
      free?.bucketKey,
      'mesh.tenant.plan=free#acme',
      'the same key `spillway rls` gives the descriptor',
    );
    assert.equal(matchBucketId(domain, [['route', 'checkout']])?.bucketKey, 'mesh.route=checkout');
    assert.equal(
      matchBucketId(domain, [
        ['plan', 'paid'],
        ['tenant', 'acme'],
      ]),
      undefined,
    );
    assert.equal(matchBucketId(domain, [['tenant', 'acme']]), undefined, 'no rate_limit at that depth');
  });
});
