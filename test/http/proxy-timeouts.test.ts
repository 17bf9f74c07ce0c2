import assert from 'node:assert/strict';
import { type ClientRequest, type IncomingMessage, request, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { describe, it } from 'node:test';
import { until } from '../helpers/until.js';
import {
  bodyLength,
  metricValue,
  ProxyFixtures,
  type SimpleResponse,
  send,
  type TestProxy,
} from './proxy-harness.js';

// How long the proxy waits, and for whom: for a pooled upstream connection and the response
// headers (upstream.headersTimeoutMs, time queued included), and for the client's request body
// (server.bodyTimeoutMs, only while the proxy is ready for more of it).

const fixtures = new ProxyFixtures();

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

/** `spillway_proxy_upstream_headers_seconds`: how many waits it holds, and their total. */
async function headersWaits(proxy: TestProxy): Promise<{ count: number; sumSeconds: number }> {
  const metric = await proxy.registry.getSingleMetric('spillway_proxy_upstream_headers_seconds')?.get();
  // A histogram's values carry the name of the series each belongs to (`_bucket`, `_sum`, `_count`).
  const values = (metric?.values ?? []) as { value: number; metricName?: string }[];
  const value = (suffix: string) =>
    values.find((v) => v.metricName === `spillway_proxy_upstream_headers_seconds${suffix}`)?.value ?? 0;
  return { count: value('_count'), sumSeconds: value('_sum') };
}

function rules(server = ''): string {
  return `${server}backend:\n  kind: local\nbuckets: []\n`;
}

/**
 * A proxy with one pooled connection (plus `upstreamOptions`), held by a response that never ends
 * (a stream, a long poll); other paths answer "ok".
 */
async function startHeldPool(upstreamOptions: string) {
  const { upstream, proxy } = await fixtures.start(
    rules(),
    (req, res) => {
      res.writeHead(200);
      if (req.url === '/stream') res.write('x');
      else res.end('ok');
    },
    `\n  connections: 1${upstreamOptions}`,
  );
  const stream = request(`${proxy.base}/stream`, { agent: false });
  stream.on('error', () => {});
  stream.end();
  await until('the stream holds the connection', () => upstream.seen.length === 1);
  return { upstream, proxy, stream };
}

/** A POST declaring `contentLength` bytes; the test writes them. Resolves with the response. */
function upload(
  url: string,
  contentLength: number,
): { req: ClientRequest; response: Promise<SimpleResponse & { cut: boolean }> } {
  const req = request(url, {
    method: 'POST',
    agent: false,
    headers: { 'content-length': String(contentLength) },
  });
  const response = new Promise<SimpleResponse & { cut: boolean }>((resolve, reject) => {
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      const done = (cut: boolean) =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString(),
          cut,
        });
      res.on('end', () => done(false));
      res.on('aborted', () => done(true));
      res.on('error', () => done(true));
    });
    req.on('error', reject);
  });
  return { req, response };
}

/** A client trickling one byte every 100 ms of a 1 MB body: it never pauses long, it never ends. */
function trickle(url: string): { req: ClientRequest; stop(): void } {
  const { req, response } = upload(url, 1024 * 1024);
  response.catch(() => {});
  req.on('error', () => {});
  req.flushHeaders();
  const timer = setInterval(() => req.write('x'), 100);
  return {
    req,
    stop: () => {
      clearInterval(timer);
      req.destroy();
    },
  };
}

/**
 * On a raw keep-alive connection: a POST declaring `declaredBytes`, of which `sentBytes` are
 * written (as fast as the connection takes them), then `after`. Resolves with everything read and
 * whether the proxy closed the connection within `withinMs`. A Node socket that reads the proxy's
 * FIN stops writing and ends its side unless `halfOpen`.
 */
