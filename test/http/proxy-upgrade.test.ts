import assert from 'node:assert/strict';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { describe, it } from 'node:test';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { until } from '../helpers/until.js';
import {
  metricValue,
  openUpgrade,
  ProxyFixtures,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
} from './proxy-harness.js';

// Upgraded connections (WebSocket) as tunnels: one side leaving closes the other, idle tunnels
// are closed, and a graceful stop waits for tunnels but counts each one once when it cuts them.

const fixtures = new ProxyFixtures();

/**
 * An upstream whose 'upgrade' handler answers 101 and echoes, and, like a plain Node handler, does
 * nothing when the proxy half-closes its side: the proxy alone must close the tunnel.
 */
async function echoingUpstream(): Promise<{ upstream: Upstream; held: Socket[] }> {
  const upstream = await startUpstream();
  const held: Socket[] = [];
  upstream.server.on('upgrade', (_req, socket: Socket) => {
    held.push(socket);
    socket.on('error', () => {});
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    socket.on('data', (data: Buffer) => socket.write(data));
  });
  // Its upgraded sockets are not the server's to close: it would wait for them for ever.
  const closeServer = upstream.close;
  upstream.close = async () => {
    for (const socket of held) socket.destroy();
    await closeServer();
  };
  return { upstream, held };
}

function outcome(proxy: TestProxy, name: string): Promise<number> {
  return metricValue(proxy.registry, 'spillway_proxy_requests_total', { outcome: name });
}

function rules(server = ''): string {
  return `${server}backend:\n  kind: local\nbuckets: []\n`;
}

async function openTunnel(base: string): Promise<Socket> {
  const opened = await openUpgrade(`${base}/socket`);
  assert.equal(opened.status, 101);
  const socket = opened.socket!;
  socket.on('error', () => {});
  return socket;
}

function echo(socket: Socket, text: string): Promise<string> {
  const echoed = new Promise<string>((resolve) =>
    socket.once('data', (data: Buffer) => resolve(data.toString())),
  );
  socket.write(text);
  return echoed;
}

function ended(socket: Socket): Promise<void> {
  return new Promise((resolve) => {
    if (socket.readableEnded) resolve();
    socket.once('end', () => resolve());
  });
}

