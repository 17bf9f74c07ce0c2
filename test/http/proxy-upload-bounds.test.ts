import assert from 'node:assert/strict';
import { type ClientRequest, type IncomingMessage, request, type ServerResponse } from 'node:http';
import { describe, it } from 'node:test';
import { until } from '../helpers/until.js';
import {
  bodyLength,
  metricValue,
  ProxyFixtures,
  type SimpleResponse,
  type TestProxy,
} from './proxy-harness.js';

// What keeps slow request bodies from holding the upstream pool (issue 36): a small body is read
// whole before its request takes a pooled connection (server.bufferBodyBytes), one client has at
// most server.maxUploadsPerClient bodies in progress, and the minimum rate judges a body from its
// first second (server.bodyMinRateGraceMs). The attack itself, against a real proxy process:
// test/faults/proxy-slow-uploads.test.ts.

const fixtures = new ProxyFixtures();

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

interface Upload {
  req: ClientRequest;
  response: Promise<SimpleResponse>;
}

/** A POST from `localAddress` declaring `contentLength` bytes (chunked when undefined); the test writes them. */
function upload(
  proxy: TestProxy,
  options: { contentLength?: number; localAddress?: string; path?: string },
): Upload {
  const { port } = new URL(proxy.base);
  const req = request({
    host: '127.0.0.1',
    port: Number(port),
    path: options.path ?? '/upload',
    method: 'POST',
    agent: false,
    localAddress: options.localAddress ?? '127.0.0.1',
    headers: options.contentLength === undefined ? {} : { 'content-length': String(options.contentLength) },
  });
  req.on('error', () => {});
  const response = new Promise<SimpleResponse>((resolve, reject) => {
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString(),
        }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
  });
  response.catch(() => {});
  return { req, response };
}

function get(proxy: TestProxy, localAddress = '127.0.0.1'): Promise<SimpleResponse> {
  const { port } = new URL(proxy.base);
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port: Number(port), path: '/get', agent: false, localAddress },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks).toString(),
          }),
        );
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** An upstream that reads each body whole and answers its length and framing; GETs get "ok". */
function recordingUpstream() {
  const uploads: { url: string; headers: IncomingMessage['headers'] }[] = [];
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    if (req.method !== 'POST') {
      res.end('ok');
      return;
    }
    uploads.push({ url: req.url ?? '', headers: req.headers });
    void bodyLength(req).then((length) => res.end(`got ${length}`));
  };
  return { uploads, handler };
}

function rules(server: string, buckets = 'buckets: []\n'): string {
  return `server:\n${server}backend:\n  kind: local\n${buckets}`;
}