function rawUpload(
  port: number,
  options: { declaredBytes: number; sentBytes: number; after?: string; halfOpen?: boolean; withinMs: number },
): Promise<{ received: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: options.halfOpen ?? false });
    let received = '';
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ received, closed: false });
    }, options.withinMs);
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => {
      received += data;
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ received, closed: true });
    });
    socket.write(`POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: ${options.declaredBytes}\r\n\r\n`);
    const chunk = Buffer.alloc(64 * 1024, 97);
    let sent = 0;
    const pump = () => {
      while (sent < options.sentBytes && socket.writable) {
        const size = Math.min(chunk.length, options.sentBytes - sent);
        sent += size;
        if (!socket.write(chunk.subarray(0, size))) {
          socket.once('drain', pump);
          return;
        }
      }
      if (sent >= options.sentBytes && options.after !== undefined && socket.writable)
        socket.write(options.after);
    };
    pump();
  });
}

/** An upstream that answers 413 at once, reading none of the body. */
const refuseUnread = (_req: IncomingMessage, res: ServerResponse) => {
  res.writeHead(413, { 'content-length': '8' });
  res.end('too big\n');
};

describe('spillway proxy: an upstream that answers before reading the body', { timeout: 30_000 }, () => {
  for (const [what, bytes] of [
    ['1 MiB', 1024 * 1024],
    ['16 MiB', 16 * 1024 * 1024],
  ] as const) {
    it(`answers, then closes the connection instead of stalling on the unread rest (${what})`, async () => {
      const { proxy } = await fixtures.start(rules(), refuseUnread);
      const result = await rawUpload(proxy.proxy.port, {
        declaredBytes: bytes,
        sentBytes: bytes,
        after: 'GET /second HTTP/1.1\r\nHost: x\r\n\r\n',
        withinMs: 5_000,
      });
      assert.match(result.received, /^HTTP\/1\.1 413 /);
      assert.match(result.received, /\r\nconnection: close\r\n/i);
      assert.equal(result.received.split('HTTP/1.1 ').length - 1, 1, 'the pipelined request is not answered');
      assert.equal(result.closed, true, 'the proxy closed the connection');
      await until('the exchange is done', () => proxy.proxy.inFlight === 0);
      assert.equal(await outcome(proxy, 'forwarded'), 1);
    });
  }

  it('drops the rest of the body for at most server.bodyTimeoutMs of silence, then drops the connection', async () => {
    const { proxy } = await fixtures.start(rules('server:\n  bodyTimeoutMs: 300\n'), refuseUnread);
    // Sends part of the body, then nothing for longer than the bound, keeping its side open after
    // the proxy's FIN; what it writes after that is refused (reset) by a connection the proxy dropped.
    const socket = connect({ port: proxy.proxy.port, host: '127.0.0.1', allowHalfOpen: true });
    let received = '';
    let ended = false;
    let closed = false;
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => {
      received += data;
    });
    socket.on('end', () => {
      ended = true;
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      closed = true;
    });
    socket.write(`POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: ${1024 * 1024}\r\n\r\n`);
    socket.write(Buffer.alloc(64 * 1024, 97));
    await until('the response and FIN', () => ended);
    assert.match(received, /^HTTP\/1\.1 413 /);
    const silentFromMs = performance.now();
    await until('the connection is dropped', () => {
      if (!closed && performance.now() - silentFromMs > 400) socket.write(Buffer.alloc(1024, 97));
      return closed;
    });
    socket.destroy();
  });
});

