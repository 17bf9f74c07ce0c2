import assert from 'node:assert/strict';
import { maxHeaderSize, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import type { Duplex } from 'node:stream';
import { describe, it } from 'node:test';
import { clientErrorSuite, SUITE_HEADERS_TIMEOUT_MS } from '../helpers/client-error-suite.js';
import { rawExchange } from '../helpers/raw-http.js';
import { until } from '../helpers/until.js';
import {
  bodyLength,
  metricValue,
  ProxyFixtures,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
} from './proxy-harness.js';

// Requests Node's HTTP server gives up on before the proxy sees them whole (unparsable, headers
// too large, not in within server.headersTimeoutMs / requestTimeoutMs): answered by the proxy's
// `clientError` listener with a JSON body, `Connection: close`, and counted.

const fixtures = new ProxyFixtures();

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

function rules(server = ''): string {
  return `${server}backend:\n  kind: local\nbuckets: []\n`;
}

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** From the first byte written to the proxy closing the connection. */
  elapsedMs: number;
}

/** Writes `text` on a fresh connection, then nothing more; resolves once the proxy closes it. */
function rawRequest(proxy: TestProxy, text: string): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(proxy.base).port), '127.0.0.1');
    const chunks: Buffer[] = [];
    let startedMs = 0;
    socket.on('connect', () => {
      startedMs = performance.now();
      socket.write(text);
    });
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      const received = Buffer.concat(chunks).toString('utf8');
      const split = received.indexOf('\r\n\r\n');
      const [statusLine = '', ...lines] = received.slice(0, split).split('\r\n');
      const headers: Record<string, string> = {};
      for (const line of lines) {
        const colon = line.indexOf(':');
        headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
      }
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1] ?? 0),
        headers,
        body: split < 0 ? '' : received.slice(split + 4),
        elapsedMs: performance.now() - startedMs,
      });
    });
  });
}

/** The shape every answer of the listener has: JSON, its length right, the connection closed. */
function assertJsonAnswer(response: RawResponse, status: number): { error: string; message: string } {
  assert.equal(response.status, status, `status line of ${JSON.stringify(response)}`);
  assert.equal(response.headers['content-type'], 'application/json; charset=utf-8');
  assert.equal(response.headers.connection, 'close');
  assert.equal(Number(response.headers['content-length']), Buffer.byteLength(response.body));
  return JSON.parse(response.body);
}

async function assertServes(proxy: TestProxy): Promise<void> {
  const response = await send(`${proxy.base}/after`);
  assert.equal(response.status, 200);
  assert.equal(response.body, 'ok');
}

