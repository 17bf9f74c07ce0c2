// Spellings of a limited route against real routers: every request target that reaches a handler
// behind a bucket's route must match that bucket in one of the proxy's path readings
// (`requestPathReadings`). Matching more spellings than an upstream routes there is the safe
// failure; fewer is a bypass. The targets combine the pieces routers disagree on: dot segments
// (literal and percent-encoded), `;params`, `\`, empty segments, case and encoded letters.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import express from 'express';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import {
  compilePathPrefix,
  compileRoutePattern,
  requestPathReadings,
} from '../../src/http/rules/route-pattern.js';

const route = compileRoutePattern('/v1/payments/:id');
const prefix = compilePathPrefix('/admin');
const matchesBucket = (target: string) =>
  requestPathReadings(target).some((path) => route.match(path) !== undefined || prefix.matches(path));

/** The raw response to a GET of `target`, sent byte for byte (no client-side normalization). */
function rawGet(port: number, target: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () =>
      socket.write(`GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`),
    );
    let got = '';
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => {
      got += data;
    });
    socket.on('error', () => {});
    socket.on('close', () => resolve(got));
  });
}

describe('route spellings against real routers', () => {
  let expressServer: Server;
  let fastify: FastifyInstance;
  let fastifySemicolon: FastifyInstance;
  let expressPort = 0;
  let fastifyPort = 0;
  let fastifySemicolonPort = 0;

  before(async () => {
    const app = express();
    app.get('/v1/payments/:id', (_req, res) => {
      res.send('HIT');
    });
    app.use('/admin', (_req, res) => {
      res.send('HIT');
    });
    app.use((_req, res) => {
      res.status(404).send('miss');
    });
    expressServer = createServer(app);
    await new Promise<void>((resolve) => expressServer.listen(0, '127.0.0.1', resolve));
    expressPort = (expressServer.address() as AddressInfo).port;
    // Fastify's most forgiving routing: every option that makes more spellings reach a route.
    const forgiving = { ignoreTrailingSlash: true, ignoreDuplicateSlashes: true, caseSensitive: false };
    const startFastify = async (routerOptions: Record<string, boolean>) => {
      const instance = Fastify({ routerOptions } as FastifyServerOptions);
      instance.get('/v1/payments/:id', async () => 'HIT');
      instance.all('/admin', async () => 'HIT');
      instance.all('/admin/*', async () => 'HIT');
      await instance.listen({ port: 0, host: '127.0.0.1' });
      return instance;
    };
    fastify = await startFastify(forgiving);
    fastifyPort = (fastify.server.address() as AddressInfo).port;
    // Its non-default `useSemicolonDelimiter`: everything from a path's first `;` is the query.
    fastifySemicolon = await startFastify({ ...forgiving, useSemicolonDelimiter: true });
    fastifySemicolonPort = (fastifySemicolon.server.address() as AddressInfo).port;
  });

  after(async () => {
    expressServer.close();
    await fastify.close();
    await fastifySemicolon.close();
  });

  it('runs a Fastify that cuts the path at its first semicolon', async () => {
    // Without the option `/admin;x` reaches no handler: the test below would not cover it.
    assert.ok((await rawGet(fastifySemicolonPort, '/admin;x')).includes('HIT'));
    assert.ok(!(await rawGet(fastifyPort, '/admin;x')).includes('HIT'));
  });

  it('every spelling Express 5 or Fastify 5 (either semicolon mode) routes to a limited handler matches its bucket', async () => {
    // biome-ignore format: a table
    const pieces = [
      'v1', 'V1', '%76%31', 'v1;x', 'v1.', '.', '..', '%2e', '%2E%2e', '..;', '.;', '', 'x', '%2f',
      '\\', 'v1\\payments', 'payments', 'PAYMENTS', 'payments;a=b', 'pay%6Dents', 'payments%20',
      'payments.', '1', '1;x', '1%2f2', '%00', 'admin', 'ADMIN', 'admin;', 'admin%2f', 'admin.',
      'admin\\x', '%61dmin',
    ];
    const targets = new Set<string>();
    for (const a of pieces) {
      for (const b of pieces) {
        targets.add(`/${a}/${b}/1`);
        targets.add(`/${a}/${b}`);
        targets.add(`/${a}/payments/${b}`);
        targets.add(`/x/${a}/${b}/1`);
        targets.add(`/${a}//${b}/1`);
        targets.add(`/${a}/v1/${b}/1`);
        targets.add(`/v1/payments/${a}/${b}/../x`);
      }
    }
    const bypasses: string[] = [];
    let routed = 0;
    const list = [...targets];
    // A few dozen connections at a time: thousands of targets in seconds, without running out of ports.
    for (let i = 0; i < list.length; i += 48) {
      await Promise.all(
        list.slice(i, i + 48).map(async (target) => {
          const ours = matchesBucket(target);
          for (const [name, port] of [
            ['express', expressPort],
            ['fastify', fastifyPort],
            ['fastify useSemicolonDelimiter', fastifySemicolonPort],
          ] as const) {
            if (!(await rawGet(port, target)).includes('HIT')) continue;
            routed++;
            if (!ours) bypasses.push(`${name} ${JSON.stringify(target)}`);
          }
        }),
      );
    }
    assert.ok(routed > 100, `the routers served the limited handlers for ${routed} spellings`);
    assert.deepEqual(bypasses, [], `${bypasses.length} of ${list.length} targets`);
  });

  it('every spelling a WHATWG URL router routes to a limited handler matches its bucket', () => {
    // biome-ignore format: a table
    const pieces = [
      'v1', 'V1', '%76%31', 'v1;x', '.', '..', '%2e', '%2E%2e', '.%2e', '..;', '', 'x', '\\',
      '\\\\', 'v1\\payments', 'payments', 'pay%6Dents', '1', 'admin', 'admin\\x', '%61dmin', '%09',
      '%00', 'x:y', 'a@b',
    ];
    const targets = new Set<string>();
    for (const a of pieces) {
      for (const b of pieces) {
        for (const c of ['1', '', 'payments/1']) {
          targets.add(`/${a}/${b}/${c}`);
          targets.add(`//${a}/${b}/${c}`);
          targets.add(`/${a}//${b}/${c}`);
          targets.add(`/\\${a}/${b}/${c}`);
        }
      }
    }
    const bypasses: string[] = [];
    let routed = 0;
    for (const target of targets) {
      let pathname: string;
      try {
        pathname = new URL(target, 'http://localhost').pathname;
      } catch {
        continue;
      }
      // A router on `new URL(req.url, base).pathname`: case-insensitive, trailing slash ignored.
      const parts = (pathname.replace(/\/+$/, '') || '/').toLowerCase().split('/');
      const hit =
        (parts.length === 4 && parts[1] === 'v1' && parts[2] === 'payments' && parts[3] !== '') ||
        parts[1] === 'admin';
      if (!hit) continue;
      routed++;
      if (!matchesBucket(target)) bypasses.push(`${JSON.stringify(target)} -> ${pathname}`);
    }
    assert.ok(routed > 100, `the router served the limited handlers for ${routed} spellings`);
    assert.deepEqual(bypasses, [], `${bypasses.length} of ${targets.size} targets`);
  });
});
