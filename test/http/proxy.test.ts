import assert from 'node:assert/strict';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { connect, createServer as createNetServer } from 'node:net';
import { describe, it } from 'node:test';
import type { Decision } from '../../src/core/decision.js';
import type { ProxyBackend } from '../../src/http/proxy/proxy-backend.js';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { until } from '../helpers/until.js';
import {
  metricValue,
  openUpgrade,
  ProxyFixtures,
  rawExchange,
  send,
  startTestProxy,
  startUpstream,
  type Upstream,
} from './proxy-harness.js';

const fixtures = new ProxyFixtures();
const setup = (rulesBody: string, upstream?: Upstream) => fixtures.start(rulesBody, upstream);

const LOCAL = 'backend:\n  kind: local\n';

describe('spillway proxy: limiting', () => {
  it('forwards allowed requests with exact RateLimit fields and answers 429 past the limit', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: api
    limit: 2
    windowSec: 60
`);
    const first = await send(`${proxy.base}/v1/thing`);
    assert.equal(first.status, 200);
    assert.equal(first.body, 'ok');
    assert.equal(first.headers['ratelimit-policy'], '"api";q=2;w=60');
    assert.equal(first.headers.ratelimit, '"api";r=1;t=30');
    assert.equal(first.headers['retry-after'], undefined);
    const second = await send(`${proxy.base}/v1/thing`);
    assert.equal(second.headers.ratelimit, '"api";r=0;t=60');
    const limited = await send(`${proxy.base}/v1/thing`);
    assert.equal(limited.status, 429);
    assert.equal(limited.headers['retry-after'], '30');
    assert.equal(limited.headers['ratelimit-policy'], '"api";q=2;w=60');
    assert.equal(limited.headers.ratelimit, '"api";r=0;t=60');
    assert.equal(limited.headers['content-type'], 'application/json; charset=utf-8');
    assert.equal(limited.headers['cache-control'], 'no-store');
    assert.equal(limited.headers['content-length'], String(Buffer.byteLength(limited.body)));
    // Byte for byte what the Express and Fastify middleware send (test/http/rate-limit-suite.ts).
    assert.equal(
      limited.body,
      '{"error":"rate_limited","message":"rate limit exceeded: api","policies":["api"],"retryAfterSeconds":30}\n',
    );
    assert.equal(upstream.seen.length, 2, 'the rejected request never reached the upstream');
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'limited' }),
      1,
    );
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'forwarded' }),
      2,
    );
  });

  it('long header values cannot add up to a key the limiter refuses: it would admit the request', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: caller
    key: "caller:{header:x-org}:{header:x-app}:{header:x-user}:{header:x-device}"
    limit: 2
    windowSec: 60
`);
    // 128 characters each: every value is kept as sent, the key is 4 x 128 + 20 characters long.
    const long = (name: string) => `${name}-${'v'.repeat(128 - name.length - 1)}`;
    const headers = {
      'x-org': long('org'),
      'x-app': long('app'),
      'x-user': long('user'),
      'x-device': long('dev'),
    };
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) statuses.push((await send(`${proxy.base}/x`, { headers })).status);
    assert.deepEqual(statuses, [200, 200, 429]);
    // Another caller is another key.
    const other = await send(`${proxy.base}/x`, { headers: { ...headers, 'x-user': long('usr') } });
    assert.equal(other.status, 200);
    assert.equal(await metricValue(proxy.registry, 'spillway_proxy_decisions_total', { result: 'error' }), 0);
    assert.equal(upstream.seen.length, 3);
  });

  it('a key that reads a header named __proto__ renders it missing, not a server error', async () => {
    const { proxy } = await setup(`${LOCAL}buckets:
  - name: odd
    key: "odd:{header:__proto__}:{headerHash:__proto__}"
    limit: 1
    windowSec: 60
`);
    assert.equal((await send(`${proxy.base}/x`)).status, 200);
    assert.equal((await send(`${proxy.base}/x`)).status, 429);
  });

  it('decides every matching bucket: all must allow, each is charged, the rejecting one is named', async () => {
    const { proxy } = await setup(`${LOCAL}buckets:
  - name: per-caller
    key: "caller={header:x-api-key}"
    limit: 2
    windowSec: 10
    match: { prefix: /v1 }
  - name: payments
    limit: 3
    windowSec: 10
    match: { path: /v1/payments/:id, methods: [POST] }
  - name: other
    limit: 1
    windowSec: 10
    match: { prefix: /v2 }
`);
    const post = (key: string) =>
      send(`${proxy.base}/v1/payments/42`, { method: 'POST', headers: { 'x-api-key': key } });
    const a1 = await post('a');
    assert.equal(a1.status, 200);
    assert.equal(a1.headers['ratelimit-policy'], '"per-caller";q=2;w=10, "payments";q=3;w=10');
    assert.equal(a1.headers.ratelimit, '"per-caller";r=1;t=5, "payments";r=2;t=4');
    assert.equal((await post('a')).status, 200);
    const a3 = await post('a');
    assert.equal(a3.status, 429, 'caller a is out');
    assert.deepEqual(JSON.parse(a3.body).policies, ['per-caller']);
    // The rejected request still spent one unit of "payments" (all matching buckets are charged).
    const b1 = await post('b');
    assert.equal(b1.status, 429, 'payments is out: 3 units spent by a1, a2 and the rejected a3');
    assert.deepEqual(JSON.parse(b1.body).policies, ['payments']);
    // GET does not match "payments"; another caller key has its own per-caller bucket.
    const get = await send(`${proxy.base}/v1/payments/42`, { headers: { 'x-api-key': 'c' } });
    assert.equal(get.status, 200);
    assert.equal(get.headers['ratelimit-policy'], '"per-caller";q=2;w=10');
    // Path normalization: a differently spelled path is the same route.
    const spelled = await send(`${proxy.base}//v1/./x/../%70ayments/42/`, {
      method: 'POST',
      headers: { 'x-api-key': 'd' },
    });
    assert.equal(spelled.status, 429);
    assert.deepEqual(JSON.parse(spelled.body).policies, ['payments']);
    const none = await send(`${proxy.base}/elsewhere`);
    assert.equal(none.status, 200);
    assert.equal(none.headers['ratelimit-policy'], undefined, 'no bucket matched, no fields');
  });

  it('matches every spelling an upstream routes to the same handler: case, "\\", ";params", HEAD for GET', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: admin
    limit: 1
    windowSec: 60
    match: { path: /admin/* }
  - name: reads
    key: "reads:{method}:{param:id}"
    limit: 1
    windowSec: 60
    match: { path: /items/:id, methods: [GET] }
`);
    assert.equal((await send(`${proxy.base}/admin/x`)).status, 200);
    // Express routes these to /admin/*, the WHATWG parser reads "\" as "/", Tomcat and Spring
    // cut ";params" (also from "..;"): each must spend the same bucket.
    for (const path of [
      '/Admin/x',
      '/ADMIN/x',
      '/admin\\x',
      '/admin;/x',
      '/admin;jsessionid=1/x',
      '/x/..;/admin/x',
    ]) {
      const response = await send(proxy.base, { path });
      assert.equal(response.status, 429, path);
      assert.deepEqual(JSON.parse(response.body).policies, ['admin'], path);
    }
    // HEAD runs the GET handler, and {method} renders it as GET: one budget for both.
    const get = await send(`${proxy.base}/items/A1`);
    assert.equal(get.status, 200);
    const head = await send(`${proxy.base}/ITEMS/A1;v=2`, { method: 'HEAD' });
    assert.equal(head.status, 429);
    assert.equal(head.headers['ratelimit-policy'], '"reads";q=1;w=60');
    // A parameter keeps its case (an id is the upstream's business), so this is another key.
    assert.equal((await send(`${proxy.base}/items/a1`)).status, 200);
    assert.equal((await send(`${proxy.base}/items/a1`, { method: 'POST' })).status, 200, 'POST is not GET');
    assert.deepEqual(
      upstream.seen.map((req) => `${req.method} ${req.url}`),
      ['GET /admin/x', 'GET /items/A1', 'GET /items/a1', 'POST /items/a1'],
    );
  });

  it('also matches the spellings an upstream keeps ";" and "\\" in: a rewrite never removes a segment unmatched', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: files
    limit: 1
    windowSec: 60
    match: { prefix: /files }
  - name: static
    limit: 1
    windowSec: 60
    match: { path: /static/* }
  - name: payments
    limit: 1
    windowSec: 60
    match: { path: /v1/payments/:id }
`);
    for (const path of ['/files/b', '/static/a', '/v1/payments/42']) {
      assert.equal((await send(proxy.base, { path })).status, 200, path);
    }
    // Read with ";params" cut or "\" as "/", each of these loses the segment its bucket matches
    // on; Express, Fastify, Go and nginx keep that segment and run the limited handler. The
    // files spelling with both reaches /files/x on a WHATWG-parsing upstream ("\" is "/", ";" is not).
    const spellings: [string, string][] = [
      ['/files/..;/q', 'files'],
      ['/Files/..;/q', 'files'],
      ['/files/\\..\\q', 'files'],
      ['/files/;/../r', 'files'],
      ['/files\\x/..;/..', 'files'],
      ['/static/..;/c', 'static'],
      ['/static/\\..\\c', 'static'],
      ['/v1/payments/;x', 'payments'],
      ['/v1/payments/4\\2', 'payments'],
      ['/v1/payments/..;', 'payments'],
    ];
    for (const [path, bucket] of spellings) {
      const response = await send(proxy.base, { path });
      assert.equal(response.status, 429, path);
      assert.deepEqual(JSON.parse(response.body).policies, [bucket], path);
    }
    assert.deepEqual(
      upstream.seen.map((req) => req.url),
      ['/files/b', '/static/a', '/v1/payments/42'],
    );
  });

  it('charges a bucket once when several readings of the path match it', async () => {
    const { proxy } = await setup(`${LOCAL}buckets:
  - name: files
    limit: 3
    windowSec: 60
    match: { prefix: /files }
`);
    // Read as /files/x (";" cut) and as /files/files/x (";" a character): both match.
    const first = await send(proxy.base, { path: '/files/;/../files/x' });
    assert.equal(first.status, 200);
    assert.equal(first.headers.ratelimit, '"files";r=2;t=20');
  });

  it('also matches dot segments kept as segments (Express, Fastify) and "//" read as the WHATWG parser reads it', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: admin
    limit: 1
    windowSec: 60
    match: { prefix: /admin }
  - name: refunds
    limit: 1
    windowSec: 60
    match: { path: /v1/payments/:id/refunds, methods: [POST] }
  - name: payments
    limit: 1
    windowSec: 60
    match: { path: /v1/payments/:id, methods: [GET] }
`);
    assert.equal((await send(proxy.base, { path: '/admin/users' })).status, 200);
    assert.equal((await send(proxy.base, { path: '/v1/payments/1/refunds', method: 'POST' })).status, 200);
    assert.equal((await send(proxy.base, { path: '/v1/payments/1' })).status, 200);
    // Express 5 and Fastify 5 route ".." as a segment: these ran the admin handler and the refunds
    // handler with id "..". A fetch-API server reads "//evil" and "/\\evil" as a host and counts
    // the empty segment before "..": these are /v1/payments/1 to it.
    const spellings: [string, string, string][] = [
      ['GET', '/admin/../users', 'admin'],
      ['GET', '/admin/%2e%2e/users', 'admin'],
      ['POST', '/v1/payments/../refunds', 'refunds'],
      ['POST', '/v1/payments/%2E%2E/refunds', 'refunds'],
      ['GET', '//evil/v1/payments/1', 'payments'],
      ['GET', '/\\evil/v1/payments/1', 'payments'],
      ['GET', '/v1//../payments/1', 'payments'],
      ['GET', '/v1//%2e%2e/payments/1', 'payments'],
    ];
    for (const [method, path, bucket] of spellings) {
      const response = await send(proxy.base, { path, method });
      assert.equal(response.status, 429, path);
      assert.deepEqual(JSON.parse(response.body).policies, [bucket], path);
    }
    assert.equal(upstream.seen.length, 3);
  });

  it('charges a bucket once when the kept-dots and WHATWG readings match it too', async () => {
    const { proxy } = await setup(`${LOCAL}buckets:
  - name: payments
    limit: 3
    windowSec: 60
    match: { prefix: /v1/payments }
`);
    // Read as /v1/payments/1 (dots resolved, and by the WHATWG parser) and /v1/payments/x/../1.
    const first = await send(proxy.base, { path: '/v1/payments/x//../1' });
    assert.equal(first.status, 200);
    assert.equal(first.headers.ratelimit, '"payments";r=2;t=20');
  });

  it('routing options make matching case-sensitive, HEAD its own method and ";" and "\\" characters', async () => {
    const { proxy } = await setup(`routing:
  caseSensitive: true
  headMatchesGet: false
  backslashAsSlash: false
  stripPathParameters: false
${LOCAL}buckets:
  - name: admin
    limit: 1
    windowSec: 60
    match: { prefix: /admin, methods: [GET] }
`);
    assert.equal((await send(`${proxy.base}/admin/x`)).status, 200);
    assert.equal((await send(`${proxy.base}/admin/x`)).status, 429);
    assert.equal((await send(`${proxy.base}/Admin/x`)).status, 200);
    assert.equal((await send(`${proxy.base}/admin/x`, { method: 'HEAD' })).status, 200);
    assert.equal((await send(proxy.base, { path: '/admin;/x' })).status, 200);
    assert.equal((await send(proxy.base, { path: '/admin\\x' })).status, 200);
    assert.equal((await send(proxy.base, { path: '/admin/y\\..\\x' })).status, 429);
  });

  it('refuses a request that sends a key header on several lines with 400, forwarding and charging nothing', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: per-caller
    key: "caller={header:x-api-key}"
    limit: 2
    windowSec: 60
    match: { prefix: /v1 }
  - name: per-token
    key: "token={headerHash:authorization}"
    limit: 5
    windowSec: 60
    match: { prefix: /v2 }
`);
    const one = { 'x-api-key': 'A' };
    assert.equal((await send(`${proxy.base}/v1/x`, { headers: one })).status, 200);
    const repeated: Record<string, string[]>[] = [
      { 'x-api-key': ['A', 'A'] },
      { 'x-api-key': ['B', 'A'] },
      { 'X-Api-Key': ['A', ''] },
    ];
    for (const headers of repeated) {
      const response = await send(`${proxy.base}/v1/x`, { method: 'POST', headers, body: 'payload' });
      assert.equal(response.status, 400, JSON.stringify(headers));
      assert.equal(response.headers['content-type'], 'application/json; charset=utf-8');
      assert.deepEqual(JSON.parse(response.body), {
        error: 'repeated_key_header',
        message:
          'the x-api-key header is part of a rate limit key and must be sent once, as one value; it came on several lines or as a comma-separated list',
        header: 'x-api-key',
      });
      assert.equal(response.headers['ratelimit-policy'], undefined);
    }
    // Node keeps only the first Authorization line in req.headers; rawHeaders still shows both.
    const token = await send(`${proxy.base}/v2/x`, { headers: { authorization: ['Bearer a', 'Bearer b'] } });
    assert.equal(token.status, 400);
    assert.equal(JSON.parse(token.body).header, 'authorization');
    // Repeating a header no matching bucket's key reads is fine.
    const other = await send(`${proxy.base}/v1/x`, { headers: { ...one, 'x-other': ['1', '2'] } });
    assert.equal(other.status, 200);
    assert.equal(other.headers.ratelimit, '"per-caller";r=0;t=60', 'the refused requests spent nothing');
    assert.equal((await send(`${proxy.base}/v2/x`, { headers: { 'x-api-key': ['A', 'A'] } })).status, 200);
    assert.equal((await send(`${proxy.base}/v1/x`, { headers: one })).status, 429);
    assert.equal(upstream.seen.length, 3, 'no refused request reached the upstream');
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'bad_request' }),
      4,
    );
  });

  it('refuses a key header sent as a comma-separated list on one line: rotating its members dodges no limit', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: per-caller
    key: "caller={headerHash:x-api-key}"
    limit: 2
    windowSec: 60
    match: { prefix: /v1 }
`);
    for (let i = 0; i < 5; i++) {
      const response = await send(`${proxy.base}/v1/x`, { headers: { 'x-api-key': `alice, n${i}` } });
      assert.equal(response.status, 400);
      const body = JSON.parse(response.body) as { error: string; header: string };
      assert.equal(body.error, 'repeated_key_header');
      assert.equal(body.header, 'x-api-key');
    }
    assert.equal(upstream.seen.length, 0, 'no list-valued key reached the upstream');
    assert.equal((await send(`${proxy.base}/v1/x`, { headers: { 'x-api-key': 'alice' } })).status, 200);
    assert.equal((await send(`${proxy.base}/v1/x`, { headers: { 'x-api-key': 'alice' } })).status, 200);
    assert.equal((await send(`${proxy.base}/v1/x`, { headers: { 'x-api-key': 'alice' } })).status, 429);
  });

  it('a shadow bucket keyed on a header refuses nothing when the header is repeated', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: shadow-token
    mode: shadow
    key: "token={headerHash:authorization}"
    limit: 5
    windowSec: 60
`);
    const response = await send(`${proxy.base}/x`, { headers: { authorization: ['Bearer a', 'Bearer b'] } });
    assert.equal(response.status, 200, 'shadow buckets never answer a client');
    assert.equal(response.headers['ratelimit-policy'], undefined);
    assert.equal(upstream.seen.length, 1);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'bad_request' }),
      0,
    );
  });

  it('shadow buckets add nothing visible but count would-drops', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets:
  - name: watch
    limit: 1
    windowSec: 60
    mode: shadow
`);
    for (let i = 0; i < 4; i++) {
      const response = await send(`${proxy.base}/`);
      assert.equal(response.status, 200);
      assert.equal(response.headers['ratelimit-policy'], undefined);
      assert.equal(response.headers.ratelimit, undefined);
    }
    assert.equal(upstream.seen.length, 4);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_decisions_total', {
        bucket: 'watch',
        result: 'would_drop',
      }),
      3,
    );
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_decisions_total', {
        bucket: 'watch',
        result: 'allowed',
      }),
      1,
    );
  });

  it('never loosens an upstream RateLimit field: the stricter member wins, other members are kept', async () => {
    const upstream = await startUpstream((req, res) => {
      res.setHeader('RateLimit-Policy', '"api";q=10;w=60, "daily";q=1000;w=86400');
      res.setHeader(
        'RateLimit',
        req.url === '/strict' ? '"api";r=0;t=50, "daily";r=7;t=3600' : '"api";r=9;t=50',
      );
      res.end('ok');
    });
    const { proxy } = await setup(
      `${LOCAL}buckets:\n  - name: api\n    limit: 5\n    windowSec: 60\n`,
      upstream,
    );
    const loose = await send(`${proxy.base}/loose`);
    assert.equal(loose.headers['ratelimit-policy'], '"api";q=5;w=60, "daily";q=1000;w=86400');
    assert.equal(loose.headers.ratelimit, '"api";r=4;t=12');
    const strict = await send(`${proxy.base}/strict`);
    assert.equal(strict.headers['ratelimit-policy'], '"api";q=10;w=60, "daily";q=1000;w=86400');
    assert.equal(strict.headers.ratelimit, '"api";r=0;t=50, "daily";r=7;t=3600');
  });

  it('a new rules set changes behaviour for the next request', async () => {
    const { upstream, proxy } = await setup(
      `${LOCAL}buckets:\n  - name: api\n    limit: 1\n    windowSec: 60\n`,
    );
    assert.equal((await send(`${proxy.base}/`)).status, 200);
    assert.equal((await send(`${proxy.base}/`)).status, 429);
    proxy.proxy.setRules(
      parseProxyRules(
        `version: 1\nupstream:\n  url: ${upstream.url}\n${LOCAL}buckets:\n  - name: api\n    limit: 100\n    windowSec: 60\n`,
      ),
    );
    const after = await send(`${proxy.base}/`);
    assert.equal(after.status, 200);
    assert.equal(after.headers['ratelimit-policy'], '"api";q=100;w=60');
  });

  it('a client behind a trusted balancer keeps its bucket however long it pads X-Forwarded-For', async () => {
    const { proxy } = await setup(`clientAddress:
  trustedProxies: [loopback]
${LOCAL}buckets:
  - name: per-client
    key: "c:{client}"
    limit: 2
    windowSec: 60
`);
    // This test is the balancer: it appends the address it saw to whatever the client sent.
    const from = async (client: string, sent = '') =>
      (await send(`${proxy.base}/`, { headers: { 'X-Forwarded-For': sent ? `${sent}, ${client}` : client } }))
        .status;
    const padding = Array.from({ length: 40 }, (_, i) => `10.9.9.${i}`).join(', ');
    assert.deepEqual([await from('203.0.113.7'), await from('203.0.113.7')], [200, 200]);
    assert.equal(await from('203.0.113.7', padding), 429, 'padding is no fresh bucket');
    assert.deepEqual(
      [await from('203.0.113.8', padding), await from('203.0.113.8', padding)],
      [200, 200],
      "another padded client has its own bucket, not the balancer's",
    );
    assert.equal(await from('203.0.113.8'), 429);
  });
});

describe('spillway proxy: forwarding', () => {
  it('strips hop-by-hop fields both ways and sets X-Forwarded-*', async () => {
    const upstream = await startUpstream((_req, res) => {
      res.setHeader('Connection', 'x-upstream-hop');
      res.setHeader('X-Upstream-Hop', 'secret');
      res.setHeader('Keep-Alive', 'timeout=99');
      res.setHeader('Proxy-Authentication-Info', 'nextnonce="abc"');
      res.setHeader('Proxy-Status', 'upstream-cache; hit');
      res.setHeader('X-Kept', 'yes');
      res.end('ok');
    });
    const { proxy } = await setup(`${LOCAL}buckets: []\n`, upstream);
    const response = await send(`${proxy.base}/path?q=1`, {
      headers: {
        Connection: 'x-client-hop',
        'X-Client-Hop': 'secret',
        TE: 'trailers',
        'Proxy-Authorization': 'Basic abc',
        'X-Forwarded-For': '6.6.6.6',
        'X-End-To-End': 'kept',
      },
    });
    assert.equal(response.status, 200);
    assert.equal(response.headers['x-upstream-hop'], undefined);
    assert.equal(response.headers['x-kept'], 'yes');
    assert.notEqual(response.headers['keep-alive'], 'timeout=99');
    assert.equal(response.headers['proxy-authentication-info'], undefined);
    assert.equal(
      response.headers['proxy-status'],
      'upstream-cache; hit',
      'an end-to-end Proxy-* field passes',
    );
    const seen = upstream.seen[0]!;
    assert.equal(seen.url, '/path?q=1');
    assert.equal(seen.headers['x-client-hop'], undefined);
    assert.equal(seen.headers.te, undefined);
    assert.equal(seen.headers['proxy-authorization'], undefined);
    assert.equal(seen.headers['x-end-to-end'], 'kept');
    assert.equal(seen.headers['x-forwarded-for'], '127.0.0.1', 'an untrusted peer cannot extend the chain');
    assert.equal(seen.headers['x-forwarded-proto'], 'http');
    assert.equal(seen.headers['x-forwarded-host'], proxy.proxy.address);
  });

  it("replaces an untrusted client's Forwarded and drops its X-Real-IP and similar fields", async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets: []\n`);
    const planted = {
      Forwarded: 'for=6.6.6.6;proto=https;host=evil.example',
      'X-Real-IP': '6.6.6.6',
      'True-Client-IP': '6.6.6.6',
      'X-Client-IP': '6.6.6.6',
      'CF-Connecting-IP': '6.6.6.6',
      'Fastly-Client-IP': '6.6.6.6',
      'X-Cluster-Client-IP': '6.6.6.6',
      'X-Forwarded-Port': '443',
      'X-Forwarded-Ssl': 'on',
      'X-Forwarded-Prefix': '/admin',
      'X-Forwarded-For': '6.6.6.6',
    };
    assert.equal((await send(`${proxy.base}/echo`, { headers: planted })).status, 200);
    const seen = upstream.seen[0]!.headers;
    assert.equal(seen.forwarded, `for=127.0.0.1;proto=http;host="${proxy.proxy.address}"`);
    for (const name of Object.keys(planted)) {
      if (name === 'Forwarded' || name === 'X-Forwarded-For') continue;
      assert.equal(seen[name.toLowerCase()], undefined, name);
    }
    assert.equal(seen['x-forwarded-for'], '127.0.0.1');

    // Without a Forwarded field none is added.
    assert.equal((await send(`${proxy.base}/echo`)).status, 200);
    assert.equal(upstream.seen[1]!.headers.forwarded, undefined);
  });

  it("extends a trusted proxy's Forwarded and passes its X-Real-IP and similar fields", async () => {
    const { upstream, proxy } = await setup(
      `clientAddress:\n  trustedProxies: [loopback]\n${LOCAL}buckets: []\n`,
    );
    const fromBalancer = {
      Forwarded: 'for=203.0.113.7;proto=https;host=shop.example, for="[2001:db8::5]"',
      'X-Real-IP': '203.0.113.7',
      'CF-Connecting-IP': '203.0.113.7',
      'X-Forwarded-Port': '443',
      'X-Forwarded-For': '203.0.113.7',
    };
    assert.equal((await send(`${proxy.base}/echo`, { headers: fromBalancer })).status, 200);
    const seen = upstream.seen[0]!.headers;
    assert.equal(
      seen.forwarded,
      `${fromBalancer.Forwarded}, for=127.0.0.1;proto=http;host="${proxy.proxy.address}"`,
    );
    assert.equal(seen['x-real-ip'], '203.0.113.7');
    assert.equal(seen['cf-connecting-ip'], '203.0.113.7');
    assert.equal(seen['x-forwarded-port'], '443');
    assert.equal(seen['x-forwarded-for'], '203.0.113.7, 127.0.0.1');
  });

  it('streams 50 MB both ways without buffering: echoed bytes arrive before the upload ends', async () => {
    const upstream = await startUpstream((req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      req.pipe(res);
    });
    const { proxy } = await setup(`${LOCAL}buckets: []\n`, upstream);
    const totalBytes = 50 * 1024 * 1024;
    const chunk = Buffer.alloc(256 * 1024, 7);
    let received = 0;
    let firstByteAtSent = -1;
    let sent = 0;
    const memory = () => process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
    const heapBefore = memory();
    let peakHeap = heapBefore;
    const done = new Promise<void>((resolve, reject) => {
      const req = request(`${proxy.base}/echo`, { method: 'POST', agent: false }, (res) => {
        res.on('data', (data: Buffer) => {
          if (received === 0) firstByteAtSent = sent;
          received += data.length;
          peakHeap = Math.max(peakHeap, memory());
        });
        res.on('end', () => resolve());
        res.on('error', reject);
      });
      req.on('error', reject);
      const write = () => {
        while (sent < totalBytes) {
          sent += chunk.length;
          if (!req.write(chunk)) {
            req.once('drain', write);
            return;
          }
        }
        req.end();
      };
      write();
    });
    await done;
    assert.equal(received, totalBytes);
    assert.ok(
      firstByteAtSent >= 0 && firstByteAtSent < totalBytes,
      `first echoed byte after ${firstByteAtSent} bytes sent`,
    );
    // Diagnostic only: GC timing makes heap figures too noisy to assert on.
    const growthMb = (peakHeap - heapBefore) / 1024 / 1024;
    process.stdout.write(
      `# 50 MB echo: first byte after ${(firstByteAtSent / 1048576).toFixed(1)} MB sent; peak heap+buffers growth ${growthMb.toFixed(1)} MB\n`,
    );
  });

  it('answers 502 with a clear body when the upstream refuses connections', async () => {
    const closed = createNetServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const proxy = await startTestProxy(`http://127.0.0.1:${port}`, `${LOCAL}buckets: []\n`);
    fixtures.track(proxy.close);
    const response = await send(`${proxy.base}/`, { method: 'POST', body: 'payload' });
    assert.equal(response.status, 502);
    const body = JSON.parse(response.body) as { error: string; message: string };
    assert.equal(body.error, 'upstream_error');
    assert.match(body.message, /refused the connection \(ECONNREFUSED\)/);
  });

  it('answers 504 when the upstream sends no headers within headersTimeoutMs', async () => {
    const upstream = await startUpstream(() => {
      // never answers
    });
    const proxy = await startTestProxy(`${upstream.url}\n  headersTimeoutMs: 300`, `${LOCAL}buckets: []\n`);
    fixtures.track(proxy.close, upstream.close);
    const response = await send(`${proxy.base}/slow`);
    assert.equal(response.status, 504);
    assert.deepEqual(JSON.parse(response.body), {
      error: 'upstream_timeout',
      message: 'upstream sent no response headers within 300 ms',
    });
  });

  it('answers CONNECT with 405, the methods it forwards in Allow, and closes the connection', async () => {
    const { upstream, proxy } = await setup(`${LOCAL}buckets: []\n`);
    const response = await rawExchange(
      proxy.proxy.port,
      'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n',
    );
    const [head, body] = response.split('\r\n\r\n');
    const lines = head!.split('\r\n');
    assert.equal(lines[0], 'HTTP/1.1 405 Method Not Allowed');
    assert.ok(lines.includes('connection: close'), head);
    assert.ok(lines.includes('allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE'), head);
    assert.deepEqual(JSON.parse(body!), {
      error: 'bad_request',
      message: 'CONNECT is not supported by this reverse proxy',
    });
    assert.equal(upstream.seen.length, 0);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'bad_request' }),
      1,
    );
  });

  it('answers OPTIONS * (asterisk-form) itself with 200 and the methods it forwards, keeping the connection', async () => {
    const { upstream, proxy } = await setup(
      `${LOCAL}buckets:\n  - name: all\n    limit: 1\n    windowSec: 60\n`,
    );
    // Pipelined: the connection carries the next request after it. fetch cannot send `*`.
    const response = await rawExchange(
      proxy.proxy.port,
      'OPTIONS * HTTP/1.1\r\nHost: shop.example\r\n\r\n' +
        'GET /after HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n',
    );
    const [first, second] = response.split(/\r\n\r\n/);
    const lines = first!.split('\r\n');
    assert.equal(lines[0], 'HTTP/1.1 200 OK');
    assert.ok(lines.includes('allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE'), first);
    assert.ok(lines.includes('content-length: 0'), first);
    assert.ok(!lines.includes('connection: close'), first);
    assert.ok(second!.startsWith('HTTP/1.1 200 OK'), `the pipelined request is answered: ${second}`);
    assert.deepEqual(
      upstream.seen.map((req) => `${req.method} ${req.url}`),
      ['GET /after'],
      'OPTIONS * is not forwarded, and spends nothing of a bucket',
    );
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'answered_locally' }),
      1,
    );
    // Any other method with the asterisk form is still refused.
    const other = await rawExchange(
      proxy.proxy.port,
      'GET * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n',
    );
    assert.match(other, /^HTTP\/1\.1 400 /);
  });

  it('a client that goes away aborts the upstream request', async () => {
    let upstreamClosedEarly = false;
    const upstream = await startUpstream((_req, res) => {
      res.on('close', () => {
        upstreamClosedEarly = !res.writableFinished;
      });
    });
    const { proxy } = await setup(`${LOCAL}buckets: []\n`, upstream);
    const req = request(`${proxy.base}/hang`, { agent: false });
    req.on('error', () => {});
    req.end();
    await until('the upstream has the request', () => upstream.seen.length === 1);
    req.destroy();
    await until('the upstream request is aborted', () => upstreamClosedEarly);
    await until(
      'counted as client_abort',
      async () =>
        (await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'client_abort' })) ===
        1,
    );
  });

  it('a client that goes away with pipelined requests: each counted once, none left in flight', async () => {
    const upstream = await startUpstream((_req, res) => {
      setTimeout(() => res.end('slow'), 300);
    });
    const { proxy } = await setup(`${LOCAL}buckets: []\n`, upstream);
    const outcome = (name: string) =>
      metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
    const socket = connect(proxy.proxy.port, '127.0.0.1');
    socket.on('error', () => {});
    socket.write('GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n');
    await until('the upstream has both', () => upstream.seen.length === 2);
    socket.resetAndDestroy();
    // The second waits behind the first with no socket of its own: it used to stay in flight.
    await until('none in flight', () => proxy.proxy.inFlight === 0);
    await until('both counted as client_abort', async () => (await outcome('client_abort')) === 2);
    assert.equal(await outcome('forwarded'), 0);
  });

  it('pipelined requests with bodies are all answered and counted once', async () => {
    const upstream = await startUpstream((req, res) => {
      req.resume();
      req.on('end', () => setTimeout(() => res.end('ok'), 100));
    });
    const { proxy } = await setup(`${LOCAL}buckets: []\n`, upstream);
    const answers = await rawExchange(
      proxy.proxy.port,
      'POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc' +
        'POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\ndef' +
        'GET /c HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n',
    );
    assert.equal(answers.match(/HTTP\/1\.1 200 /g)?.length, 3, answers);
    await until('none in flight', () => proxy.proxy.inFlight === 0);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'forwarded' }),
      3,
    );
  });

  it('a client that leaves while its decision is pending is never forwarded', async () => {
    // An async backend (a Redis round trip) whose decisions this test hands out.
    const pending: ((decision: Decision) => void)[] = [];
    const backend: ProxyBackend = {
      kind: 'redis',
      globalLimiter: undefined,
      limiterFor: () => ({ kind: 'async', limit: () => new Promise((resolve) => pending.push(resolve)) }),
      start: () => {},
      close: async () => {},
      accepts: () => true,
      keyTables: () => [],
      keepOnly: () => {},
    };
    const allow: Decision = {
      allowed: true,
      limit: 10,
      remaining: 9,
      resetAtMs: Date.now() + 1_000,
      retryAfterMs: 0,
    };
    const upstream = await startUpstream();
    // One pooled connection: a request forwarded before `/after` reaches the upstream before it.
    const proxy = await startTestProxy(
      `${upstream.url}\n  connections: 1`,
      `${LOCAL}buckets:\n  - name: api\n    limit: 10\n    windowSec: 1\n`,
      backend,
    );
    fixtures.track(proxy.close, upstream.close);
    const req = request(`${proxy.base}/gone`, { agent: false });
    req.on('error', () => {});
    req.end();
    await until('the decision is pending', () => pending.length === 1);
    req.destroy();
    await until('the proxy saw the client leave', () => proxy.proxy.inFlight === 0);
    pending[0]!(allow);
    await until(
      'counted as client_abort',
      async () =>
        (await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'client_abort' })) ===
        1,
    );
    const after = send(`${proxy.base}/after`);
    await until('the next decision is pending', () => pending.length === 2);
    pending[1]!(allow);
    assert.equal((await after).status, 200);
    assert.deepEqual(
      upstream.seen.map((r) => r.url),
      ['/after'],
    );
  });

  it('passes an upgrade through after the limiter allows it, and refuses it with 429 when not', async () => {
    const upstream = await startUpstream();
    upstream.server.on('upgrade', (req, socket) => {
      socket.write(
        `HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${req.headers.upgrade}\r\nConnection: Upgrade\r\nX-Echo: on\r\n\r\n`,
      );
      socket.pipe(socket);
    });
    const { proxy } = await setup(
      `${LOCAL}buckets:\n  - name: ws\n    limit: 1\n    windowSec: 60\n`,
      upstream,
    );
    const first = await openUpgrade(`${proxy.base}/socket`);
    assert.equal(first.status, 101);
    assert.equal(first.headers['x-echo'], 'on');
    assert.equal(first.headers.ratelimit, '"ws";r=0;t=60');
    const echoed = new Promise<string>((resolve) =>
      first.socket!.once('data', (data: Buffer) => resolve(data.toString())),
    );
    first.socket!.write('ping');
    assert.equal(await echoed, 'ping');
    first.socket!.destroy();
    const second = await openUpgrade(`${proxy.base}/socket`);
    assert.equal(second.status, 429);
    assert.equal(second.headers['retry-after'], '60');
    assert.equal(second.headers['cache-control'], 'no-store');
    assert.equal(
      second.body,
      '{"error":"rate_limited","message":"rate limit exceeded: ws","policies":["ws"],"retryAfterSeconds":60}\n',
    );
  });

  it('refuses an upgrade that sends a key header on several lines with 400', async () => {
    const upstream = await startUpstream();
    let upgrades = 0;
    upstream.server.on('upgrade', (_req, socket) => {
      upgrades++;
      socket.destroy();
    });
    const { proxy } = await setup(
      `${LOCAL}buckets:\n  - name: ws\n    key: "{header:x-api-key}"\n    limit: 5\n    windowSec: 60\n`,
      upstream,
    );
    const response = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(`${proxy.base}/socket`, {
        agent: false,
        headers: { Connection: 'Upgrade', Upgrade: 'websocket', 'x-api-key': ['A', 'B'] },
      });
      req.on('upgrade', (res, socket) => {
        socket.destroy();
        resolve({ status: res.statusCode ?? 0, body: '' });
      });
      req.on('response', (res) => {
        let body = '';
        res.on('data', (data: Buffer) => {
          body += data.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      req.end();
    });
    assert.equal(response.status, 400);
    assert.equal(JSON.parse(response.body).error, 'repeated_key_header');
    assert.equal(upgrades, 0);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: 'bad_request' }),
      1,
    );
  });
});
