import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { ManualClock } from '../../../src/core/clock.js';
import { fastifyRateLimit } from '../../../src/http/fastify/rate-limit.js';
import { createKeyedTokenBucket } from '../../../src/local/index.js';
import {
  get,
  type RunningServer,
  rateLimitFields,
  rateLimitSuite,
  type SuiteOptions,
} from '../rate-limit-suite.js';

async function listen(app: ReturnType<typeof Fastify>): Promise<{ url: string; close(): Promise<void> }> {
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
}

async function startStack(
  stack: SuiteOptions<FastifyReply>[],
  preset: Record<string, string | string[]> = {},
): Promise<RunningServer> {
  const limits = stack.map((options) => fastifyRateLimit(options));
  const app = Fastify({ forceCloseConnections: true });
  const ranSynchronously = new WeakMap<FastifyRequest, boolean>();
  app.addHook('onRequest', (_request, reply, done) => {
    for (const [name, value] of Object.entries(preset)) reply.header(name, value);
    done();
  });
  // Each plugin's own hook, wrapped to observe whether `done` runs before the hook returns.
  for (const limit of limits) {
    app.addHook('onRequest', (request, reply, done) => {
      let returned = false;
      limit.onRequest(request, reply, () => {
        ranSynchronously.set(request, ranSynchronously.get(request) !== false && !returned);
        done();
      });
      returned = true;
    });
  }
  app.get('/', async (request) => ({ ok: true, sync: ranSynchronously.get(request) === true }));
  app.get('/healthz', async () => 'ok');
  const server = await listen(app);
  return { url: server.url, stats: limits[0]!.stats, close: server.close };
}

rateLimitSuite<FastifyReply>({
  name: 'fastify',
  start: (options) => startStack([options]),
  startStack,
  endCustom: (reply, body) => {
    reply.code(418).type('text/plain').send(body);
  },
});

describe('fastify: wiring', () => {
  const clock = new ManualClock(0);
  const bucket = () => createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, clock });
  const policy = { name: 'search', limit: 1, windowSec: 1 };

  it('register(plugin) limits every route of the registering scope, like fastify-plugin', async () => {
    const limit = fastifyRateLimit({ limiter: bucket(), policy, clock });
    assert.equal(limit.name, 'fastifyRateLimit');
    const app = Fastify({ forceCloseConnections: true });
    await app.register(limit);
    app.get('/a', async () => 'a');
    app.get('/b', async () => 'b');
    const server = await listen(app);
    try {
      const first = await get(server.url, '/a');
      assert.equal(first.body, 'a');
      assert.deepEqual(rateLimitFields(first), {
        'ratelimit-policy': '"search";q=1;w=1',
        ratelimit: '"search";r=0;t=1',
      });
      const second = await get(server.url, '/b');
      assert.equal(second.status, 429, 'one client bucket across routes');
      assert.deepEqual(JSON.parse(second.body), {
        error: 'rate_limited',
        message: 'rate limit exceeded: search',
        policies: ['search'],
        retryAfterSeconds: 1,
      });
      assert.equal(limit.stats.limited, 1);
    } finally {
      await server.close();
    }
  });

  it('per route through the onRequest route option', async () => {
    const limit = fastifyRateLimit({ limiter: bucket(), policy, clock });
    const app = Fastify({ forceCloseConnections: true });
    app.get('/search', { onRequest: limit.onRequest }, async () => 'results');
    app.get('/free', async () => 'free');
    const server = await listen(app);
    try {
      assert.equal((await get(server.url, '/search')).status, 200);
      assert.equal((await get(server.url, '/search')).status, 429);
      assert.equal((await get(server.url, '/free')).status, 200);
      assert.equal(limit.stats.requests, 2);
    } finally {
      await server.close();
    }
  });

  it("ignores Fastify's trustProxy: the key comes from the socket peer and trustedProxies only", async () => {
    const limit = fastifyRateLimit({ limiter: bucket(), policy, clock });
    const app = Fastify({ forceCloseConnections: true, trustProxy: true });
    await app.register(limit);
    app.get('/', async (request) => request.ip);
    const server = await listen(app);
    try {
      const first = await get(server.url, '/', { 'x-forwarded-for': '198.51.100.1' });
      assert.equal(first.body, '198.51.100.1', 'Fastify itself believes the header');
      assert.equal((await get(server.url, '/', { 'x-forwarded-for': '198.51.100.2' })).status, 429);
    } finally {
      await server.close();
    }
  });

  it('an onLimited that returns the reply without sending gets the default 429, not a hung request', async () => {
    const limit = fastifyRateLimit({
      limiter: createKeyedTokenBucket({ capacity: 1, refillPerSec: 0.001, clock }),
      policy,
      clock,
      // `reply.header` returns the reply, which is thenable (it settles when the reply ends).
      onLimited: (_request, reply) => reply.header('x-why', 'quota'),
    });
    const app = Fastify({ forceCloseConnections: true });
    await app.register(limit);
    app.get('/', async () => 'ok');
    const server = await listen(app);
    try {
      assert.equal((await get(server.url)).status, 200);
      const limited = await get(server.url);
      assert.equal(limited.status, 429);
      assert.equal(limited.headers['x-why'], 'quota');
      assert.match(limited.body, /"error":"rate_limited"/);
      assert.equal(limit.stats.hookErrors, 0);
    } finally {
      await server.close();
    }
  });

  it('a custom onLimited response is sent once when the app has an async onSend hook', async () => {
    const limit = fastifyRateLimit({
      limiter: createKeyedTokenBucket({ capacity: 1, refillPerSec: 0.001, clock }),
      policy,
      clock,
      onLimited: (_request, reply) => {
        reply.code(429).send({ custom: true });
      },
    });
    const app = Fastify({ forceCloseConnections: true });
    const sent: unknown[] = [];
    app.addHook('onSend', async (_request, _reply, payload) => {
      sent.push(payload);
      await new Promise((resolve) => setImmediate(resolve));
      return payload;
    });
    let errors = 0;
    app.setErrorHandler((error, _request, reply) => {
      errors++;
      reply.send(error);
    });
    await app.register(limit);
    app.get('/', async () => 'ok');
    const server = await listen(app);
    try {
      assert.equal((await get(server.url)).status, 200);
      const limited = await get(server.url);
      assert.equal(limited.status, 429);
      assert.equal(limited.body, '{"custom":true}');
      assert.deepEqual(
        sent,
        ['ok', '{"custom":true}'],
        'onSend ran once per response: no second, default body',
      );
      assert.equal(errors, 0);
    } finally {
      await server.close();
    }
  });

  it('a sync limiter calls done() before the hook returns', () => {
    const limit = fastifyRateLimit({ limiter: bucket(), policy, clock });
    const headers: Record<string, string> = {};
    const request = {
      raw: { socket: { remoteAddress: '192.0.2.1' } },
      headers: {},
    } as unknown as FastifyRequest;
    const reply = {
      getHeader: (name: string) => headers[name],
      header: (name: string, value: string) => {
        headers[name] = value;
      },
    } as unknown as FastifyReply;
    let doneCalls = 0;
    limit.onRequest(request, reply, () => {
      doneCalls++;
    });
    assert.equal(doneCalls, 1);
    assert.equal(headers.RateLimit, '"search";r=0;t=1');
    assert.equal(limit.clientAddress(request), '192.0.2.1');
  });
});
