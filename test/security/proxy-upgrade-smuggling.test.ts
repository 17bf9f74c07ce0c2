import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage } from 'node:http';
import { connect as connectHttp2, createServer as createHttp2Server } from 'node:http2';
import { type AddressInfo, connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
} from '../integration/spillway-process.js';

// `Upgrade: h2c` through a real `spillway proxy` process (issue 36): an upstream that speaks
// HTTP/2 after an h2c upgrade would take every request the client sends on the upgraded
// connection past the buckets, which decided the upgrade request alone. Before the fix, one
// admitted upgrade carried 200 HTTP/2 requests to a path limited to 5 per client, and the proxy
// counted one. What must hold is the honest party's outcome: the upstream serves that path at
// most 5 times to the attacker, whatever it sends; and a WebSocket upgrade still tunnels.

const LIMIT = 5;
const SMUGGLED = 200;

/**
 * An upstream that takes whatever upgrade it is asked for: `h2c` becomes a real HTTP/2 server
 * (node:http2) on the upgraded socket, `websocket` an echo. Counts the requests it serves to
 * `/limited`, in either protocol, and the upgrades it saw.
 */
async function startPermissiveUpstream() {
  const counts = { limitedServed: 0, upgrades: [] as string[] };
  const http2 = createHttp2Server();
  http2.on('stream', (stream, headers) => {
    if (String(headers[':path']).startsWith('/limited')) counts.limitedServed++;
    stream.respond({ ':status': 200 });
    stream.end('ok');
  });
  const sockets = new Set<Socket>();
  const server = createHttpServer((req, res) => {
    if (req.url?.startsWith('/limited')) counts.limitedServed++;
    res.end('ok');
  });
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    const protocol = String(req.headers.upgrade).toLowerCase();
    counts.upgrades.push(protocol);
    socket.on('error', () => {});
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${protocol}\r\n\r\n`);
    if (protocol === 'h2c') {
      if (req.url?.startsWith('/limited')) counts.limitedServed++;
      if (head.length > 0) socket.unshift(head);
      http2.emit('connection', socket);
    } else {
      socket.on('data', (data: Buffer) => socket.write(data));
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    counts,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      http2.close();
    },
  };
}

interface RawAnswer {
  status: number;
  head: string;
  body: string;
  /** The connection, after a 101, positioned at the first byte past the head. */
  socket: Socket;
}

/** An upgrade request on a fresh connection; resolves with the answer's head (and body, but for a 101). */
function rawUpgrade(port: number, path: string, upgrade: string, extra = ''): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let received = Buffer.alloc(0);
    let answer: RawAnswer | undefined;
    const onData = (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      if (answer !== undefined) {
        answer.body = received.toString('latin1');
        return;
      }
      const end = received.indexOf('\r\n\r\n');
      if (end === -1) return;
      const head = received.subarray(0, end).toString('latin1');
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]);
      received = received.subarray(end + 4);
      answer = { status, head, body: received.toString('latin1'), socket };
      if (status === 101) {
        socket.off('data', onData);
        socket.pause();
        if (received.length > 0) socket.unshift(received);
        resolve(answer);
      }
    };
    socket.on('data', onData);
    socket.on('error', reject);
    socket.on('close', () => (answer ? resolve(answer) : reject(new Error('closed without an answer'))));
    socket.write(
      `GET ${path} HTTP/1.1\r\nHost: app.example\r\nConnection: Upgrade${extra === '' ? '' : ', HTTP2-Settings'}\r\nUpgrade: ${upgrade}\r\n${extra}\r\n`,
    );
  });
}

/** Sends `count` HTTP/2 requests to `path` on an upgraded connection; resolves with the statuses. */
async function smuggle(socket: Socket, path: string, count: number): Promise<number[]> {
  const session = connectHttp2('http://app.example', { createConnection: () => socket });
  session.on('error', () => {});
  try {
    return await Promise.all(
      Array.from(
        { length: count },
        () =>
          new Promise<number>((resolve) => {
            const stream = session.request({ ':path': path });
            stream.on('response', (headers) => resolve(Number(headers[':status'])));
            stream.on('error', () => resolve(0));
            stream.resume();
            stream.end();
          }),
      ),
    );
  } finally {
    session.destroy();
  }
}

const dir = mkdtempSync(join(tmpdir(), 'spillway-h2c-'));
const started: SpillwayProcess[] = [];
after(async () => {
  for (const p of started) await stopSpillway(p, 2_000);
  rmSync(dir, { recursive: true, force: true });
});

async function startProxy(upstreamUrl: string, server = ''): Promise<{ port: number; ops: string }> {
  const file = join(dir, `rules-${started.length}.yaml`);
  writeFileSync(
    file,
    `version: 1
upstream:
  url: ${upstreamUrl}
${server}backend:
  kind: local
buckets:
  - name: limited-per-client
    key: "limited:{client}"
    limit: ${LIMIT}
    windowSec: 600
    match: { prefix: /limited }
`,
  );
  const p = await startSpillway('proxy', [
    'proxy',
    '--config',
    file,
    '--listen',
    '127.0.0.1:0',
    '--ops',
    '127.0.0.1:0',
  ]);
  started.push(p);
  const line = p.output.find((l) => l.includes('"listening"'))!;
  const address = (JSON.parse(line) as { proxy: string }).proxy;
  return { port: Number(address.slice(address.lastIndexOf(':') + 1)), ops: p.ops };
}

describe('spillway proxy: upgrades it does not tunnel', { timeout: 60_000 }, () => {
  it('h2c: refused 501 upgrade_refused, never forwarded; the limited path stays within its limit', async (t) => {
    const upstream = await startPermissiveUpstream();
    t.after(upstream.close);
    const proxy = await startProxy(upstream.url);

    const answer = await rawUpgrade(
      proxy.port,
      '/limited/items',
      'h2c',
      'HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n',
    );
    let smuggled: number[] = [];
    if (answer.status === 101) smuggled = await smuggle(answer.socket, '/limited/items', SMUGGLED);
    answer.socket.destroy();
    // The honest party: the upstream's limited path, at most LIMIT requests from this client.
    assert.equal(
      upstream.counts.limitedServed <= LIMIT,
      true,
      `the upstream served /limited ${upstream.counts.limitedServed} times (${smuggled.filter((s) => s === 200).length} over HTTP/2) to a client limited to ${LIMIT}`,
    );
    assert.deepEqual(upstream.counts.upgrades, [], 'the upstream never sees the h2c upgrade');
    assert.equal(answer.status, 501, answer.head);
    assert.match(answer.head, /\r\nconnection: close$/i);
    assert.deepEqual(JSON.parse(answer.body), {
      error: 'upgrade_refused',
      message: 'this proxy does not tunnel the h2c protocol (it tunnels: websocket)',
      upgrade: 'h2c',
      tunnels: ['websocket'],
    });
    const metrics = await scrape(proxy.ops);
    assert.equal(metrics.get(seriesKey('spillway_proxy_requests_total', { outcome: 'upgrade_refused' })), 1);
    assert.equal(metrics.get(seriesKey('spillway_proxy_requests_total', { outcome: 'forwarded' })), 0);

    // The refusal spends nothing and the client keeps its plain HTTP/1.1 budget: LIMIT, then 429.
    const statuses: number[] = [];
    for (let i = 0; i < LIMIT + 2; i++) {
      statuses.push((await fetch(`http://127.0.0.1:${proxy.port}/limited/items`)).status);
    }
    assert.deepEqual(statuses, [...Array(LIMIT).fill(200), 429, 429]);
    assert.equal(upstream.counts.limitedServed, LIMIT);
  });

  it('refuses h2c in any spelling or list, and any protocol not listed; a WebSocket upgrade still tunnels', async (t) => {
    const upstream = await startPermissiveUpstream();
    t.after(upstream.close);
    const proxy = await startProxy(upstream.url);
    for (const upgrade of ['H2C', 'websocket, h2c', 'h2c, websocket', 'h2', 'tcp', 'SPDY/3.1']) {
      const answer = await rawUpgrade(proxy.port, '/socket', upgrade);
      answer.socket.destroy();
      assert.equal(answer.status, 501, `${upgrade}: ${answer.head}`);
      assert.equal((JSON.parse(answer.body) as { error: string }).error, 'upgrade_refused', upgrade);
    }
    assert.deepEqual(upstream.counts.upgrades, []);

    for (const upgrade of ['websocket', 'WebSocket']) {
      const tunnel = await rawUpgrade(proxy.port, '/socket', upgrade);
      assert.equal(tunnel.status, 101, tunnel.head);
      const echoed = new Promise<string>((resolve) =>
        tunnel.socket.once('data', (data: Buffer) => resolve(data.toString())),
      );
      tunnel.socket.resume();
      tunnel.socket.write('ping');
      assert.equal(await echoed, 'ping');
      tunnel.socket.destroy();
    }
    assert.deepEqual(upstream.counts.upgrades, ['websocket', 'websocket']);
    const metrics = await scrape(proxy.ops);
    assert.equal(metrics.get(seriesKey('spillway_proxy_requests_total', { outcome: 'upgrade_refused' })), 6);
  });

  it('server.upgradeProtocols lists what is tunnelled: [] refuses WebSocket too, a listed protocol passes', async (t) => {
    const upstream = await startPermissiveUpstream();
    t.after(upstream.close);
    const none = await startProxy(upstream.url, 'server:\n  upgradeProtocols: []\n');
    const refused = await rawUpgrade(none.port, '/socket', 'websocket');
    refused.socket.destroy();
    assert.equal(refused.status, 501);
    assert.deepEqual(JSON.parse(refused.body), {
      error: 'upgrade_refused',
      message: 'this proxy does not tunnel the websocket protocol (it tunnels none)',
      upgrade: 'websocket',
      tunnels: [],
    });
    const docker = await startProxy(upstream.url, 'server:\n  upgradeProtocols: [websocket, tcp]\n');
    const tunnel = await rawUpgrade(docker.port, '/containers/x/attach', 'tcp');
    tunnel.socket.destroy();
    assert.equal(tunnel.status, 101, tunnel.head);
    assert.deepEqual(upstream.counts.upgrades, ['tcp']);
  });
});