describe('spillway proxy: requests Node cannot hand over', { timeout: 30_000 }, () => {
  it('a request line and then nothing gets a JSON 408 within server.headersTimeoutMs, counted client_timeout', async () => {
    const { proxy, upstream } = await fixtures.start(rules('server:\n  headersTimeoutMs: 500\n'));
    const response = await rawRequest(proxy, 'GET /slow HTTP/1.1\r\n');
    assert.deepEqual(assertJsonAnswer(response, 408), {
      error: 'client_timeout',
      message: 'no complete request headers within 500 ms',
    });
    // Node sweeps its timeouts once a second here.
    assert.ok(
      response.elapsedMs >= 450 && response.elapsedMs < 2_500,
      `answered after ${response.elapsedMs} ms`,
    );
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    assert.equal(upstream.seen.length, 0);
    await assertServes(proxy);
  });

  for (const [what, text] of [
    ['a garbage request line', 'THIS IS NOT HTTP\r\n\r\n'],
    ['a header name with a space', 'GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n'],
  ] as const) {
    it(`${what} gets a JSON 400, counted bad_request`, async () => {
      const { proxy, upstream } = await fixtures.start(rules());
      const body = assertJsonAnswer(await rawRequest(proxy, text), 400);
      assert.equal(body.error, 'bad_request');
      assert.match(body.message, /^the request could not be parsed: .+ \(HPE_[A-Z_]+\)$/);
      assert.equal(await outcome(proxy, 'bad_request'), 1);
      assert.equal(upstream.seen.length, 0);
      await assertServes(proxy);
    });
  }

  it('headers over http.maxHeaderSize get a JSON 431, counted bad_request', async () => {
    const { proxy, upstream } = await fixtures.start(rules());
    const big = 'a'.repeat(maxHeaderSize + 1024);
    const response = await rawRequest(proxy, `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${big}\r\n\r\n`);
    assert.deepEqual(assertJsonAnswer(response, 431), {
      error: 'bad_request',
      message: `the request headers are larger than ${maxHeaderSize} bytes`,
    });
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    assert.equal(upstream.seen.length, 0);
    await assertServes(proxy);
  });

  it('serves on after all three at once, each counted once', async () => {
    const { proxy } = await fixtures.start(rules('server:\n  headersTimeoutMs: 300\n'));
    const answers = await Promise.all([
      rawRequest(proxy, 'GET /slow HTTP/1.1\r\nHost: x\r\n'),
      rawRequest(proxy, 'THIS IS NOT HTTP\r\n\r\n'),
      rawRequest(proxy, `GET / HTTP/1.1\r\nX-Big: ${'a'.repeat(maxHeaderSize + 1)}\r\n\r\n`),
      send(`${proxy.base}/during`),
    ]);
    assert.deepEqual(
      answers.map((answer) => answer.status),
      [408, 400, 431, 200],
    );
    await assertServes(proxy);
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    assert.equal(await outcome(proxy, 'bad_request'), 2);
    assert.equal(await outcome(proxy, 'forwarded'), 2);
  });

  // Streamed (server.bufferBodyBytes: 0): the upstream has the request when the body fails. The
  // minimum rate's grace is raised out of the way of Node's bounds, which these tests are about.
  it('a forwarded request whose chunked body is malformed gets a JSON 400, counted bad_request, not client_abort', async () => {
    let upstreamLength: Promise<number> | undefined;
    const { proxy } = await fixtures.start(rules('server:\n  bufferBodyBytes: 0\n'), (req, res) => {
      if (req.url === '/upload') upstreamLength = bodyLength(req);
      else res.end('ok');
    });
    const response = await rawRequest(
      proxy,
      'POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n',
    );
    const body = assertJsonAnswer(response, 400);
    assert.equal(body.error, 'bad_request');
    assert.match(body.message, /\(HPE_INVALID_CHUNK_SIZE\)$/);
    await until('the request was forwarded', () => upstreamLength !== undefined);
    assert.equal(await upstreamLength, -1, 'the upstream sees the upload cut');
    await until('counted as bad_request', async () => (await outcome(proxy, 'bad_request')) === 1);
    assert.equal(await outcome(proxy, 'client_abort'), 0);
    await assertServes(proxy);
  });

  it('a forwarded request whose body misses server.requestTimeoutMs gets a JSON 408, counted client_timeout, not client_abort', async () => {
    let upstreamLength: Promise<number> | undefined;
    const { proxy } = await fixtures.start(
      rules(
        'server:\n  requestTimeoutMs: 500\n  headersTimeoutMs: 400\n  bodyMinRateGraceMs: 10000\n  bufferBodyBytes: 0\n',
      ),
      (req, res) => {
        if (req.url === '/upload') upstreamLength = bodyLength(req);
        else res.end('ok');
      },
    );
    const response = await rawRequest(
      proxy,
      'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789',
    );
    assert.deepEqual(assertJsonAnswer(response, 408), {
      error: 'client_timeout',
      message: 'no complete request within 500 ms',
    });
    assert.ok(upstreamLength !== undefined, 'the request was forwarded');
    assert.equal(await upstreamLength, -1, 'the upstream sees the upload cut');
    await until('counted as client_timeout', async () => (await outcome(proxy, 'client_timeout')) === 1);
    assert.equal(await outcome(proxy, 'client_abort'), 0);
    await assertServes(proxy);
  });

  it('the same failures while a small body is read ahead: the same answers and counts, the upstream never sees the request', async () => {
    const { proxy, upstream } = await fixtures.start(
      rules('server:\n  requestTimeoutMs: 500\n  headersTimeoutMs: 400\n  bodyMinRateGraceMs: 10000\n'),
    );
    const malformed = await rawRequest(
      proxy,
      'POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n',
    );
    assert.match(assertJsonAnswer(malformed, 400).message, /\(HPE_INVALID_CHUNK_SIZE\)$/);
    const late = await rawRequest(
      proxy,
      'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789',
    );
    assert.deepEqual(assertJsonAnswer(late, 408), {
      error: 'client_timeout',
      message: 'no complete request within 500 ms',
    });
    await until('counted', async () => (await outcome(proxy, 'client_timeout')) === 1);
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    assert.equal(await outcome(proxy, 'client_abort'), 0);
    assert.equal(upstream.seen.length, 0);
    await assertServes(proxy);
  });

  it('a request already answered whose leftover body then fails is counted once, answered once', async () => {
    const { proxy } = await fixtures.start(rules('server:\n  requestTimeoutMs: 500\n'));
    // A target the proxy answers 400 before reading the body; the connection stays open for it.
    const chunked = rawRequest(
      proxy,
      'POST ftp://x/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n',
    );
    const stalled = rawRequest(proxy, 'POST ftp://x/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123');
    for (const response of await Promise.all([chunked, stalled])) {
      assert.equal(response.status, 400);
      assert.equal((response.body.match(/HTTP\/1\.1 /g) ?? []).length, 0, `one response: ${response.body}`);
    }
    assert.equal(await outcome(proxy, 'bad_request'), 2);
    assert.equal(await outcome(proxy, 'client_timeout'), 0);
  });

  it('pipelined behind an unanswered request, a failing one is counted as itself and answered nothing ahead of it', async () => {
    const { proxy } = await fixtures.start(
      rules('server:\n  headersTimeoutMs: 500\n  requestTimeoutMs: 5000\n'),
      (_req, res) => {
        setTimeout(() => res.end('slow'), 1500);
      },
    );
    // Garbage behind a valid request: the garbage is the bad request; the valid one loses its connection.
    const garbage = await rawRequest(proxy, 'GET /one HTTP/1.1\r\nHost: x\r\n\r\nTHIS IS NOT HTTP\r\n\r\n');
    assert.equal(garbage.status, 0, `nothing written ahead of /one: ${garbage.body}`);
    await until('both counted', async () => (await outcome(proxy, 'client_abort')) === 1);
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    // Headers that never complete behind a valid request: headersTimeoutMs's, not requestTimeoutMs's.
    const late = await rawRequest(proxy, 'GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\n');
    assert.equal(late.status, 0, `nothing written ahead of /one: ${late.body}`);
    assert.ok(late.elapsedMs < 1500 + 1000, `cut by the 500 ms headers bound: ${late.elapsedMs} ms`);
    await until('both counted', async () => (await outcome(proxy, 'client_abort')) === 2);
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    assert.equal(await outcome(proxy, 'bad_request'), 1);
  });
});

