import assert from 'node:assert/strict';
import { type IncomingMessage, request } from 'node:http';
import { describe, it } from 'node:test';
import { RequestBody } from '../../src/http/proxy/request-body.js';
import { until } from '../helpers/until.js';
import {
  bodyLength,
  metricValue,
  ProxyFixtures,
  send,
  type TestProxy,
  type UpstreamHandler,
} from './proxy-harness.js';

// How the proxy streams a request body to the upstream: Expect: 100-continue, a client that
// leaves mid-upload, an upstream that fails mid-upload, and one that answers before reading it.

const fixtures = new ProxyFixtures();
const setup = (handler: UpstreamHandler, buckets = 'buckets: []\n') =>
  fixtures.start(`backend:\n  kind: local\n${buckets}`, handler);

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

/** A POST with `Expect: 100-continue` that sends its body only after a 100. */
function expectContinue(
  url: string,
  body: string,
): Promise<{ status: number; gotContinue: boolean; body: string }> {
  return new Promise((resolve, reject) => {
    let gotContinue = false;
    const req = request(url, {
      method: 'POST',
      agent: false,
      headers: { expect: '100-continue', 'content-length': String(body.length) },
    });
    req.on('continue', () => {
      gotContinue = true;
      req.end(body);
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode!, gotContinue, body: Buffer.concat(chunks).toString() }),
      );
    });
    req.on('error', reject);
    req.flushHeaders();
  });
}

describe('spillway proxy: request bodies', () => {
  it('Expect: 100-continue gets its 100 only once allowed; the body then reaches the upstream whole', async () => {
    const lengths: number[] = [];
    const { upstream, proxy } = await setup((req, res) => {
      void bodyLength(req).then((length) => {
        lengths.push(length);
        res.end(`got ${length}`);
      });
    }, 'buckets:\n  - name: uploads\n    limit: 1\n    windowSec: 60\n');
    const body = 'x'.repeat(100_000);
    const allowed = await expectContinue(`${proxy.base}/upload`, body);
    assert.deepEqual(allowed, { status: 200, gotContinue: true, body: 'got 100000' });
    assert.equal(upstream.seen[0]!.headers.expect, undefined);
    const rejected = await expectContinue(`${proxy.base}/upload`, body);
    assert.equal(rejected.status, 429);
    assert.equal(rejected.gotContinue, false, 'a rejected upload is never invited');
    assert.deepEqual(lengths, [100_000]);
  });

  it('a client that leaves mid-upload aborts the upstream request, counted as client_abort', async () => {
    let upstreamLength: Promise<number> | undefined;
    const { proxy } = await setup((req) => {
      upstreamLength = bodyLength(req);
    });
    const req = request(`${proxy.base}/upload`, {
      method: 'POST',
      agent: false,
      headers: { 'content-length': String(1024 * 1024) },
    });
    req.on('error', () => {});
    req.write(Buffer.alloc(64 * 1024, 1));
    await until('the upstream has the request', () => upstreamLength !== undefined);
    req.destroy();
    assert.equal(await upstreamLength, -1, 'the upstream sees the upload cut');
    await until('counted as client_abort', async () => (await outcome(proxy, 'client_abort')) === 1);
  });

  it('answers 502 and closes the connection when the upstream resets mid-upload; the proxy serves on', async () => {
    const { proxy } = await setup((req, res) => {
      if (req.url === '/reset') {
        req.once('data', () => req.socket.destroy());
        return;
      }
      res.end('ok');
    });
    const result = await new Promise<{ status: number; connection: string | undefined; body: string }>(
      (resolve, reject) => {
        const req = request(
          `${proxy.base}/reset`,
          { method: 'POST', agent: false, headers: { 'content-length': String(1024 * 1024) } },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (chunk: Buffer) => chunks.push(chunk));
            res.on('end', () =>
              resolve({
                status: res.statusCode!,
                connection: res.headers.connection,
                body: Buffer.concat(chunks).toString(),
              }),
            );
          },
        );
        req.on('error', reject);
        // Half the declared body: the proxy answers before the upload is complete.
        req.write(Buffer.alloc(512 * 1024, 1));
      },
    );
    assert.equal(result.status, 502);
    assert.equal(result.connection, 'close');
    assert.equal((JSON.parse(result.body) as { error: string }).error, 'upstream_error');
    await until('counted as upstream_error', async () => (await outcome(proxy, 'upstream_error')) === 1);
    assert.equal((await send(`${proxy.base}/next`)).body, 'ok');
  });

  it('answers 502 when the upstream closes after reading the whole body without answering', async () => {
    const { proxy } = await setup((req) => {
      req.resume();
      req.on('end', () => req.socket.destroy());
    });
    // Streamed and read ahead: either way the request is destroyed once read, its client still there.
    for (const body of ['x'.repeat(200_000), 'small']) {
      const response = await send(`${proxy.base}/upload`, { method: 'POST', body });
      assert.equal(response.status, 502, `a ${body.length}-byte body`);
      assert.equal((JSON.parse(response.body) as { error: string }).error, 'upstream_error');
    }
    assert.equal(await outcome(proxy, 'client_abort'), 0);
  });

  it('relays an upstream answer sent before the upload was read (413)', async () => {
    const { proxy } = await setup((_req, res) => {
      res.writeHead(413, { 'content-type': 'text/plain', connection: 'close' });
      res.end('too large');
    });
    const result = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(
        `${proxy.base}/upload`,
        { method: 'POST', agent: false, headers: { 'content-length': String(8 * 1024 * 1024) } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () => {
            resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString() });
            req.destroy();
          });
        },
      );
      req.on('error', reject);
      req.write(Buffer.alloc(64 * 1024, 1));
    });
    assert.deepEqual(result, { status: 413, body: 'too large' });
  });
});

