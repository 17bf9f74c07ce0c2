import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Registry } from 'prom-client';
import type { LimitsConfig } from '../../src/config/limits-config.js';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { createMemoryHistoryStore } from '../../src/control/tuning/memory-history-store.js';
import { createPeakRecorder } from '../../src/control/tuning/peak-recorder.js';
import { createSqliteHistoryStore } from '../../src/control/tuning/sqlite-history-store.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { describeValue, suggestName } from '../../src/core/validate.js';
import { createGlobalLimiter } from '../../src/global/global-limiter.js';
import { createClientAddressResolver } from '../../src/http/client-address.js';
import { expressRateLimit } from '../../src/http/express/rate-limit.js';
import { fastifyRateLimit } from '../../src/http/fastify/rate-limit.js';
import { createProxyBackend } from '../../src/http/proxy/proxy-backend.js';
import { startProxyServer } from '../../src/http/proxy/proxy-server.js';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { createCoarseClock } from '../../src/local/coarse-clock.js';
import { createGcra } from '../../src/local/gcra.js';
import { createKeyedGcra } from '../../src/local/keyed-gcra.js';
import { createKeyedTokenBucket } from '../../src/local/keyed-token-bucket.js';
import { createTokenBucket } from '../../src/local/token-bucket.js';
import { startOpsServer } from '../../src/ops/ops-server.js';
import { createRedisFixedWindow } from '../../src/redis/redis-fixed-window.js';
import type { RedisScriptClient } from '../../src/redis/redis-script-client.js';
import { createRedisSlidingCounter } from '../../src/redis/redis-sliding-counter.js';
import { createRedisSlidingLog } from '../../src/redis/redis-sliding-log.js';
import { createRedisTokenBucket } from '../../src/redis/redis-token-bucket.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { startGrpcControlServer } from '../../src/transport/grpc-control-server.js';
import { createWorkerControlClient } from '../../src/transport/worker-control-client.js';

/**
 * Unknown keys are errors everywhere (issue #35): every options object of the public API refuses a
 * name it does not know with ERR_SPILLWAY_INVALID_OPTION, naming the typo and what it probably
 * meant, before it checks anything else (so a misspelt required field is reported as the typo,
 * not as the field missing).
 */
const redis: RedisScriptClient = {
  evalsha: async () => [1, 0, 0, 0],
  eval: async () => [1, 0, 0, 0],
};
const limits: LimitsConfig = { version: 1, intervalMs: 1000, ttlMs: 4000, buckets: [] };
const limiter = createKeyedTokenBucket({ capacity: 1, refillPerSec: 1 });
const policy = { name: 'api', limit: 1, windowSec: 1 };
const rules = parseProxyRules(
  'version: 1\nupstream: { url: "http://127.0.0.1:9" }\nbackend: { kind: local }\nbuckets: []\n',
);

/** [what, call, the unknown name, the suggestion or undefined] */
const cases: [string, () => unknown, string, string | undefined][] = [
  [
    'createTokenBucket',
    () => createTokenBucket({ capacty: 10, refillPerSec: 1 } as never),
    'capacty',
    'capacity',
  ],
  [
    'createKeyedTokenBucket',
    () => createKeyedTokenBucket({ capacity: 10, refilPerSec: 1 } as never),
    'refilPerSec',
    'refillPerSec',
  ],
  ['createGcra', () => createGcra({ limt: 10, periodMs: 1000 } as never), 'limt', 'limit'],
  [
    'createKeyedGcra',
    () => createKeyedGcra({ limit: 10, periodMs: 1000, maxKey: 5 } as never),
    'maxKey',
    'maxKeys',
  ],
  ['createCoarseClock', () => createCoarseClock({ resolution: 1 } as never), 'resolution', 'resolutionMs'],
  [
    'createRedisFixedWindow',
    () => createRedisFixedWindow({ redis, limit: 1, windowMs: 1000, failpolicy: 'open' } as never),
    'failpolicy',
    'failPolicy',
  ],
  [
    'createRedisSlidingLog',
    () => createRedisSlidingLog({ redis, limit: 1, window: 1000 } as never),
    'window',
    'windowMs',
  ],
  [
    'createRedisSlidingCounter',
    () => createRedisSlidingCounter({ redis, limit: 1, windowMs: 1000, timeout: 50 } as never),
    'timeout',
    'timeoutMs',
  ],
  [
    'createRedisTokenBucket',
    () => createRedisTokenBucket({ redis, capacity: 1, refillPerSec: 1, limit: 1 } as never),
    'limit',
    undefined,
  ],
  [
    'createGlobalLimiter',
    () => createGlobalLimiter({ reporterId: 'h', clients: [], intervalMS: 1000 } as never),
    'intervalMS',
    'intervalMs',
  ],
  [
    'createGlobalLimiter burstGuard',
    () => createGlobalLimiter({ reporterId: 'h', clients: [], burstGuard: { slack: 1 } } as never),
    'slack',
    'slackRatio',
  ],
  [
    'createGlobalLimiter stalePolicy',
    () =>
      createGlobalLimiter({
        reporterId: 'h',
        clients: [],
        stalePolicy: { kind: 'hold', holdMs: 1 },
      } as never),
    'holdMs',
    undefined,
  ],
  [
    'expressRateLimit',
    () => expressRateLimit({ limiter, policy, trustedProxy: ['10.0.0.0/8'] } as never),
    'trustedProxy',
    'trustedProxies',
  ],
  [
    'expressRateLimit policy',
    () => expressRateLimit({ limiter, policy: { ...policy, window: 1 } } as never),
    'window',
    'windowSec',
  ],
  [
    'fastifyRateLimit',
    () => fastifyRateLimit({ limiter, policy, skipp: () => false } as never),
    'skipp',
    'skip',
  ],
  [
    'createClientAddressResolver',
    () => createClientAddressResolver({ ipv6Prefix: 56 } as never),
    'ipv6Prefix',
    'ipv6PrefixLength',
  ],
  [
    'createController',
    () => createController({ id: 'c', config: limits, maxBucket: 10 } as never),
    'maxBucket',
    'maxBuckets',
  ],
  [
    'createController reporterCap',
    () => createController({ id: 'c', config: limits, reporterCap: { maxRPS: 10 } } as never),
    'maxRPS',
    'maxRps',
  ],
  [
    'createAggregator',
    () => createAggregator({ id: 'a', zone: 'z', parents: [], childTier: ['host'] } as never),
    'childTier',
    'childTiers',
  ],
  [
    'createProxyBackend',
    () => createProxyBackend(rules.backend, { id: 'p', loger: console } as never),
    'loger',
    'logger',
  ],
  [
    'startProxyServer',
    () =>
      startProxyServer({ rules, backend: createProxyBackend(rules.backend, { id: 'p' }), prt: 0 } as never),
    'prt',
    'port',
  ],
  [
    'createGrpcControlClient',
    () => createGrpcControlClient('127.0.0.1:9', { authtoken: 'x' } as never),
    'authtoken',
    'authToken',
  ],
  [
    'createWorkerControlClient',
    () => createWorkerControlClient('127.0.0.1:9', { maxMessageByte: 1 } as never),
    'maxMessageByte',
    'maxMessageBytes',
  ],
  [
    'startGrpcControlServer',
    () => startGrpcControlServer({ handler: () => undefined, zonetokens: [] } as never),
    'zonetokens',
    'zoneTokens',
  ],
  [
    'startOpsServer',
    () =>
      startOpsServer({ registry: new Registry(), health: () => ({ ok: true }), allowedHost: [] } as never),
    'allowedHost',
    'allowedHosts',
  ],
  [
    'createSqliteHistoryStore',
    () => createSqliteHistoryStore({ path: ':memory:', readOnly: true } as never),
    'readOnly',
    'readonly',
  ],
  [
    'createPeakRecorder',
    () => createPeakRecorder({ store: createMemoryHistoryStore(), maxBucket: 1 } as never),
    'maxBucket',
    'maxBuckets',
  ],
];