describe('spillway proxy: upgraded connections', { timeout: 30_000 }, () => {
  it('a client that leaves closes the tunnel: the upstream gets its FIN and the tunnel stops counting', async () => {
    const { upstream, held } = await echoingUpstream();
    const { proxy } = await fixtures.start(rules(), upstream);
    const client = await openTunnel(proxy.base);
    assert.equal(await echo(client, 'ping'), 'ping');
    assert.equal(proxy.proxy.inFlight, 1);
    const upstreamEnded = ended(held[0]!);
    client.destroy();
    await upstreamEnded;
    await until('the tunnel is closed', () => proxy.proxy.inFlight === 0);
  });

  it('an upstream that leaves closes the tunnel: the client gets its FIN', async () => {
    const { upstream, held } = await echoingUpstream();
    const { proxy } = await fixtures.start(rules(), upstream);
    const client = await openTunnel(proxy.base);
    assert.equal(await echo(client, 'ping'), 'ping');
    const clientEnded = ended(client);
    held[0]!.end();
    await clientEnded;
    await until('the tunnel is closed', () => proxy.proxy.inFlight === 0);
  });

  it('closes a tunnel with no bytes either way for server.upgradeIdleTimeoutMs; traffic keeps it open', async () => {
    const { upstream, held } = await echoingUpstream();
    const { proxy } = await fixtures.start(rules('server:\n  upgradeIdleTimeoutMs: 1000\n'), upstream);
    const client = await openTunnel(proxy.base);
    const openedMs = performance.now();
    // Traffic every 100 ms for well past the idle timeout: the tunnel stays.
    while (performance.now() - openedMs < 2_000) {
      assert.equal(await echo(client, 'ping'), 'ping');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const clientEnded = ended(client);
    const upstreamEnded = ended(held[0]!);
    await Promise.all([clientEnded, upstreamEnded]);
    await until('the tunnel is closed', () => proxy.proxy.inFlight === 0);
  });

  it('a graceful stop ends when the last tunnel closes, without waiting out the drain timeout', async () => {
    const { upstream } = await echoingUpstream();
    const proxy = await startTestProxy(upstream.url, rules('server:\n  upgradeIdleTimeoutMs: 0\n'));
    fixtures.track(upstream.close);
    const client = await openTunnel(proxy.base);
    const stopped = proxy.proxy.close({ drainTimeoutMs: 20_000 });
    await until('draining', () => proxy.proxy.draining);
    assert.equal(await echo(client, 'still open'), 'still open', 'tunnels are not cut when the drain starts');
    client.destroy();
    assert.deepEqual(await stopped, { forcedConnections: 0 });
  });

  it('an upgrade arriving during the drain is refused 503 and counted as draining, not bad_request', async () => {
    const { upstream } = await echoingUpstream();
    const proxy = await startTestProxy(upstream.url, rules('server:\n  upgradeIdleTimeoutMs: 0\n'));
    fixtures.track(upstream.close);
    // The tunnel keeps the drain going. The upgrade's head starts before the drain (the listener
    // closes, and idle connections with it, when the drain starts) and ends during it.
    const tunnel = await openTunnel(proxy.base);
    const late = connect(Number(new URL(proxy.base).port), '127.0.0.1');
    late.on('error', () => {});
    let received = '';
    late.on('data', (chunk: Buffer) => {
      received += chunk.toString('latin1');
    });
    await new Promise((resolve) => late.once('connect', resolve));
    late.write('GET /socket HTTP/1.1\r\nHost: x\r\n');
    // On loopback the bytes are at the proxy once written: an echo through the tunnel, sent after
    // them, comes back only once the proxy's event loop has polled (and read) both.
    assert.equal(await echo(tunnel, 'after the head'), 'after the head');
    const stopped = proxy.proxy.close({ drainTimeoutMs: 20_000 });
    await until('draining', () => proxy.proxy.draining);
    late.write('Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n');
    await until('the refusal', () => received.includes('"draining"'));
    assert.match(received, /^HTTP\/1\.1 503 /);
    assert.equal(await outcome(proxy, 'draining'), 1);
    assert.equal(await outcome(proxy, 'bad_request'), 0);
    late.destroy();
    tunnel.destroy();
    assert.deepEqual(await stopped, { forcedConnections: 0 });
  });

  it('a tunnel still open at the drain deadline is cut and counted once', async () => {
    const { upstream } = await echoingUpstream();
    const proxy = await startTestProxy(upstream.url, rules('server:\n  upgradeIdleTimeoutMs: 0\n'));
    fixtures.track(upstream.close);
    const client = await openTunnel(proxy.base);
    const clientEnded = ended(client);
    assert.deepEqual(await proxy.proxy.close({ drainTimeoutMs: 200 }), { forcedConnections: 1 });
    await clientEnded;
    await until('the tunnel is released', () => proxy.proxy.inFlight === 0);
  });

  it('an upgrade still waiting for the upstream at the drain deadline is cut, not left to its headers timeout', async () => {
    const upstream = await startUpstream();
    const waiting: Socket[] = [];
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      waiting.push(socket);
    });
    const proxy = await startTestProxy(upstream.url, rules());
    // Closed newest first: the sockets before the server that would wait for them.
    fixtures.track(upstream.close, async () => {
      for (const socket of waiting) socket.destroy();
    });
    const refused = assert.rejects(openUpgrade(`${proxy.base}/socket`), /socket hang up|ECONNRESET/);
    await until('the upstream has the upgrade request', () => waiting.length === 1);
    const startedMs = performance.now();
    assert.deepEqual(await proxy.proxy.close({ drainTimeoutMs: 200 }), { forcedConnections: 1 });
    // Without the cut, close() waits for upstream.headersTimeoutMs (30 s).
    assert.ok(performance.now() - startedMs < 10_000);
    await refused;
  });
  it('a client that leaves before the upstream answers 101 aborts the upgrade: never a tunnel, counted client_abort', async () => {
    const upstream = await startUpstream();
    const waiting: Socket[] = [];
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      socket.on('error', () => {});
      waiting.push(socket);
    });
    const { proxy } = await fixtures.start(rules('server:\n  upgradeIdleTimeoutMs: 0\n'), upstream);
    fixtures.track(async () => {
      for (const socket of waiting) socket.destroy();
    });
    const client = connect(proxy.proxy.port, '127.0.0.1');
    client.on('error', () => {});
    client.write('GET /socket HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n');
    await until('the upstream has the upgrade request', () => waiting.length === 1);
    const upstreamClosed = new Promise((resolve) => waiting[0]!.once('close', resolve));
    // A departing client's FIN is all the proxy sees of it (its sockets are half-open).
    client.destroy();
    await until('the upgrade is released', () => proxy.proxy.inFlight === 0);
    assert.equal(await outcome(proxy, 'client_abort'), 1);
    assert.equal(await outcome(proxy, 'forwarded'), 0);
    waiting[0]!.end();
    await upstreamClosed;
  });

  it('an upgrade waiting for a pooled connection past headersTimeoutMs gets 504 upstream_queue_timeout', async () => {
    const { upstream } = await echoingUpstream();
    upstream.handler = (_req, res) => {
      // Holds the only pooled connection.
      res.writeHead(200);
      res.write('x');
    };
    const { proxy } = await fixtures.start(rules(), upstream, '\n  connections: 1\n  headersTimeoutMs: 500');
    const hold = request(`${proxy.base}/hold`, { agent: false });
    hold.on('error', () => {});
    hold.end();
    await until('the connection is held', () => upstream.seen.length === 1);
    const startedMs = performance.now();
    const refused = await openUpgrade(`${proxy.base}/socket`);
    const waitedMs = performance.now() - startedMs;
    assert.equal(refused.status, 504);
    assert.deepEqual(JSON.parse(refused.body!), {
      error: 'upstream_queue_timeout',
      message: 'the upgrade waited 500 ms for one of the 1 upstream connections',
    });
    assert.ok(waitedMs >= 450 && waitedMs < 2_000, `answered after ${waitedMs} ms`);
    assert.equal(await outcome(proxy, 'upstream_queue_timeout'), 1);
    hold.destroy();
    // The upgrade never reached the upstream, and took no connection: the next request has it.
    await until('the held request is done', () => proxy.proxy.inFlight === 0);
    upstream.handler = (_req, res) => res.end('ok');
    assert.equal((await fetch(`${proxy.base}/after`)).status, 200);
  });

  it('an upgrade waiting for its 101 holds one of upstream.connections: a request behind it waits in the proxy queue', async () => {
    const upstream = await startUpstream();
    const pending: Socket[] = [];
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      socket.on('error', () => {});
      pending.push(socket);
    });
    let connections = 0;
    upstream.server.on('connection', () => connections++);
    // No deadline for the upgrade; then, reloaded, one for the request that arrives behind it.
    const { proxy } = await fixtures.start(rules(), upstream, '\n  connections: 1\n  headersTimeoutMs: 0');
    fixtures.track(async () => {
      for (const socket of pending) socket.destroy();
    });
    const upgrade = openUpgrade(`${proxy.base}/socket`);
    await until('the upstream has the upgrade request', () => pending.length === 1);
    proxy.proxy.setRules(
      parseProxyRules(
        `version: 1\nupstream:\n  url: ${upstream.url}\n  connections: 1\n  headersTimeoutMs: 500\n${rules()}`,
      ),
    );
    const queued = await fetch(`${proxy.base}/behind`);
    assert.equal(queued.status, 504);
    assert.deepEqual(await queued.json(), {
      error: 'upstream_queue_timeout',
      message: 'the request waited 500 ms for one of the 1 upstream connections',
    });
    assert.equal(upstream.seen.length, 0, 'the request never reached the upstream');
    pending[0]!.destroy();
    assert.equal((await upgrade).status, 502);
    // The upgrade gave its connection back: the next request has it. The request that timed out
    // cost no connection (in undici's queue, it would have been aborted on one, destroying it).
    assert.equal((await fetch(`${proxy.base}/after`)).status, 200);
    assert.equal(connections, 2, 'one connection for the upgrade, one for the request after it');
  });

  it('a tunnel does not hold a pooled connection: requests flow beside it with connections: 1', async () => {
    const { upstream } = await echoingUpstream();
    const { proxy } = await fixtures.start(
      rules('server:\n  upgradeIdleTimeoutMs: 0\n'),
      upstream,
      '\n  connections: 1\n  headersTimeoutMs: 2000',
    );
    const first = await openTunnel(proxy.base);
    const second = await openTunnel(proxy.base);
    for (let i = 0; i < 3; i++) assert.equal((await fetch(`${proxy.base}/beside`)).status, 200);
    assert.equal(await echo(first, 'one'), 'one');
    assert.equal(await echo(second, 'two'), 'two');
    first.destroy();
    second.destroy();
    await until('the tunnels are closed', () => proxy.proxy.inFlight === 0);
  });

  it('a client that leaves while its upgrade waits for a pooled connection is never forwarded', async () => {
    const { upstream, held } = await echoingUpstream();
    upstream.handler = (_req, res) => {
      res.writeHead(200);
      res.write('x');
    };
    const { proxy } = await fixtures.start(rules(), upstream, '\n  connections: 1');
    const hold = request(`${proxy.base}/hold`, { agent: false });
    hold.on('error', () => {});
    hold.end();
    await until('the connection is held', () => upstream.seen.length === 1);
    const client = connect(proxy.proxy.port, '127.0.0.1');
    client.on('error', () => {});
    client.write('GET /socket HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n');
    await until('the upgrade waits', () => proxy.proxy.inFlight === 2);
    client.destroy();
    await until('the upgrade is released', () => proxy.proxy.inFlight === 1);
    assert.equal(await outcome(proxy, 'client_abort'), 1);
    hold.destroy();
    await until('the held request is done', () => proxy.proxy.inFlight === 0);
    upstream.handler = (_req, res) => res.end('ok');
    assert.equal((await fetch(`${proxy.base}/after`)).status, 200);
    assert.equal(held.length, 0, 'the upstream never saw the upgrade');
  });

  it("relays an upstream's answer other than 101 (a WebSocket endpoint's 401) with RateLimit fields, then closes", async () => {
    // No 'upgrade' listener: Node hands upgrade requests to the request handler, which refuses.
    const upstream = await startUpstream((req, res) => {
      if (req.url === '/socket') {
        res.writeHead(401, {
          'content-type': 'application/json',
          'content-length': '26',
          'www-authenticate': 'Bearer',
          'x-kept': 'yes',
          // One byte, e9, on the wire (latin1): relayed as that byte, not re-encoded as UTF-8.
          'x-realm': 'caf\u00e9',
        });
        // A Buffer: with a string Node would send the head in that string's encoding, UTF-8.
        res.end(Buffer.from('{"error":"login required"}'));
      } else {
        // An endpoint that ignores the upgrade: 200 with a chunked body.
        res.write('part one, ');
        res.end('part two');
      }
    });
    const { proxy } = await fixtures.start(
      `backend:\n  kind: local\nbuckets:\n  - name: ws\n    limit: 5\n    windowSec: 60\n`,
      upstream,
    );
    const refused = await openUpgrade(`${proxy.base}/socket`);
    assert.equal(refused.status, 401);
    assert.equal(refused.body, '{"error":"login required"}');
    assert.equal(refused.headers['www-authenticate'], 'Bearer');
    assert.equal(refused.headers['x-kept'], 'yes');
    assert.equal(refused.headers['x-realm'], 'caf\u00e9');
    assert.equal(refused.headers['content-length'], '26');
    assert.equal(refused.headers['ratelimit-policy'], '"ws";q=5;w=60');
    assert.equal(refused.headers.connection, 'close');
    const ignored = await openUpgrade(`${proxy.base}/plain`);
    assert.equal(ignored.status, 200);
    assert.equal(ignored.body, 'part one, part two', 'a body without a length is delimited by the close');
    assert.equal(await outcome(proxy, 'forwarded'), 2);
    assert.equal(await outcome(proxy, 'upstream_error'), 0);
    await until('both connections are released', () => proxy.proxy.inFlight === 0);
    assert.equal((await fetch(`${proxy.base}/after`)).status, 200, 'the pooled connection is free again');
  });

  it('relays the 101 with its own fields and the RateLimit fields merged, not hop-by-hop ones', async () => {
    const upstream = await startUpstream();
    const held: Socket[] = [];
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      held.push(socket);
      socket.on('error', () => {});
      socket.write(
        'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade, X-Hop\r\nX-Hop: 1\r\n' +
          'Sec-WebSocket-Accept: abc\r\nKeep-Alive: timeout=5\r\nRateLimit-Policy: "app";q=2;w=60\r\nRateLimit: "app";r=1;t=60\r\n\r\n',
      );
    });
    const { proxy } = await fixtures.start(
      `backend:\n  kind: local\nbuckets:\n  - name: ws\n    limit: 5\n    windowSec: 60\n`,
      upstream,
    );
    // Closed before the upstream server, which would wait for them.
    fixtures.track(async () => {
      for (const socket of held) socket.destroy();
    });
    const opened = await openUpgrade(`${proxy.base}/socket`);
    assert.equal(opened.status, 101);
    opened.socket!.destroy();
    assert.equal(opened.headers.upgrade, 'websocket');
    assert.equal(opened.headers.connection, 'upgrade');
    assert.equal(opened.headers['sec-websocket-accept'], 'abc');
    assert.equal(opened.headers['x-hop'], undefined);
    assert.equal(opened.headers['keep-alive'], undefined);
    // The upstream's own policy and the proxy's, merged into one field each (not a second line).
    assert.equal(opened.headers['ratelimit-policy'], '"app";q=2;w=60, "ws";q=5;w=60');
    assert.equal(opened.headers.ratelimit, '"app";r=1;t=60, "ws";r=4;t=12');
  });

  it('an upstream that ends right after its 101 closes the tunnel', async () => {
    const upstream = await startUpstream();
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      socket.on('error', () => {});
      socket.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    });
    const { proxy } = await fixtures.start(rules('server:\n  upgradeIdleTimeoutMs: 0\n'), upstream);
    const client = await openTunnel(proxy.base);
    await ended(client);
    await until('the tunnel is closed', () => proxy.proxy.inFlight === 0);
  });

  it('an upstream 101 to a protocol the client did not ask for is no tunnel: 502, both sockets closed', async () => {
    const upstream = await startUpstream();
    const held: Socket[] = [];
    upstream.server.on('upgrade', (_req, socket: Socket) => {
      held.push(socket);
      socket.on('error', () => {});
      // Asked for websocket, switches to HTTP/2: every request on it would pass undecided.
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n');
    });
    const { proxy } = await fixtures.start(rules(), upstream);
    fixtures.track(async () => {
      for (const socket of held) socket.destroy();
    });
    const refused = await openUpgrade(`${proxy.base}/socket`);
    assert.equal(refused.status, 502);
    assert.deepEqual(JSON.parse(refused.body!), {
      error: 'upstream_error',
      message: 'upstream switched to a protocol the client did not ask for (h2c)',
    });
    await until('the upstream side is closed', () => held[0]!.destroyed || held[0]!.readableEnded);
    await until('the upgrade is released', () => proxy.proxy.inFlight === 0);
    assert.equal(await outcome(proxy, 'upstream_error'), 1);
    assert.equal(await outcome(proxy, 'forwarded'), 0);
  });
});
