// One suite, run against every framework binding of the rate limit middleware
// (test/http/express/rate-limit.test.ts, test/http/fastify/rate-limit.test.ts): real servers on
// port 0, real sockets, each limiter kind (local keyed token bucket, Redis on a private
// redis-server, the global limiter with a fake directive and with the real controller).
import assert from 'node:assert/strict';
import { type IncomingHttpHeaders, request } from 'node:http';
import { connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import { createController } from '../../src/control/controller.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import type { Decision, SyncLimiter } from '../../src/core/decision.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import type { RateLimitMiddlewareOptions, RateLimitStats } from '../../src/http/rate-limit-middleware.js';
import { createKeyedTokenBucket } from '../../src/local/index.js';
import { createRedisTokenBucket, ioredisAdapter, type RedisLimiter } from '../../src/redis/index.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { drive, harness } from '../global/fixtures.js';
import { type RedisServer, redisServerAvailable, startRedis } from '../helpers/redis-server.js';

/** What the suite needs of a request: both Express's and Fastify's have Node's headers. */
export interface SuiteRequest {
  headers: IncomingHttpHeaders;
}

export type SuiteOptions<Res> = RateLimitMiddlewareOptions<SuiteRequest, Res>;

export interface RunningServer {
  /** `http://127.0.0.1:<port>` */
  url: string;
  stats: RateLimitStats;
  close(): Promise<void>;
}

/**
 * A framework binding under test. `start` serves, behind the middleware built from `options`:
 * `GET /` answering `{"ok":true,"sync":<bool>}`, where `sync` tells whether the middleware's
 * continuation ran before the middleware call returned; and `GET /healthz` answering `ok`.
 */
export interface FrameworkUnderTest<Res> {
  name: string;
  start(options: SuiteOptions<Res>): Promise<RunningServer>;
  /**
   * Like `start`, with one middleware per entry of `stack`, in order, behind a first layer that
   * sets `preset` on every response (fields the app set before the limiters ran). `stats` are
   * the first middleware's.
   */
  startStack(stack: SuiteOptions<Res>[], preset?: Record<string, string | string[]>): Promise<RunningServer>;
  /** End `res` with status 418 and `body` (a custom onLimited response). */
  endCustom(res: Res, body: string): void;
}

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** One request on a fresh connection (no pool: nothing outlives the test). */
export function get(url: string, path = '/', headers: Record<string, string> = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}${path}`, { agent: false, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The rate limit fields of a reply, lower-case names, absent ones left out. */
export function rateLimitFields(reply: Reply): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const name of ['ratelimit-policy', 'ratelimit', 'retry-after']) {
    const value = reply.headers[name];
    if (typeof value === 'string') fields[name] = value;
  }
  return fields;
}

const policy = { name: 'api', limit: 3, windowSec: 3 };

/** The parsed 429 body of a rejection by `policy`: the proxy's shape (src/http/rate-limited-response.ts). */
function apiLimited(retryAfterSeconds: number) {
  return { error: 'rate_limited', message: 'rate limit exceeded: api', policies: ['api'], retryAfterSeconds };
}

/** A keyed token bucket on a manual clock: 3 tokens, 1 per second, so headers are exact. */
function localBucket() {
  const clock = new ManualClock(1_000_000);
  const limiter = createKeyedTokenBucket({ capacity: 3, refillPerSec: 1, clock });
  return { clock, limiter };
}

/** Wraps a sync limiter and records every key it is asked about. */
function recording(inner: SyncLimiter): { limiter: SyncLimiter; keys: string[] } {
  const keys: string[] = [];
  return {
    keys,
    limiter: {
      limit(key, cost) {
        keys.push(key);
        return inner.limit(key, cost);
      },
    },
  };
}

export function rateLimitSuite<Res>(framework: FrameworkUnderTest<Res>): void {
  const servers: RunningServer[] = [];
  const serve = async (options: SuiteOptions<Res>): Promise<RunningServer> => {
    const server = await framework.start(options);
    servers.push(server);
    return server;
  };
  const serveStack = async (
    stack: SuiteOptions<Res>[],
    preset?: Record<string, string | string[]>,
  ): Promise<RunningServer> => {
    const server = await framework.startStack(stack, preset);
    servers.push(server);
    return server;
  };
  after(async () => {
    await Promise.all(servers.map((server) => server.close()));
  });

  describe(`${framework.name}: local keyed token bucket`, () => {
    it('sends exact RateLimit-Policy and RateLimit fields, then 429 with Retry-After and the JSON body', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({ limiter, policy, clock });
      const replies: Reply[] = [];
      for (let i = 0; i < 4; i++) replies.push(await get(server.url));
      assert.deepEqual(
        replies.map((reply) => reply.status),
        [200, 200, 200, 429],
      );
      // 3 tokens refilling at 1/s: after n calls the bucket is full again in n seconds.
      assert.deepEqual(rateLimitFields(replies[0]!), {
        'ratelimit-policy': '"api";q=3;w=3',
        ratelimit: '"api";r=2;t=1',
      });
      assert.deepEqual(rateLimitFields(replies[2]!), {
        'ratelimit-policy': '"api";q=3;w=3',
        ratelimit: '"api";r=0;t=3',
      });
      assert.deepEqual(rateLimitFields(replies[3]!), {
        'ratelimit-policy': '"api";q=3;w=3',
        ratelimit: '"api";r=0;t=3',
        'retry-after': '1',
      });
      // Byte for byte what the proxy sends (test/http/proxy.test.ts), with the same fields.
      assert.equal(
        replies[3]!.body,
        '{"error":"rate_limited","message":"rate limit exceeded: api","policies":["api"],"retryAfterSeconds":1}\n',
      );
      assert.deepEqual(
        {
          'content-type': replies[3]!.headers['content-type'],
          'content-length': replies[3]!.headers['content-length'],
          'cache-control': replies[3]!.headers['cache-control'],
        },
        {
          'content-type': 'application/json; charset=utf-8',
          'content-length': String(Buffer.byteLength(replies[3]!.body)),
          'cache-control': 'no-store',
        },
      );
      assert.equal(
        replies[0]!.headers['cache-control'],
        undefined,
        'an admitted response is left to the app',
      );
      assert.deepEqual(JSON.parse(replies[0]!.body), { ok: true, sync: true });
      assert.equal(server.stats.requests, 4);
      assert.equal(server.stats.admitted, 3);
      assert.equal(server.stats.limited, 1);

      clock.advance(1000);
      assert.equal((await get(server.url)).status, 200, 'a refilled token admits again');
    });

    it('cost: a cost function spends several units; an invalid cost falls back to 1 and is counted', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({
        limiter,
        policy,
        clock,
        cost: (req) => {
          const header = req.headers['x-cost'];
          if (header === 'throw') throw new Error('boom');
          return header === undefined ? 1 : Number(header);
        },
      });
      assert.equal(rateLimitFields(await get(server.url, '/', { 'x-cost': '2' })).ratelimit, '"api";r=1;t=2');
      assert.equal((await get(server.url, '/', { 'x-cost': 'NaN' })).status, 200);
      assert.equal((await get(server.url, '/', { 'x-cost': 'throw' })).status, 429);
      assert.equal(server.stats.costFallbacks, 2);
    });

    it('shadow mode admits everything, sends no rate limit field, and counts would-limit', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({ limiter, policy, clock, mode: 'shadow' });
      const replies: Reply[] = [];
      for (let i = 0; i < 5; i++) replies.push(await get(server.url));
      assert.deepEqual(
        replies.map((reply) => reply.status),
        [200, 200, 200, 200, 200],
      );
      for (const reply of replies) assert.deepEqual(rateLimitFields(reply), {});
      assert.equal(server.stats.wouldLimit, 2);
      assert.equal(server.stats.admitted, 5);
      assert.equal(server.stats.limited, 0);
    });

    it('headers: false sends no RateLimit fields, but a 429 still carries Retry-After', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({ limiter, policy, clock, headers: false });
      const replies: Reply[] = [];
      for (let i = 0; i < 4; i++) replies.push(await get(server.url));
      assert.deepEqual(rateLimitFields(replies[0]!), {});
      assert.equal(replies[3]!.status, 429);
      assert.deepEqual(rateLimitFields(replies[3]!), { 'retry-after': '1' });
    });

    it('skip lets a request through undecided; a throwing skip is counted and the request decided', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({
        limiter,
        policy,
        clock,
        skip: (req) => {
          if (req.headers['x-skip'] === 'throw') throw new Error('boom');
          return req.headers['x-skip'] === 'yes';
        },
      });
      for (let i = 0; i < 5; i++) assert.equal((await get(server.url, '/', { 'x-skip': 'yes' })).status, 200);
      assert.deepEqual(rateLimitFields(await get(server.url, '/', { 'x-skip': 'yes' })), {});
      assert.equal(
        rateLimitFields(await get(server.url, '/', { 'x-skip': 'throw' })).ratelimit,
        '"api";r=2;t=1',
      );
      assert.equal(server.stats.skipped, 6);
      assert.equal(server.stats.hookErrors, 1);
    });

    it('onLimited sees the rejection with headers set; a response it ends replaces the default body', async () => {
      const { clock, limiter } = localBucket();
      const seen: Decision[] = [];
      const server = await serve({
        limiter,
        policy,
        clock,
        onLimited: (_req, res, decision) => {
          seen.push(decision);
          framework.endCustom(res, 'slow down');
        },
      });
      for (let i = 0; i < 3; i++) await get(server.url);
      const limited = await get(server.url);
      assert.equal(limited.status, 418);
      assert.equal(limited.body, 'slow down');
      assert.equal(limited.headers['retry-after'], '1');
      assert.equal(limited.headers.ratelimit, '"api";r=0;t=3');
      assert.equal(limited.headers['cache-control'], 'no-store', 'set before the hook, which may change it');
      assert.equal(seen.length, 1);
      assert.equal(seen[0]!.allowed, false);
    });

    it('a throwing onLimited is counted and the default 429 is sent', async () => {
      const { clock, limiter } = localBucket();
      const server = await serve({
        limiter,
        policy,
        clock,
        onLimited: () => {
          throw new Error('boom');
        },
      });
      for (let i = 0; i < 3; i++) await get(server.url);
      const limited = await get(server.url);
      assert.equal(limited.status, 429);
      assert.deepEqual(JSON.parse(limited.body), apiLimited(1));
      assert.equal(server.stats.hookErrors, 1);
    });
  });

  describe(`${framework.name}: stacked limiters`, () => {
    /** A strict policy (3 tokens, 1/s) and a loose one (100 tokens, 1/s) on one manual clock. */
    const strictAndLoose = () => {
      const { clock, limiter } = localBucket();
      const strict: SuiteOptions<Res> = {
        limiter,
        policy: { name: 'strict', limit: 3, windowSec: 3 },
        clock,
      };
      const loose: SuiteOptions<Res> = {
        limiter: createKeyedTokenBucket({ capacity: 100, refillPerSec: 1, clock }),
        policy: { name: 'loose', limit: 100, windowSec: 100 },
        clock,
      };
      return { strict, loose };
    };

    it('every limiter adds its members: a loose limiter after a strict one does not hide the strict count', async () => {
      const { strict, loose } = strictAndLoose();
      const server = await serveStack([strict, loose]);
      const replies: Reply[] = [];
      for (let i = 0; i < 4; i++) replies.push(await get(server.url));
      assert.deepEqual(rateLimitFields(replies[0]!), {
        'ratelimit-policy': '"strict";q=3;w=3, "loose";q=100;w=100',
        ratelimit: '"strict";r=2;t=1, "loose";r=99;t=1',
      });
      assert.deepEqual(rateLimitFields(replies[2]!), {
        'ratelimit-policy': '"strict";q=3;w=3, "loose";q=100;w=100',
        ratelimit: '"strict";r=0;t=3, "loose";r=97;t=3',
      });
      assert.equal(replies[3]!.status, 429);
      assert.deepEqual(
        rateLimitFields(replies[3]!),
        { 'ratelimit-policy': '"strict";q=3;w=3', ratelimit: '"strict";r=0;t=3', 'retry-after': '1' },
        'the strict limiter answers; the loose one never ran',
      );
    });

    it('a 429 from a later limiter keeps the members of the earlier ones', async () => {
      const { strict, loose } = strictAndLoose();
      const server = await serveStack([loose, strict]);
      for (let i = 0; i < 3; i++) await get(server.url);
      const limited = await get(server.url);
      assert.equal(limited.status, 429);
      assert.deepEqual(rateLimitFields(limited), {
        'ratelimit-policy': '"loose";q=100;w=100, "strict";q=3;w=3',
        ratelimit: '"loose";r=96;t=4, "strict";r=0;t=3',
        'retry-after': '1',
      });
    });

    it("fields the app set first are kept, a string or one string per line; a 429's Retry-After is the limiter's", async () => {
      const { clock, limiter } = localBucket();
      const server = await serveStack([{ limiter, policy, clock }], {
        'RateLimit-Policy': '"app";q=10;w=60',
        RateLimit: ['"app";r=0;t=30', '"app-burst";r=1;t=1'],
        'Retry-After': '30',
      });
      const replies: Reply[] = [];
      for (let i = 0; i < 4; i++) replies.push(await get(server.url));
      assert.deepEqual(rateLimitFields(replies[0]!), {
        'ratelimit-policy': '"app";q=10;w=60, "api";q=3;w=3',
        ratelimit: '"app";r=0;t=30, "app-burst";r=1;t=1, "api";r=2;t=1',
        'retry-after': '30',
      });
      assert.equal(replies[3]!.status, 429);
      assert.deepEqual(rateLimitFields(replies[3]!), {
        'ratelimit-policy': '"app";q=10;w=60, "api";q=3;w=3',
        ratelimit: '"app";r=0;t=30, "app-burst";r=1;t=1, "api";r=0;t=3',
        'retry-after': '1',
      });
      assert.equal(JSON.parse(replies[3]!.body).retryAfterSeconds, 1, 'the body says what the header says');
    });
  });

  describe(`${framework.name}: client address and key extraction`, () => {
    it('ignores X-Forwarded-For from an untrusted peer: a client cannot pick its own key', async () => {
      const { clock, limiter: inner } = localBucket();
      const { limiter, keys } = recording(inner);
      const server = await serve({ limiter, policy, clock, limiterKind: 'sync' });
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) {
        statuses.push((await get(server.url, '/', { 'x-forwarded-for': `198.51.100.${i}` })).status);
      }
      assert.deepEqual(
        statuses,
        [200, 200, 200, 429],
        'one bucket for the socket peer, whatever the header says',
      );
      assert.deepEqual(new Set(keys), new Set(['127.0.0.1']));
    });

    it('reads X-Forwarded-For from a trusted proxy, right to left; spoofed hops on the left are ignored', async () => {
      const { clock, limiter: inner } = localBucket();
      const { limiter, keys } = recording(inner);
      const server = await serve({
        limiter,
        policy,
        clock,
        limiterKind: 'sync',
        trustedProxies: ['loopback', '10.0.0.0/8'],
      });
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) {
        // The client prepends a random address; our proxies appended the real client and a hop.
        const forwardedFor = `198.51.100.${i}, 203.0.113.7, 10.1.2.3`;
        statuses.push((await get(server.url, '/', { 'x-forwarded-for': forwardedFor })).status);
      }
      assert.deepEqual(statuses, [200, 200, 200, 429]);
      assert.deepEqual(new Set(keys), new Set(['203.0.113.7']));
      // Padding past any hop limit neither gives the client a fresh bucket nor the proxy's.
      const padding = Array.from({ length: 40 }, (_, i) => `198.51.100.${i}`).join(', ');
      const padded = await get(server.url, '/', { 'x-forwarded-for': `${padding}, 203.0.113.7, 10.1.2.3` });
      assert.equal(padded.status, 429);
      assert.equal(keys.at(-1), '203.0.113.7');
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': '203.0.113.8' })).status, 200);
      assert.equal(keys.at(-1), '203.0.113.8');
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': 'garbage, 203.0.113.9' })).status, 200);
      assert.equal(keys.at(-1), '203.0.113.9');
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': '203.0.113.9, garbage' })).status, 200);
      assert.equal(keys.at(-1), '127.0.0.1', 'a malformed hop means the chain is not trusted past the peer');
    });

    it('groups IPv6 clients by /64 (default) and by a configured prefix', async () => {
      const { clock, limiter: inner } = localBucket();
      const { limiter, keys } = recording(inner);
      const server = await serve({
        limiter,
        policy,
        clock,
        limiterKind: 'sync',
        trustedProxies: ['loopback'],
      });
      const statuses: number[] = [];
      for (const address of [
        '2001:db8:1:2::a',
        '2001:db8:1:2:ffff::b',
        '2001:DB8:1:2:0:0:0:c',
        '2001:db8:1:2::d',
      ]) {
        statuses.push((await get(server.url, '/', { 'x-forwarded-for': address })).status);
      }
      assert.deepEqual(statuses, [200, 200, 200, 429], 'rotating addresses inside one /64 share a bucket');
      assert.deepEqual(new Set(keys), new Set(['2001:db8:1:2::/64']));
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': '2001:db8:1:3::a' })).status, 200);
      assert.equal(keys.at(-1), '2001:db8:1:3::/64');
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': '::ffff:203.0.113.7' })).status, 200);
      assert.equal(keys.at(-1), '203.0.113.7', 'IPv4-mapped IPv6 is the IPv4 client');

      const wide = recording(localBucket().limiter);
      const server56 = await serve({
        limiter: wide.limiter,
        policy,
        limiterKind: 'sync',
        trustedProxies: ['loopback'],
        ipv6PrefixLength: 56,
      });
      await get(server56.url, '/', { 'x-forwarded-for': '2001:db8:1:2ff::1' });
      assert.deepEqual(wide.keys, ['2001:db8:1:200::/56']);
    });

    it('a key function keys requests; a throwing, empty or over-long key falls back to the client address', async () => {
      const { clock, limiter: inner } = localBucket();
      const { limiter, keys } = recording(inner);
      const server = await serve({
        limiter,
        policy,
        clock,
        limiterKind: 'sync',
        key: (req) => {
          const tenant = req.headers['x-tenant'];
          if (tenant === 'throw') throw new Error('boom');
          if (tenant === 'long') return 'k'.repeat(10_000);
          return typeof tenant === 'string' ? `tenant:${tenant}` : '';
        },
      });
      assert.equal((await get(server.url, '/', { 'x-tenant': 'acme' })).status, 200);
      assert.equal((await get(server.url, '/', { 'x-tenant': 'throw' })).status, 200);
      assert.equal((await get(server.url)).status, 200);
      assert.equal((await get(server.url, '/', { 'x-tenant': 'long' })).status, 200);
      assert.deepEqual(keys, ['tenant:acme', '127.0.0.1', '127.0.0.1', 'k'.repeat(10_000), '127.0.0.1']);
      assert.equal(server.stats.keyFallbacks, 3);
      assert.equal(server.stats.limiterErrors, 0);
      assert.equal((await get(server.url)).status, 429, 'the fallbacks all spent the client address bucket');
    });

    it('a limiter that throws is reported to onError and the request admitted (fail open), never a crash', async () => {
      const errors: unknown[] = [];
      const broken: SyncLimiter = {
        limit() {
          throw new Error('broken limiter');
        },
      };
      const server = await serve({
        limiter: broken,
        policy,
        limiterKind: 'sync',
        onError: (error) => errors.push(error),
      });
      const reply = await get(server.url);
      assert.equal(reply.status, 200);
      assert.deepEqual(rateLimitFields(reply), {});
      assert.equal(server.stats.limiterErrors, 1);
      assert.equal((errors[0] as Error).message, 'broken limiter');
    });
  });

  describe(`${framework.name}: async hooks, broken limiters and oversized costs`, () => {
    /** A rejection with every number in place, from a custom limiter. */
    const denial = (over: Partial<Decision> = {}): Decision => ({
      allowed: false,
      limit: 3,
      remaining: 0,
      resetAtMs: Date.now() + 3000,
      retryAfterMs: 3000,
      ...over,
    });
    /** The same limiter called synchronously and through a promise: both middleware paths. */
    const bothKinds = (
      limit: (key: string, cost?: number) => Decision,
    ): [string, Pick<SuiteOptions<Res>, 'limiter' | 'limiterKind'>][] => [
      ['sync', { limiter: { limit }, limiterKind: 'sync' }],
      [
        'async',
        { limiter: { limit: async (key: string, cost?: number) => limit(key, cost) }, limiterKind: 'async' },
      ],
    ];
    const until = async (condition: () => boolean): Promise<void> => {
      while (!condition()) await new Promise((resolve) => setImmediate(resolve));
    };

    for (const [kind, limiter] of bothKinds(() => denial())) {
      it(`${kind}: an async onLimited is awaited: its own response is sent, a rejected one gets the default 429`, {
        timeout: 10_000,
      }, async () => {
        const server = await serve({
          ...limiter,
          policy,
          onLimited: async (req, res) => {
            await new Promise((resolve) => setTimeout(resolve, 5));
            if (req.headers['x-hook'] === 'reject') throw new Error('log failed');
            framework.endCustom(res, 'custom');
          },
        });
        const custom = await get(server.url);
        assert.equal(custom.status, 418);
        assert.equal(custom.body, 'custom');
        assert.equal(custom.headers['retry-after'], '3');
        const failed = await get(server.url, '/', { 'x-hook': 'reject' });
        assert.equal(failed.status, 429);
        assert.deepEqual(JSON.parse(failed.body), apiLimited(3));
        await until(() => server.stats.hookErrors === 1);
        assert.equal(server.stats.limited, 2);
      });
    }

    it('async: a request whose client left while its decision was pending is not continued', {
      timeout: 10_000,
    }, async () => {
      const admit: Decision = {
        allowed: true,
        limit: 3,
        remaining: 2,
        resetAtMs: Date.now() + 3000,
        retryAfterMs: 0,
      };
      // The first decision waits for the test; later ones are immediate.
      let release: ((decision: Decision) => void) | undefined;
      let pending: SuiteRequest | undefined;
      const server = await serve({
        limiter: {
          limit: () =>
            release === undefined
              ? new Promise<Decision>((resolve) => (release = resolve))
              : Promise.resolve(admit),
        },
        limiterKind: 'async',
        policy,
        key: (req) => {
          pending = req;
          return 'k';
        },
      });
      const { port } = new URL(server.url);
      const client = connect(Number(port), '127.0.0.1', () =>
        client.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
      );
      client.on('error', () => {});
      await until(() => pending !== undefined);
      client.destroy();
      // Express's request is Node's; Fastify's wraps it as `raw`.
      const raw = (pending as SuiteRequest & { raw?: { destroyed: boolean } }).raw ?? pending;
      await until(() => (raw as unknown as { destroyed: boolean }).destroyed);
      release!(admit);
      await until(() => server.stats.clientGone === 1);
      assert.equal(server.stats.admitted, 1);
      // The next client is served as usual.
      const reply = await get(server.url);
      assert.equal(reply.status, 200);
      assert.equal(server.stats.clientGone, 1);
      assert.equal(server.stats.admitted, 2);
    });

    it('async key, cost, skip and onError: never awaited or crashing; the documented fallbacks, counted', {
      timeout: 10_000,
    }, async () => {
      const { clock, limiter } = localBucket();
      let onErrorCalls = 0;
      const server = await serve({
        limiter: {
          limit(key, cost) {
            if (key === 'tenant:broken') throw new Error('broken limiter');
            return limiter.limit(key, cost);
          },
        },
        limiterKind: 'sync',
        policy,
        clock,
        key: ((req: SuiteRequest) => {
          if (req.headers['x-key'] === 'async') return Promise.reject(new Error('lookup failed'));
          return req.headers['x-key'] === 'broken' ? 'tenant:broken' : '127.0.0.1';
        }) as (req: SuiteRequest) => string,
        cost: (() => Promise.reject(new Error('cost lookup failed'))) as unknown as () => number,
        skip: (() => Promise.reject(new Error('skip lookup failed'))) as unknown as () => boolean,
        onError: async () => {
          onErrorCalls++;
          throw new Error('reporting failed');
        },
      });
      const asyncKey = await get(server.url, '/', { 'x-key': 'async' });
      assert.equal(asyncKey.status, 200);
      assert.equal(asyncKey.headers.ratelimit, '"api";r=2;t=1', 'keyed by the client address, cost 1');
      assert.equal((await get(server.url, '/', { 'x-key': 'broken' })).status, 200);
      await until(() => server.stats.hookErrors === 3);
      assert.equal(onErrorCalls, 1);
      assert.equal(server.stats.keyFallbacks, 1);
      assert.equal(server.stats.costFallbacks, 2);
      assert.equal(server.stats.skipped, 0, 'a promise from skip is not true: the requests were decided');
      assert.equal(server.stats.limiterErrors, 1);
    });

    for (const [kind, limiter] of bothKinds(() => undefined as unknown as Decision)) {
      it(`${kind}: a limiter that returns no decision is admitted and counted, never a hang or a 500`, {
        timeout: 10_000,
      }, async () => {
        const errors: unknown[] = [];
        const server = await serve({ ...limiter, policy, onError: (error) => errors.push(error) });
        const reply = await get(server.url);
        assert.equal(reply.status, 200);
        assert.deepEqual(rateLimitFields(reply), {});
        assert.equal(server.stats.limiterErrors, 1);
        assert.equal(server.stats.admitted, 1);
        assert.equal((errors[0] as { code?: string }).code, 'ERR_SPILLWAY_INVALID_OPTION');
      });
    }

    for (const [kind, limiter] of bothKinds((_key, cost) =>
      (cost ?? 1) > 1 ? { ...denial(), allowed: true, remaining: 2 } : denial(),
    )) {
      it(`${kind}: fields that cannot be written do not stop an admitted request; a 429 that cannot be written is the framework's error, not a hang`, {
        timeout: 10_000,
      }, async () => {
        const server = await serve({
          ...limiter,
          policy,
          cost: (req) => Number(req.headers['x-cost'] ?? 1),
          clock: {
            nowMs() {
              throw new Error('clock broken');
            },
          },
        });
        const admitted = await get(server.url, '/', { 'x-cost': '2' });
        assert.equal(admitted.status, 200);
        assert.equal(admitted.headers.ratelimit, undefined);
        assert.equal(server.stats.hookErrors, 1);
        // The framework's error response (Express keeps the 429 already set, Fastify answers 500).
        const rejected = await get(server.url);
        assert.ok(rejected.status === 429 || rejected.status === 500, String(rejected.status));
        assert.equal(server.stats.limited, 1);
        // Sync: the throw reaches the framework directly; async: counted, then next(error).
        assert.equal(server.stats.hookErrors, kind === 'sync' ? 1 : 2);
      });
    }

    for (const [kind, limiterOf] of [
      ['sync', (inner: SyncLimiter) => ({ limiter: inner, limiterKind: 'sync' as const })],
      [
        'async',
        (inner: SyncLimiter) => ({
          limiter: { limit: async (key: string, cost?: number) => inner.limit(key, cost) },
          limiterKind: 'async' as const,
        }),
      ],
    ] as const) {
      it(`${kind}: a cost above the limiter's capacity is a 429 with the policy window as Retry-After, not a bypass`, {
        timeout: 10_000,
      }, async () => {
        const { clock, limiter } = localBucket();
        const server = await serve({
          ...limiterOf(limiter),
          policy,
          clock,
          cost: (req) => Number(req.headers['x-cost']),
        });
        for (let i = 0; i < 3; i++) {
          const reply = await get(server.url, '/', { 'x-cost': '4' });
          assert.equal(reply.status, 429);
          assert.deepEqual(rateLimitFields(reply), {
            'ratelimit-policy': '"api";q=3;w=3',
            ratelimit: '"api";r=0;t=3',
            'retry-after': '3',
          });
          assert.deepEqual(JSON.parse(reply.body), apiLimited(3));
        }
        assert.equal(server.stats.limited, 3);
        assert.equal(server.stats.limiterErrors, 0);
        assert.equal(
          (await get(server.url, '/', { 'x-cost': '-1' })).status,
          200,
          'negative: cost 1, as before',
        );
        assert.equal(server.stats.costFallbacks, 1);
        const atCapacity = await get(server.url, '/', { 'x-cost': '3' });
        assert.equal(atCapacity.status, 429);
        assert.equal(atCapacity.headers['retry-after'], '1', 'a cost it can grant later: the ordinary wait');
      });
    }

    it('a rejection whose reset is NaN still says t of at least Retry-After', async () => {
      const server = await serve({
        limiter: { limit: () => denial({ resetAtMs: Number.NaN, retryAfterMs: Number.NaN }) },
        limiterKind: 'sync',
        policy,
      });
      const reply = await get(server.url);
      assert.equal(reply.status, 429);
      assert.equal(reply.headers['retry-after'], '1');
      assert.equal(reply.headers.ratelimit, '"api";r=0;t=1');
    });

    it('a policy name outside the proxy bucket-name rule is refused when the middleware is built', async () => {
      for (const name of ['é', 'a b', 'a"b', '-api', 'api\n']) {
        await assert.rejects(
          async () => serve({ limiter: localBucket().limiter, policy: { name, limit: 3, windowSec: 3 } }),
          (error: { code?: string; details?: { field?: string } }) =>
            error.code === 'ERR_SPILLWAY_INVALID_OPTION' && error.details?.field === 'policy.name',
          name,
        );
      }
    });
  });

  describe(`${framework.name}: global limiter`, () => {
    it('fake directives: ratio 0 admits synchronously; ratio 1 rejects with the retry of one interval; shadow is invisible but counted', async () => {
      const h = harness({ intervalMs: 1000 });
      const server = await serve({
        limiter: h.limiter,
        policy: { name: 'api', limit: 100, windowSec: 1 },
        clock: h.clock,
        key: () => 'api',
      });

      const before = await get(server.url);
      assert.equal(before.status, 200);
      assert.deepEqual(JSON.parse(before.body), { ok: true, sync: true });
      assert.deepEqual(
        rateLimitFields(before),
        { 'ratelimit-policy': '"api";q=100;w=1' },
        'no count before any directive',
      );

      h.aggregator.set('api', { dropRatio: 0, limitRps: 100 });
      await h.flush();
      const admitted = await get(server.url);
      assert.deepEqual(rateLimitFields(admitted), {
        'ratelimit-policy': '"api";q=100;w=1',
        ratelimit: '"api";r=100;t=0',
      });

      h.aggregator.set('api', { dropRatio: 1, limitRps: 100 });
      await h.flush();
      const dropped = await get(server.url);
      assert.equal(dropped.status, 429);
      assert.deepEqual(rateLimitFields(dropped), {
        'ratelimit-policy': '"api";q=100;w=1',
        ratelimit: '"api";r=0;t=1',
        'retry-after': '1',
      });
      assert.deepEqual(JSON.parse(dropped.body), apiLimited(1));

      h.aggregator.set('api', { dropRatio: 1, limitRps: 100, mode: 'shadow' });
      await h.flush();
      const shadowed = await get(server.url);
      assert.equal(shadowed.status, 200);
      assert.deepEqual(
        rateLimitFields(shadowed),
        rateLimitFields(admitted),
        'a would-drop looks like any admit',
      );
      assert.equal(server.stats.wouldLimit, 1);
      assert.equal(server.stats.limited, 1);
      assert.equal(server.stats.admitted, 3);
      const bucket = h.limiter.snapshot().buckets.find((b) => b.key === 'api');
      assert.equal(bucket?.wouldDrop, 1);
      assert.equal(bucket?.offered, 4);
    });

    it('the real controller: offered load reported, a ratio computed, and about that share rejected', async () => {
      const clock = new ManualClock(1_700_000_000_000);
      const network = new InMemoryNetwork({ scheduler: clock });
      const controller = createController({
        id: 'controller',
        scheduler: clock,
        epoch: 1,
        config: {
          version: 1,
          intervalMs: 1000,
          ttlMs: 10_000,
          buckets: [{ key: 'api', limitRps: 10, mode: 'enforce', scope: 'global' }],
          ratioPolicy: { kind: 'plain' },
        },
      });
      network.listen('controller', controller.handleReport);
      const limiter = createGlobalLimiter({
        reporterId: 'edge-1',
        zone: 'z1',
        clients: [network.connect('controller', { from: 'edge-1' })],
        scheduler: clock,
        random: seededRandom(7),
        jitterRatio: 0,
      });
      const server = await serve({
        limiter,
        policy: { name: 'api', limit: 10, windowSec: 1 },
        clock,
        key: () => 'api',
      });

      // One report window of 40 requests, all admitted (no directive yet). The controller computes
      // a bucket's first ratio from the report that brings it, so the reply brings the ratio down.
      for (let i = 0; i < 40; i++) assert.equal((await get(server.url)).status, 200);
      clock.advance(1000);
      await drive(clock, limiter.flush());
      // Offered 40 rps against a limit of 10: the plain policy drops 30/40 of it.
      assert.equal(controller.snapshot().buckets[0]?.dropRatio, 0.75);
      assert.equal(limiter.snapshot().buckets[0]?.dropRatio, 0.75);

      let limited = 0;
      for (let i = 0; i < 80; i++) {
        const reply = await get(server.url);
        if (reply.status === 429) {
          limited++;
          assert.equal(reply.headers['retry-after'], '1');
        }
      }
      assert.ok(limited >= 45 && limited <= 75, `expected about 60 of 80 rejected, got ${limited}`);
      assert.equal(server.stats.limited, limited);
    });
  });

  describe(`${framework.name}: Redis limiter`, {
    skip: !redisServerAvailable() && process.env.CI !== 'true',
  }, () => {
    let redisServer: RedisServer;
    let client: Redis;
    before(async () => {
      redisServer = await startRedis();
      client = new Redis({
        host: redisServer.host,
        port: redisServer.port,
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        lazyConnect: true,
      });
      await client.connect();
    });
    after(async () => {
      client?.disconnect();
      await redisServer?.stop();
    });

    /** 3 tokens refilling at one per 1000 s: no refill within a test, however slow the machine. */
    const redisBucket = (prefix: string, timeoutMs = 5000): RedisLimiter =>
      createRedisTokenBucket({
        redis: ioredisAdapter(client),
        prefix,
        capacity: 3,
        refillPerSec: 0.001,
        timeoutMs,
      });

    it('awaits the decision (not synchronous), counts per client and rejects with 429 after the limit', async () => {
      const server = await serve({ limiter: redisBucket(`${framework.name}-a`), policy });
      const replies: Reply[] = [];
      for (let i = 0; i < 4; i++) replies.push(await get(server.url));
      assert.deepEqual(
        replies.map((reply) => reply.status),
        [200, 200, 200, 429],
      );
      assert.deepEqual(JSON.parse(replies[0]!.body), { ok: true, sync: false });
      assert.equal(replies[0]!.headers['ratelimit-policy'], '"api";q=3;w=3');
      // Reset is when the bucket is full again: 1000 s per token on the Redis clock.
      assert.match(String(replies[0]!.headers.ratelimit), /^"api";r=2;t=(999|1000)$/);
      assert.match(String(replies[3]!.headers.ratelimit), /^"api";r=0;t=(299\d|3000)$/);
      assert.equal(replies[3]!.headers['retry-after'], '1000');
      assert.deepEqual(JSON.parse(replies[3]!.body), apiLimited(1000));
      assert.equal(server.stats.limited, 1);
    });

    it('a key the Redis limiter refuses falls back to the client address', async () => {
      const server = await serve({
        limiter: redisBucket(`${framework.name}-b`),
        policy,
        key: () => 'k'.repeat(10_000),
      });
      assert.equal((await get(server.url)).status, 200);
      assert.equal(server.stats.keyFallbacks, 1);
      assert.equal(server.stats.limiterErrors, 0);
    });

    it('shadow mode over Redis: admitted, no fields, counted', async () => {
      const server = await serve({ limiter: redisBucket(`${framework.name}-c`), policy, mode: 'shadow' });
      for (let i = 0; i < 5; i++) assert.deepEqual(rateLimitFields(await get(server.url)), {});
      assert.equal(server.stats.wouldLimit, 2);
    });

    it('fail-open decisions pass through: admitted, counted, and no rate limit field claimed', async () => {
      const limiter = redisBucket(`${framework.name}-d`, 100);
      const server = await serve({ limiter, policy });
      redisServer.pause();
      let reply: Reply;
      try {
        reply = await get(server.url);
      } finally {
        redisServer.resume();
      }
      assert.equal(reply.status, 200);
      assert.deepEqual(rateLimitFields(reply), {}, 'a fail-open decision has no count to show');
      assert.equal(server.stats.failOpen, 1);
      assert.equal(limiter.stats.failOpen, 1);
    });
  });
}
