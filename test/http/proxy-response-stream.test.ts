import assert from 'node:assert/strict';
import { type IncomingMessage, request } from 'node:http';
import { describe, it } from 'node:test';
import { until } from '../helpers/until.js';
import { metricValue, ProxyFixtures, send, type TestProxy, type UpstreamHandler } from './proxy-harness.js';

// How the proxy relays an upstream response: backpressure from a slow client, an upstream that
// fails mid-body, a client that leaves mid-body or while its request waits for a connection,
// informational responses, HEAD, and how each outcome is counted.

const LOCAL = 'backend:\n  kind: local\nbuckets: []\n';

const fixtures = new ProxyFixtures();
const setup = (handler: UpstreamHandler, upstreamOptions = '') =>
  fixtures.start(LOCAL, handler, upstreamOptions);

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

describe('spillway proxy: relaying the response', () => {
  it('holds the upstream back while the client does not read, and delivers every byte when it does', async () => {
    const totalBytes = 128 * 1024 * 1024;
    const chunk = Buffer.alloc(64 * 1024, 1);
    let written = 0;
    const { proxy } = await setup((_req, res) => {
      res.writeHead(200, { 'content-length': String(totalBytes) });
      const write = () => {
        while (written < totalBytes) {
          written += chunk.length;
          if (!res.write(chunk)) {
            res.once('drain', write);
            return;
          }
        }
        res.end();
      };
      write();
    });
    let received = 0;
    let response: IncomingMessage | undefined;
    const ended = new Promise<void>((resolve, reject) => {
      const req = request(`${proxy.base}/big`, { agent: false }, (res) => {
        response = res;
        res.pause();
        res.on('data', (data: Buffer) => {
          received += data.length;
        });
        res.on('end', resolve);
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
    await until('the response headers arrive', () => response !== undefined);
    // Wait until the upstream stalls: nothing more written in 250 ms.
    const deadline = Date.now() + 30_000;
    for (let last = -1; written !== last; ) {
      if (Date.now() > deadline) throw new Error('the upstream never stalled');
      last = written;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    // Loopback socket buffers on three sockets hold a few MB each; the proxy itself holds ~nothing.
    assert.ok(
      written < totalBytes / 2,
      `upstream wrote ${(written / 1048576).toFixed(1)} MB of ${totalBytes / 1048576} MB while the client read nothing`,
    );
    response!.resume();
    await ended;
    assert.equal(received, totalBytes);
    await until('counted as forwarded', async () => (await outcome(proxy, 'forwarded')) === 1);
  });

  it('cuts a response the client takes no bytes of for server.sendTimeoutMs, freeing its pooled connection', async () => {
    const chunk = Buffer.alloc(64 * 1024, 1);
    const { proxy } = await fixtures.start(
      `server:\n  sendTimeoutMs: 300\n${LOCAL}`,
      (req, res) => {
        if (req.url !== '/big') {
          res.end('ok');
          return;
        }
        // Endless: only the proxy giving up ends it.
        const write = () => {
          while (res.write(chunk));
          res.once('drain', write);
        };
        write();
      },
      '\n  connections: 1',
    );
    const req = request(`${proxy.base}/big`, { agent: false }, (res) => {
      // Reads nothing, and stays connected. (The proxy's close reaches it only behind the bytes it
      // has not read, so it is the proxy's count that tells.)
      res.pause();
      res.on('error', () => {});
    });
    req.on('error', () => {});
    req.end();
    await until('the proxy cuts the response', async () => (await outcome(proxy, 'client_timeout')) === 1);
    // The only pooled connection is free again.
    assert.equal((await send(`${proxy.base}/after`)).body, 'ok');
    req.destroy();
  });

  it('cuts the client response when the upstream fails mid-body, counted as upstream_error', async () => {
    const { proxy } = await setup((_req, res) => {
      res.writeHead(200, { 'content-length': '1000' });
      res.write('x'.repeat(100), () => res.socket?.destroy());
    });
    const result = await new Promise<{ status: number; received: number; cut: boolean }>(
      (resolve, reject) => {
        const req = request(`${proxy.base}/cut`, { agent: false }, (res) => {
          let received = 0;
          res.on('data', (data: Buffer) => {
            received += data.length;
          });
          res.on('end', () => resolve({ status: res.statusCode!, received, cut: false }));
          res.on('error', () => resolve({ status: res.statusCode!, received, cut: true }));
          res.on('aborted', () => resolve({ status: res.statusCode!, received, cut: true }));
        });
        req.on('error', reject);
        req.end();
      },
    );
    assert.equal(result.status, 200);
    assert.equal(result.cut, true, 'the client must see the response cut, not a short complete one');
    assert.ok(result.received < 1000);
    await until('counted as upstream_error', async () => (await outcome(proxy, 'upstream_error')) === 1);
    assert.equal(await outcome(proxy, 'forwarded'), 0);
  });

  it('aborts the upstream response when the client leaves mid-body, counted as client_abort', async () => {
    let upstreamCut = false;
    const { proxy } = await setup((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: first\n\n');
      res.on('close', () => {
        upstreamCut = !res.writableFinished;
      });
    });
    const req = request(`${proxy.base}/events`, { agent: false }, (res) => {
      res.once('data', () => req.destroy());
    });
    req.on('error', () => {});
    req.end();
    await until('the upstream response is aborted', () => upstreamCut);
    await until('counted as client_abort', async () => (await outcome(proxy, 'client_abort')) === 1);
    assert.equal(await outcome(proxy, 'forwarded'), 0);
    assert.equal(await outcome(proxy, 'upstream_error'), 0);
  });

  it('never sends a request whose client left while it waited for an upstream connection', async () => {
    let releaseFirst: (() => void) | undefined;
    const { upstream, proxy } = await setup((req, res) => {
      if (req.url === '/first') releaseFirst = () => res.end('first');
      else res.end('ok');
    }, '\n  connections: 1');
    const first = send(`${proxy.base}/first`);
    await until('the first request holds the only connection', () => releaseFirst !== undefined);
    const queued = request(`${proxy.base}/queued`, { agent: false });
    queued.on('error', () => {});
    queued.end();
    await until('the proxy has the queued request', () => proxy.proxy.inFlight === 2);
    queued.destroy();
    await until('the queued request is gone', () => proxy.proxy.inFlight === 1);
    releaseFirst!();
    assert.equal((await first).body, 'first');
    assert.equal((await send(`${proxy.base}/third`)).body, 'ok');
    assert.deepEqual(
      upstream.seen.map((r) => r.url),
      ['/first', '/third'],
    );
    await until('counted as client_abort', async () => (await outcome(proxy, 'client_abort')) === 1);
    assert.equal(await outcome(proxy, 'forwarded'), 2);
  });

  it('skips informational responses, relays HEAD, and counts each forwarded request and its header time once', async () => {
    const { proxy } = await setup((req, res) => {
      if (req.url === '/hints') res.writeEarlyHints({ link: '</style.css>; rel=preload' });
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '5', 'x-path': req.url });
      res.end(req.method === 'HEAD' ? undefined : 'hello');
    });
    const hinted = await send(`${proxy.base}/hints`);
    assert.equal(hinted.status, 200);
    assert.equal(hinted.body, 'hello');
    assert.equal(hinted.headers['x-path'], '/hints');
    const head = await send(`${proxy.base}/head`, { method: 'HEAD' });
    assert.equal(head.status, 200);
    assert.equal(head.headers['content-length'], '5');
    assert.equal(head.body, '');
    const plain = await send(`${proxy.base}/plain`);
    assert.equal(plain.body, 'hello');
    await until('three forwarded', async () => (await outcome(proxy, 'forwarded')) === 3);
    const histogram = await proxy.registry.getSingleMetric('spillway_proxy_upstream_headers_seconds')?.get();
    const count = histogram?.values.find(
      (v) => (v as { metricName?: string }).metricName === 'spillway_proxy_upstream_headers_seconds_count',
    );
    assert.equal(count?.value, 3);
  });
});