describe('spillway proxy: bounds on request bodies', { timeout: 30_000 }, () => {
  it('reads a small body whole before it takes a pooled connection: trickled, it holds none', async () => {
    const { uploads, handler } = recordingUpstream();
    // One pooled connection: a body streamed while its client trickles it would hold it.
    const { proxy } = await fixtures.start(
      rules('  bodyMinRateGraceMs: 20000\n'),
      handler,
      '\n  connections: 1\n  headersTimeoutMs: 3000',
    );
    const slow = upload(proxy, { contentLength: 1000 });
    slow.req.write('x'.repeat(10));
    await until('the proxy has the upload', () => proxy.proxy.inFlight === 1);
    const startedMs = performance.now();
    const other = await get(proxy);
    assert.equal(other.status, 200);
    assert.ok(performance.now() - startedMs < 2_000, 'the GET did not wait for the only connection');
    assert.equal(uploads.length, 0, 'the upstream has not seen the upload yet');
    slow.req.end('y'.repeat(990));
    const answered = await slow.response;
    assert.equal(answered.body, 'got 1000');
    assert.equal(uploads[0]!.headers['content-length'], '1000');
  });

  it('sends a small chunked body with Content-Length; a chunked body past bufferBodyBytes streams, whole', async () => {
    const { uploads, handler } = recordingUpstream();
    const { proxy } = await fixtures.start(rules('  bufferBodyBytes: 4096\n'), handler);
    const small = upload(proxy, {});
    small.req.write('a'.repeat(1000));
    small.req.end('b'.repeat(2000));
    assert.equal((await small.response).body, 'got 3000');
    assert.equal(uploads[0]!.headers['content-length'], '3000');
    assert.equal(uploads[0]!.headers['transfer-encoding'], undefined);

    const large = upload(proxy, {});
    for (let i = 0; i < 64; i++) large.req.write(Buffer.alloc(4096, i));
    large.req.end();
    assert.equal((await large.response).body, `got ${64 * 4096}`);
    assert.equal(uploads[1]!.headers['transfer-encoding'], 'chunked');
  });

  it('a body that stalls while read ahead gets 408 and never reaches the upstream', async () => {
    const { uploads, handler } = recordingUpstream();
    const { proxy } = await fixtures.start(rules('  bodyTimeoutMs: 300\n'), handler);
    const stalled = upload(proxy, { contentLength: 1000 });
    stalled.req.write('0123456789');
    const answered = await stalled.response;
    assert.equal(answered.status, 408);
    assert.equal(answered.headers.connection, 'close');
    assert.deepEqual(JSON.parse(answered.body), {
      error: 'client_timeout',
      message: 'no request body bytes for 300 ms',
    });
    assert.equal(uploads.length, 0);
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    stalled.req.destroy();
  });

  it('judges the pace from the first second: a streamed body trickled at 4 bytes/s is cut within seconds, by default', async () => {
    const { handler } = recordingUpstream();
    // Default bounds: a 60 s pause bound, 500 bytes/s after 1 s of grace (the grace used to be the
    // pause bound: a minute of trickling before the rate was judged).
    const { proxy } = await fixtures.start('backend:\n  kind: local\nbuckets: []\n', handler);
    const startedMs = performance.now();
    const trickled = upload(proxy, { contentLength: 1024 * 1024 });
    let answered = false;
    void trickled.response.then(() => {
      answered = true;
    });
    while (!answered && performance.now() - startedMs < 10_000) {
      trickled.req.write('x');
      await Promise.race([trickled.response, new Promise((resolve) => setTimeout(resolve, 250))]);
    }
    assert.ok(answered, 'still trickling after 10 s');
    const result = await trickled.response;
    const elapsedMs = performance.now() - startedMs;
    assert.equal(result.status, 408);
    assert.match(
      (JSON.parse(result.body) as { message: string }).message,
      /^the request body came slower than 500 bytes\/s: \d+ bytes in \d+ ms$/,
    );
    assert.ok(elapsedMs < 5_000, `cut after ${Math.round(elapsedMs)} ms`);
    trickled.req.destroy();
  });

  it('refuses a client past maxUploadsPerClient 429 before deciding; its GETs, other clients and later uploads pass', async () => {
    const { uploads, handler } = recordingUpstream();
    const { proxy } = await fixtures.start(
      rules(
        '  maxUploadsPerClient: 2\n  bodyMinRateGraceMs: 20000\n',
        'buckets:\n  - name: per-client\n    key: "c:{client}"\n    limit: 100\n    windowSec: 60\n',
      ),
      handler,
    );
    const held = [0, 1].map(() => upload(proxy, { contentLength: 1024 * 1024, localAddress: '127.0.0.2' }));
    for (const { req } of held) req.write('x');
    await until('both uploads reach the upstream', () => uploads.length === 2);

    const refused = upload(proxy, { contentLength: 1024 * 1024, localAddress: '127.0.0.2' });
    refused.req.write('x');
    const answer = await refused.response;
    assert.equal(answer.status, 429);
    assert.equal(answer.headers['retry-after'], '1');
    assert.equal(answer.headers.connection, 'close');
    assert.deepEqual(JSON.parse(answer.body), {
      error: 'too_many_uploads',
      message:
        'this client already has 2 request bodies in progress, the most the proxy takes from one client at a time',
      retryAfterSeconds: 1,
    });
    assert.equal(await outcome(proxy, 'too_many_uploads'), 1);
    assert.equal(uploads.length, 2, 'never forwarded');

    // Its requests without a body pass; the refused upload was not charged: 2 uploads + this GET.
    const own = await get(proxy, '127.0.0.2');
    assert.equal(own.status, 200);
    assert.match(String(own.headers.ratelimit), /^"per-client";r=97;/);
    // Another client uploads as usual.
    const other = upload(proxy, { contentLength: 5, localAddress: '127.0.0.3' });
    other.req.end('hello');
    assert.equal((await other.response).body, 'got 5');

    // One held upload finishes: its slot is free again.
    held[0]!.req.end('y'.repeat(1024 * 1024 - 1));
    assert.equal((await held[0]!.response).body, `got ${1024 * 1024}`);
    const again = upload(proxy, { contentLength: 5, localAddress: '127.0.0.2' });
    again.req.end('again');
    assert.equal((await again.response).status, 200);
    held[1]!.req.destroy();
  });
});