clientErrorSuite({
  name: 'proxy',
  async start() {
    const held: ServerResponse[] = [];
    const upstream = await startUpstream((req, res) => {
      if (req.url === '/slow') held.push(res);
      else res.end('ok');
    });
    const proxy = await startTestProxy(
      upstream.url,
      rules(`server:\n  headersTimeoutMs: ${SUITE_HEADERS_TIMEOUT_MS}\n`),
    );
    return {
      port: Number(new URL(proxy.base).port),
      served: 'GET /ok HTTP/1.1',
      // Answered by the proxy itself, nothing forwarded.
      answeredAtOnce: 'OPTIONS * HTTP/1.1',
      answeredLater: 'GET /slow HTTP/1.1',
      release: () => {
        for (const res of held.splice(0)) res.end('slow');
      },
      close: async () => {
        await proxy.close();
        await upstream.close();
      },
    };
  },
  errorMessage(answer, status) {
    assert.equal(answer.status, status, JSON.stringify(answer));
    assert.equal(answer.headers['content-type'], 'application/json; charset=utf-8');
    assert.equal(Number(answer.headers['content-length']), Buffer.byteLength(answer.body));
    const body = JSON.parse(answer.body) as { error: string; message: string };
    assert.equal(body.error, status === 408 ? 'client_timeout' : 'bad_request');
    return body.message;
  },
});

