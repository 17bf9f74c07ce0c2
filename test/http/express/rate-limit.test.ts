import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import express, { type Request, type Response } from 'express';
import { ManualClock } from '../../../src/core/clock.js';
import { expressRateLimit } from '../../../src/http/express/rate-limit.js';
import { createKeyedTokenBucket } from '../../../src/local/index.js';
import { createRedisTokenBucket, type RedisScriptClient } from '../../../src/redis/index.js';
import {
  get,
  type RunningServer,
  rateLimitFields,
  rateLimitSuite,
  type SuiteOptions,
} from '../rate-limit-suite.js';

/** Serves `app` on 127.0.0.1, port 0; `close` also drops open connections. */
async function listen(app: express.Express): Promise<{ url: string; close(): Promise<void> }> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

async function startStack(
  stack: SuiteOptions<Response>[],
  preset: Record<string, string | string[]> = {},
): Promise<RunningServer> {
  const limits = stack.map((options) => expressRateLimit(options));
  const app = express();
  const ranSynchronously = new WeakMap<Request, boolean>();
  app.use((_req, res, next) => {
    for (const [name, value] of Object.entries(preset)) res.setHeader(name, value);
    next();
  });
  for (const limit of limits) {
    app.use((req, res, next) => {
      let returned = false;
      limit(req, res, () => {
        ranSynchronously.set(req, ranSynchronously.get(req) !== false && !returned);
        next();
      });
      returned = true;
    });
  }
  app.get('/', (req, res) => {
    res.json({ ok: true, sync: ranSynchronously.get(req) === true });
  });
  app.get('/healthz', (_req, res) => {
    res.send('ok');
  });
  const server = await listen(app);
  return { url: server.url, stats: limits[0]!.stats, close: server.close };
}

rateLimitSuite<Response>({
  name: 'express',
  start: (options) => startStack([options]),
  startStack,
  endCustom: (res, body) => {
    res.status(418).send(body);
  },
});