describe('spillway proxy: timeouts', { timeout: 30_000 }, () => {
  it('a request queued behind slow uploads that hold every connection gets a 504 within headersTimeoutMs, and is never sent', async () => {
    const { upstream, proxy } = await fixtures.start(
      rules(),
      (req, res) => {
        if (req.url === '/upload') void bodyLength(req).then((length) => res.end(`got ${length}`));
        else res.end('ok');
      },
      '\n  connections: 2\n  headersTimeoutMs: 500',
    );
    // Upstream connections closed before carrying any request.
    let closedUnused = 0;
    upstream.server.on('connection', (socket: Socket) => {
      socket.on('close', () => {
        if (!upstream.seen.some((req) => req.socket === socket)) closedUnused++;
      });
    });
    const uploads = [trickle(`${proxy.base}/upload`), trickle(`${proxy.base}/upload`)];
    await until('both uploads hold a connection', () => upstream.seen.length === 2);
    const startedMs = performance.now();
    const queued = await send(`${proxy.base}/queued`);
    const waitedMs = performance.now() - startedMs;
    assert.equal(queued.status, 504);
    assert.deepEqual(JSON.parse(queued.body), {
      error: 'upstream_queue_timeout',
      message: 'the request waited 500 ms for one of the 2 upstream connections',
    });
    assert.ok(waitedMs >= 450 && waitedMs < 5_000, `answered after ${waitedMs} ms`);
    assert.equal(await outcome(proxy, 'upstream_queue_timeout'), 1);
    // The uploads leave, their connections free up: the queued request, already answered, is
    // dropped when it reaches one instead of being sent.
    for (const slow of uploads) slow.stop();
    await until('the uploads are aborted', async () => (await outcome(proxy, 'client_abort')) === 2);
    assert.equal((await send(`${proxy.base}/after`)).body, 'ok');
    assert.deepEqual(
      upstream.seen.map((r) => r.url),
      ['/upload', '/upload', '/after'],
    );
    // It waited in the proxy's queue, not undici's: dropped there, it cost no connection (undici
    // would abort it on the connection that took it, destroying that connection).
    assert.equal(closedUnused, 0, 'upstream connections closed without carrying a request');
    // Only '/after' got headers from the upstream: neither the queue timeout nor the aborted
    // uploads are upstream waits.
    assert.equal((await headersWaits(proxy)).count, 1);
  });

  it('requests that give up while the pool is held are swept out of its queue, not kept until a connection frees', async () => {
    const { proxy, stream } = await startHeldPool('\n  headersTimeoutMs: 50');
    const given = 600;
    for (let sent = 0; sent < given; sent += 50) {
      const answers = await Promise.all(Array.from({ length: 50 }, () => send(`${proxy.base}/queued`)));
      for (const answer of answers) assert.equal(answer.status, 504);
    }
    assert.equal(await outcome(proxy, 'upstream_queue_timeout'), given);
    const queue = proxy.proxy.upstreamQueue;
    assert.equal(queue.waiting, 0);
    // Every one of them was answered; the queue keeps at most the last few of them.
    assert.ok(queue.held <= 64, `the queue still holds ${queue.held} answered requests`);
    stream.destroy();
    assert.equal((await send(`${proxy.base}/after`)).body, 'ok');
    assert.deepEqual(proxy.proxy.upstreamQueue, { waiting: 0, held: 0 });
  });

  it('refuses 503 upstream_queue_full past upstream.maxQueued waiting requests; those waiting are served', async () => {
    const { upstream, proxy, stream } = await startHeldPool('\n  maxQueued: 2\n  headersTimeoutMs: 10000');
    const queued = [send(`${proxy.base}/a`), send(`${proxy.base}/b`)];
    await until('two requests wait', () => proxy.proxy.upstreamQueue.waiting === 2);
    assert.equal(
      await metricValue(proxy.registry, 'spillway_proxy_upstream_queued_requests', {}),
      2,
      'the queue depth is exported',
    );
    const refused = await send(`${proxy.base}/c`);
    assert.equal(refused.status, 503);
    assert.deepEqual(JSON.parse(refused.body), {
      error: 'upstream_queue_full',
      message: 'all 1 upstream connections are busy and 2 requests wait for one',
    });
    assert.equal(await outcome(proxy, 'upstream_queue_full'), 1);
    stream.destroy();
    for (const answer of await Promise.all(queued)) assert.equal(answer.body, 'ok');
    assert.deepEqual(
      upstream.seen.map((r) => r.url),
      ['/stream', '/a', '/b'],
    );
  });

  it('an upload longer than headersTimeoutMs is not cut: only the waits for a connection and for headers count', async () => {
    const { proxy } = await fixtures.start(
      rules(),
      (req, res) => void bodyLength(req).then((length) => res.end(`got ${length}`)),
      '\n  headersTimeoutMs: 300',
    );
    const { req, response } = upload(`${proxy.base}/upload`, 12 * 1024);
    for (let i = 0; i < 12; i++) {
      req.write(Buffer.alloc(1024, 1));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    req.end();
    const result = await response;
    assert.equal(result.status, 200);
    assert.equal(result.body, `got ${12 * 1024}`);
    // The upstream answered as soon as it had the body: the 1.2 s upload is not its wait.
    const waits = await headersWaits(proxy);
    assert.equal(waits.count, 1);
    assert.ok(waits.sumSeconds < 0.5, `recorded ${waits.sumSeconds} s`);
  });

  it('answers 408 when the request body pauses longer than server.bodyTimeoutMs, and aborts the upstream request', async () => {
    let upstreamLength: Promise<number> | undefined;
    const { proxy } = await fixtures.start(rules('server:\n  bodyTimeoutMs: 300\n'), (req) => {
      upstreamLength = bodyLength(req);
    });
    // Declared past server.bufferBodyBytes: streamed, so the upstream has the request.
    const { req, response } = upload(`${proxy.base}/upload`, 1024 * 1024);
    req.write('0123456789');
    const result = await response;
    assert.equal(result.status, 408);
    assert.equal(result.headers.connection, 'close');
    assert.deepEqual(JSON.parse(result.body), {
      error: 'client_timeout',
      message: 'no request body bytes for 300 ms',
    });
    assert.equal(await upstreamLength, -1, 'the upstream sees the upload cut');
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    req.destroy();
  });

  it('answers 408 to a body trickled a byte at a time, each pause under server.bodyTimeoutMs, once it falls behind the minimum rate', async () => {
    let upstreamLength: Promise<number> | undefined;
    // The default minimum rate (500 bytes/s) with its 1 s grace: each byte earns 2 ms.
    const { proxy } = await fixtures.start(rules('server:\n  bodyTimeoutMs: 1000\n'), (req, res) => {
      upstreamLength = bodyLength(req);
      void upstreamLength.then((length) => res.end(`got ${length}`));
    });
    const totalBytes = 40;
    // Declared past server.bufferBodyBytes: streamed, so the upstream has the request.
    const { req, response } = upload(`${proxy.base}/upload`, 1024 * 1024);
    req.on('error', () => {});
    let answered = false;
    void response.then(() => {
      answered = true;
    });
    // Slowloris on the body: one byte per 250 ms, a quarter of the pause bound, 4 bytes/s. Before
    // the bound, all 40 bytes (10 s) went through and the upstream answered 200.
    let sent = 0;
    while (!answered && sent < totalBytes) {
      req.write('x');
      sent++;
      await Promise.race([response, new Promise((resolve) => setTimeout(resolve, 250))]);
    }
    const result = await response;
    assert.equal(result.status, 408, `after ${sent} bytes: ${result.body}`);
    assert.equal(result.headers.connection, 'close');
    const body = JSON.parse(result.body) as { error: string; message: string };
    assert.equal(body.error, 'client_timeout');
    assert.match(body.message, /^the request body came slower than 500 bytes\/s: \d+ bytes in \d+ ms$/);
    // 1 s of grace plus 2 ms a byte: cut after about 4 bytes, far from all 40.
    assert.ok(sent < 10, `cut after ${sent} bytes`);
    assert.equal(await upstreamLength, -1, 'the upstream sees the upload cut, its connection freed');
    assert.equal(await outcome(proxy, 'client_timeout'), 1);
    req.destroy();
  });

  it('answers 408 to request headers still incomplete after server.headersTimeoutMs, within a second of it', async () => {
    const { proxy, upstream } = await fixtures.start(
      rules('server:\n  headersTimeoutMs: 500\n'),
      (_req, res) => res.end('ok'),
    );
    const { port } = new URL(proxy.base);
    const socket = connect(Number(port), '127.0.0.1');
    let received = '';
    socket.on('data', (chunk) => {
      received += String(chunk);
    });
    const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    socket.on('error', () => {});
    const startedMs = performance.now();
    // Slowloris on the headers: a start, then nothing. Node checked this bound every 30 s.
    socket.write('GET / HTTP/1.1\r\nHost: x\r\n');
    await closed;
    const elapsedMs = performance.now() - startedMs;
    assert.match(received, /^HTTP\/1\.1 408 /);
    assert.ok(elapsedMs >= 450 && elapsedMs < 2500, `closed after ${Math.round(elapsedMs)} ms`);
    assert.equal(upstream.seen.length, 0);
  });

  it('cuts the response when the body pauses too long after the upstream started answering', async () => {
    const { proxy } = await fixtures.start(rules('server:\n  bodyTimeoutMs: 300\n'), (req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      req.pipe(res);
    });
    // Declared past server.bufferBodyBytes: streamed, so the upstream answers as it comes.
    const { req, response } = upload(`${proxy.base}/echo`, 1024 * 1024);
    req.on('error', () => {});
    req.write('0123456789');
    const result = await response;
    assert.equal(result.status, 200);
    assert.equal(result.cut, true);
    await until('counted as client_timeout', async () => (await outcome(proxy, 'client_timeout')) === 1);
    req.destroy();
  });

  it('does not hold an upstream that is slow to read against the client', async () => {
    const { proxy } = await fixtures.start(rules('server:\n  bodyTimeoutMs: 500\n'), (req, res) => {
      // Reads nothing for three times the body timeout: the proxy stops reading the client, who is
      // not idle by choice.
      setTimeout(() => void bodyLength(req).then((length) => res.end(`got ${length}`)), 1_500);
    });
    const totalBytes = 32 * 1024 * 1024;
    const { req, response } = upload(`${proxy.base}/upload`, totalBytes);
    req.end(Buffer.alloc(totalBytes, 1));
    const result = await response;
    assert.equal(result.status, 200);
    assert.equal(result.body, `got ${totalBytes}`);
  });

  it('a full-duplex upstream held back by a client slow to read is not taken for a stuck one', async () => {
    // Echoes the body as it comes: when the client stops reading the answer, the proxy pauses the
    // upstream, which then stops taking the body.
    const { proxy } = await fixtures.start(
      rules(),
      (req, res) => {
        res.writeHead(200);
        req.pipe(res);
      },
      '\n  sendTimeoutMs: 300',
    );
    const totalBytes = 32 * 1024 * 1024;
    let received = 0;
    const done = new Promise<number>((resolve, reject) => {
      const req = request(
        `${proxy.base}/echo`,
        { method: 'POST', agent: false, headers: { 'content-length': String(totalBytes) } },
        (res) => {
          res.pause();
          // Three times the send bound without reading, then everything.
          setTimeout(() => res.resume(), 1_000);
          res.on('data', (data: Buffer) => {
            received += data.length;
          });
          res.on('end', () => resolve(res.statusCode ?? 0));
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(Buffer.alloc(totalBytes, 1));
    });
    assert.equal(await done, 200);
    assert.equal(received, totalBytes);
    assert.equal(await outcome(proxy, 'upstream_timeout'), 0);
  });

  it('answers 504 when the upstream takes no request body bytes for upstream.sendTimeoutMs, and frees its connection', async () => {
    const { upstream, proxy } = await fixtures.start(
      rules(),
      (req, res) => {
        // Reads nothing and never answers: a hung upstream.
        if (req.url === '/after') res.end('ok');
      },
      '\n  connections: 1\n  sendTimeoutMs: 500\n  headersTimeoutMs: 0',
    );
    // Far more than the socket buffers between proxy and upstream hold.
    const totalBytes = 64 * 1024 * 1024;
    const { req, response } = upload(`${proxy.base}/upload`, totalBytes);
    req.on('error', () => {});
    req.end(Buffer.alloc(totalBytes, 1));
    const startedMs = performance.now();
    const result = await response;
    assert.equal(result.status, 504);
    assert.deepEqual(JSON.parse(result.body), {
      error: 'upstream_timeout',
      message: 'upstream took no request body bytes for 500 ms',
    });
    assert.ok(performance.now() - startedMs < 10_000);
    assert.equal(await outcome(proxy, 'upstream_timeout'), 1);
    // The hung request's connection was closed: the next request gets a new one.
    assert.equal((await send(`${proxy.base}/after`)).body, 'ok');
    assert.equal(upstream.seen.length, 2);
  });
});