describe('unknown options', () => {
  for (const [what, call, field, suggestion] of cases) {
    it(`${what} refuses "${field}"${suggestion ? ` and suggests "${suggestion}"` : ''}`, async () => {
      await assert.rejects(
        async () => call(),
        (error) => {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION'), String(error));
          assert.match(error.message, new RegExp(`unknown option "${field}"`));
          assert.equal(error.details?.field, field);
          assert.equal(error.details?.suggestion, suggestion);
          if (suggestion) assert.match(error.message, new RegExp(`did you mean "${suggestion}"\\?`));
          else assert.doesNotMatch(error.message, /did you mean/);
          return true;
        },
      );
    });
  }

  it('names the typo rather than the field it left out', () => {
    assert.throws(
      () => createKeyedTokenBucket({ capacty: 10, refillPerSec: 1 } as never),
      /^SpillwayError: createKeyedTokenBucket: unknown option "capacty"; did you mean "capacity"\?/,
    );
  });

  it('quotes a value as it was written: a string is not the number it spells', () => {
    assert.throws(
      () => createKeyedTokenBucket({ capacity: '10', refillPerSec: 1 } as never),
      (error) => {
        assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_LIMIT'));
        assert.equal(error.message, "capacity must be a positive finite number, got '10' (a string)");
        return true;
      },
    );
    assert.throws(
      () => expressRateLimit({ limiter, policy: { ...policy, limit: '100' } } as never),
      /policy\.limit must be a positive finite number, got '100' \(a string\)/,
    );
    assert.throws(
      () => createGlobalLimiter({ reporterId: 'h', clients: [], intervalMs: '1000' } as never),
      /intervalMs must be a positive finite number, got '1000' \(a string\)/,
    );
  });
});

describe('suggestName', () => {
  const known = ['trustedProxies', 'ipv6PrefixLength', 'ipv4PrefixLength', 'limit', 'limitRps', 'key'];
  it('suggests the name a typo was meant to be', () => {
    assert.equal(suggestName('trustedProxy', known), 'trustedProxies');
    assert.equal(suggestName('limt', known), 'limit');
    assert.equal(suggestName('LIMIT', known), 'limit');
    assert.equal(suggestName('ipv6Prefix', known), 'ipv6PrefixLength');
    assert.equal(suggestName('limitRp', known), 'limitRps');
  });
  it('suggests nothing for a name far from every known one', () => {
    assert.equal(suggestName('windowSec', known), undefined);
    assert.equal(suggestName('x', known), undefined);
    assert.equal(suggestName('burst', known), undefined);
  });
});

describe('describeValue', () => {
  it('shows strings quoted with their type, the rest as they print', () => {
    assert.equal(describeValue('10'), "'10' (a string)");
    assert.equal(describeValue(10), '10');
    assert.equal(describeValue(Number.NaN), 'NaN');
    assert.equal(describeValue(undefined), 'undefined');
    assert.equal(describeValue(null), 'null');
    assert.equal(describeValue([1]), 'an array');
    assert.equal(describeValue({}), 'an object');
    assert.equal(describeValue(10n), '10n (a bigint)');
  });
});