describe('express: wiring', () => {
  it('works as plain app.use and per route; the middleware function is named and exposes stats', async () => {
    const clock = new ManualClock(0);
    const limit = expressRateLimit({
      limiter: createKeyedTokenBucket({ capacity: 1, refillPerSec: 1, clock }),
      policy: { name: 'search', limit: 1, windowSec: 1 },
      clock,
    });
    assert.equal(limit.name, 'expressRateLimit');
    const app = express();
    app.get('/search', limit, (_req, res) => {
      res.send('results');
    });
    app.get('/free', (_req, res) => {
      res.send('free');
    });
    const server = await listen(app);
    try {
      const first = await get(server.url, '/search');
      assert.equal(first.body, 'results');
      assert.deepEqual(rateLimitFields(first), {
        'ratelimit-policy': '"search";q=1;w=1',
        ratelimit: '"search";r=0;t=1',
      });
      assert.equal((await get(server.url, '/search')).status, 429);
      assert.equal((await get(server.url, '/free')).status, 200);
      assert.equal(limit.stats.requests, 2);
    } finally {
      await server.close();
    }
  });

  it('a sync limiter calls next() before the middleware returns; no promise is returned', () => {
    const limit = expressRateLimit({
      limiter: createKeyedTokenBucket({ capacity: 1, refillPerSec: 1 }),
      policy: { name: 'api', limit: 1, windowSec: 1 },
    });
    const req = { socket: { remoteAddress: '192.0.2.1' }, headers: {} } as unknown as Request;
    const headers: Record<string, string> = {};
    const res = {
      getHeader: (name: string) => headers[name],
      setHeader: (name: string, value: string) => {
        headers[name] = value;
      },
    } as unknown as Response;
    let nextCalls = 0;
    const returned: unknown = limit(req, res, () => {
      nextCalls++;
    });
    assert.equal(nextCalls, 1);
    assert.equal(returned, undefined);
    assert.equal(headers['RateLimit-Policy'], '"api";q=1;w=1');
    assert.equal(limit.clientAddress(req), '192.0.2.1');
  });

  it('an async limiter calls next() only after its decision resolves', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    // A store that answers when told to: the token bucket script's reply for "allowed, 0 left".
    const redis: RedisScriptClient = {
      evalsha: async () => {
        await gate;
        return [1, 0, 0, 0];
      },
      eval: async () => [1, 0, 0, 0],
    };
    const limit = expressRateLimit({
      limiter: createRedisTokenBucket({ redis, capacity: 1, refillPerSec: 1, timeoutMs: 60_000 }),
      policy: { name: 'api', limit: 1, windowSec: 1 },
    });
    const req = { socket: { remoteAddress: '192.0.2.1' }, headers: {} } as unknown as Request;
    const res = { getHeader: () => undefined, setHeader: () => {} } as unknown as Response;
    let nextCalls = 0;
    const done = new Promise<void>((resolve) => {
      limit(req, res, () => {
        nextCalls++;
        resolve();
      });
    });
    assert.equal(nextCalls, 0);
    release();
    await done;
    assert.equal(nextCalls, 1);
  });

  it('an async decision whose continuation throws is counted and reported, never an unhandled rejection', async () => {
    const redis: RedisScriptClient = {
      evalsha: async () => [1, 0, 0, 0],
      eval: async () => [1, 0, 0, 0],
    };
    const errors: unknown[] = [];
    const limit = expressRateLimit({
      limiter: createRedisTokenBucket({ redis, capacity: 1, refillPerSec: 1, timeoutMs: 60_000 }),
      policy: { name: 'api', limit: 1, windowSec: 1 },
      onError: (error) => errors.push(error),
    });
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      const req = { socket: { remoteAddress: '192.0.2.1' }, headers: {} } as unknown as Request;
      const res = { getHeader: () => undefined, setHeader: () => {} } as unknown as Response;
      limit(req, res, () => {
        throw new Error('downstream broke');
      });
      const deadline = Date.now() + 5_000;
      while (limit.stats.hookErrors === 0 && Date.now() < deadline) {
        await new Promise((resolve) => setImmediate(resolve));
      }
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(limit.stats.hookErrors, 1);
      assert.equal((errors[0] as Error).message, 'downstream broke');
      assert.deepEqual(unhandled, []);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('headers the app already flushed: an async decision still runs the handler (no hang), counted in hookErrors', {
    timeout: 10_000,
  }, async () => {
    const limit = expressRateLimit({
      limiter: createKeyedTokenBucket({ capacity: 5, refillPerSec: 1 }),
      limiterKind: 'async',
      policy: { name: 'api', limit: 5, windowSec: 5 },
    });
    const app = express();
    app.use((_req, res, next) => {
      res.flushHeaders();
      next();
    });
    app.use(limit);
    app.get('/', (_req, res) => {
      res.end('handled');
    });
    const server = await listen(app);
    try {
      const reply = await get(server.url);
      assert.equal(reply.status, 200);
      assert.equal(reply.body, 'handled');
      assert.equal(limit.stats.admitted, 1);
      assert.equal(limit.stats.hookErrors, 1);
    } finally {
      await server.close();
    }
  });

  it('rejects bad options with ERR_SPILLWAY_INVALID_OPTION', () => {
    const limiter = createKeyedTokenBucket({ capacity: 1, refillPerSec: 1 });
    const policy = { name: 'api', limit: 1, windowSec: 1 };
    for (const [index, options] of [
      { limiter, policy: { name: '', limit: 1, windowSec: 1 } },
      { limiter, policy: { name: 'api', limit: 0, windowSec: 1 } },
      { limiter, policy, mode: 'off' },
      { limiter, policy, key: 'ip' },
      { limiter, policy, trustedProxies: ['not-a-cidr'] },
      { limiter, policy, ipv6PrefixLength: 129 },
      { limiter: {}, policy },
    ].entries()) {
      assert.throws(
        () => expressRateLimit(options as never),
        (error: Error & { code?: string }) => error.code === 'ERR_SPILLWAY_INVALID_OPTION',
        `options #${index}`,
      );
    }
  });
});