describe('RequestBody: the client and upstream bounds', () => {
  /** A body whose chunks the test hands out, and what it reported when. */
  function controlledBody(
    idleTimeoutMs: number,
    sendTimeoutMs: number,
    pace: { minBytesPerSec?: number; minRateGraceMs?: number } = {},
  ) {
    const pending: ((result: IteratorResult<Buffer>) => void)[] = [];
    const req = {
      iterator: () => ({
        next: () => new Promise<IteratorResult<Buffer>>((resolve) => pending.push(resolve)),
        return: async () => ({ done: true as const, value: undefined }),
        [Symbol.asyncIterator]() {
          return this;
        },
      }),
    } as unknown as IncomingMessage;
    const reports: { kind: string; timeoutMs: number; atMs: number }[] = [];
    const startedMs = performance.now();
    const owner = {
      bodySent: () => reports.push({ kind: 'sent', timeoutMs: 0, atMs: performance.now() - startedMs }),
      bodyIdle: (timeoutMs: number) =>
        reports.push({ kind: 'idle', timeoutMs, atMs: performance.now() - startedMs }),
      bodyStuckUpstream: (timeoutMs: number) =>
        reports.push({ kind: 'stuck', timeoutMs, atMs: performance.now() - startedMs }),
      bodyTooSlow: () => reports.push({ kind: 'slow', timeoutMs: 0, atMs: performance.now() - startedMs }),
    };
    const body = new RequestBody(req, owner, { idleTimeoutMs, sendTimeoutMs, ...pace });
    return { body, pending, reports };
  }

  it('reports an upstream that takes nothing at its own bound, though the client bound is longer', async () => {
    const { body, pending, reports } = controlledBody(2_000, 100);
    const first = body.next();
    // The client takes 150 ms over its chunk (under its bound): the timer has already fired once.
    await new Promise((resolve) => setTimeout(resolve, 150));
    pending.shift()!({ done: false, value: Buffer.from('x') });
    await first;
    // undici does not ask for the next chunk: the upstream's turn.
    await until('reported', () => reports.length === 1);
    assert.equal(reports[0]!.kind, 'stuck');
    assert.equal(reports[0]!.timeoutMs, 100);
    assert.ok(reports[0]!.atMs < 1_000, `reported after ${reports[0]!.atMs} ms`);
    body.stop();
  });

  it('reports an idle client at its own bound after a long upstream wait, though the upstream bound is longer', async () => {
    const { body, pending, reports } = controlledBody(100, 5_000);
    const first = body.next();
    pending.shift()!({ done: false, value: Buffer.from('x') });
    await first;
    // The upstream takes 300 ms (under its bound), then asks for more: the client never sends it.
    await new Promise((resolve) => setTimeout(resolve, 300));
    const askedMs = performance.now();
    void body.next();
    await until('reported', () => reports.length === 1);
    assert.equal(reports[0]!.kind, 'idle');
    const lateMs = performance.now() - askedMs;
    assert.ok(lateMs < 1_000, `idle reported ${lateMs} ms after the client's turn began`);
    body.stop();
  });

  it('stops bounding the upstream once its answer started: the proxy may be holding it back', async () => {
    const { body, pending, reports } = controlledBody(0, 100);
    const first = body.next();
    pending.shift()!({ done: false, value: Buffer.from('x') });
    await first;
    body.responseStarted();
    await new Promise((resolve) => setTimeout(resolve, 400));
    assert.deepEqual(reports, []);
    body.stop();
  });

  it('judges the pace after its own grace, with no pause bound at all', async () => {
    const { body, pending, reports } = controlledBody(0, 0, { minBytesPerSec: 100, minRateGraceMs: 200 });
    const first = body.next();
    pending.shift()!({ done: false, value: Buffer.from('x'.repeat(10)) });
    await first;
    // 200 ms of grace plus 100 ms earned by 10 bytes: due about 300 ms into the client's wait.
    const askedMs = performance.now();
    void body.next();
    await until('reported', () => reports.length === 1);
    assert.equal(reports[0]!.kind, 'slow');
    const waitedMs = performance.now() - askedMs;
    assert.ok(waitedMs >= 250 && waitedMs < 1_500, `reported after ${Math.round(waitedMs)} ms`);
  });

  it('reads ahead: the whole body when it fits; past the bound, what it read is handed out first', async () => {
    const small = controlledBody(1_000, 1_000);
    const whole = small.body.readAhead(8);
    small.pending.shift()!({ done: false, value: Buffer.from('abc') });
    await until('asked again', () => small.pending.length === 1);
    small.pending.shift()!({ done: false, value: Buffer.from('def') });
    await until('asked again', () => small.pending.length === 1);
    small.pending.shift()!({ done: true, value: undefined });
    assert.equal((await whole)?.toString(), 'abcdef');
    assert.deepEqual(small.reports, [], 'no timing left running, nothing reported');

    const large = controlledBody(1_000, 1_000);
    const ahead = large.body.readAhead(4);
    large.pending.shift()!({ done: false, value: Buffer.from('abc') });
    await until('asked again', () => large.pending.length === 1);
    large.pending.shift()!({ done: false, value: Buffer.from('def') });
    assert.equal(await ahead, undefined);
    assert.equal(String((await large.body.next()).value), 'abc');
    assert.equal(String((await large.body.next()).value), 'def');
    const rest = large.body.next();
    large.pending.shift()!({ done: false, value: Buffer.from('ghi') });
    assert.equal(String((await rest).value), 'ghi');
    large.body.stop();
  });
});