describe('spillway proxy: requests without Host', { timeout: 30_000 }, () => {
  it('an HTTP/1.1 request gets a JSON 400, counted bad_request, never forwarded (RFC 9112 §3.2)', async () => {
    const { proxy, upstream } = await fixtures.start(rules());
    const response = await rawRequest(proxy, 'GET /x HTTP/1.1\r\nConnection: close\r\n\r\n');
    assert.deepEqual(assertJsonAnswer(response, 400), {
      error: 'bad_request',
      message: 'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)',
    });
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    assert.equal(upstream.seen.length, 0);
    await assertServes(proxy);
  });

  it('an HTTP/1.1 upgrade gets the same 400, counted bad_request, never forwarded', async () => {
    const { proxy, upstream } = await fixtures.start(rules());
    const response = await rawRequest(
      proxy,
      'GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n',
    );
    assert.deepEqual(assertJsonAnswer(response, 400), {
      error: 'bad_request',
      message: 'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)',
    });
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    assert.equal(upstream.seen.length, 0);
  });

  it('a body behind a refused head is not read: the connection closes', async () => {
    const { proxy, upstream } = await fixtures.start(rules());
    const response = await rawRequest(
      proxy,
      'POST /x HTTP/1.1\r\nContent-Length: 100000000\r\n\r\nfirst bytes',
    );
    assert.equal(assertJsonAnswer(response, 400).error, 'bad_request');
    assert.equal(upstream.seen.length, 0);
  });

  it('an upgrade pipelined behind an unanswered request: nothing written ahead of that answer, the connection closed', async () => {
    const held: ServerResponse[] = [];
    const { proxy, upstream } = await fixtures.start(rules(), (req, res) => {
      if (req.url === '/slow') held.push(res);
      else res.end('ok');
    });
    fixtures.track(async () => {
      for (const res of held.splice(0)) res.end('slow');
    });
    let upgrades = 0;
    upstream.server.on('upgrade', (_req, socket: Duplex) => {
      upgrades++;
      socket.destroy();
    });
    const { answers } = await rawExchange(
      Number(new URL(proxy.base).port),
      'GET /slow HTTP/1.1\r\nHost: a\r\n\r\nGET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n',
    );
    assert.deepEqual(answers, [], 'nothing written');
    await until('both counted', async () => (await outcome(proxy, 'client_abort')) === 1);
    assert.equal(await outcome(proxy, 'bad_request'), 1);
    assert.equal(upgrades, 0, 'the upgrade never forwarded');
  });

  for (const [what, head, status] of [
    [
      'two Host lines',
      'GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n',
      400,
    ],
    [
      'two Host lines on an upgrade',
      'GET /ws HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n',
      400,
    ],
    ['HTTP/2.0 in the request line', 'GET /x HTTP/2.0\r\nHost: a\r\nConnection: close\r\n\r\n', 505],
    ['no version in the request line (HTTP/0.9)', 'GET /x\r\n\r\n', 505],
  ] as const) {
    it(`${what}: ${status}, counted bad_request, never forwarded`, async () => {
      const { proxy, upstream } = await fixtures.start(rules());
      const response = await rawRequest(proxy, head);
      assert.equal(assertJsonAnswer(response, status).error, 'bad_request');
      assert.equal(await outcome(proxy, 'bad_request'), 1);
      assert.equal(upstream.seen.length, 0);
      await assertServes(proxy);
    });
  }

  for (const preserveHost of [false, true]) {
    it(`an HTTP/1.0 request is forwarded with the upstream's Host (preserveHost: ${preserveHost})`, async () => {
      const { proxy, upstream } = await fixtures.start(
        rules(),
        undefined,
        preserveHost ? '\n  preserveHost: true' : '',
      );
      const response = await rawRequest(proxy, 'GET /old HTTP/1.0\r\n\r\n');
      assert.equal(response.status, 200);
      assert.equal(response.body, 'ok');
      assert.equal(upstream.seen.length, 1);
      // Nothing to preserve: undici names the upstream it connects to.
      assert.equal(upstream.seen[0]!.headers.host, `127.0.0.1:${upstream.port}`);
      assert.equal(upstream.seen[0]!.headers['x-forwarded-host'], undefined);
      assert.equal(await outcome(proxy, 'forwarded'), 1);
    });
  }
});
