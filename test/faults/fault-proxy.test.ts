import assert from 'node:assert/strict';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { type FaultProxy, startFaultProxy } from '../helpers/fault-proxy.js';

// The fault proxy is what the partition tests rely on; each mode must do what it says.

function connect(address: string): Promise<Socket> {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const socket = createConnection({ host, port: Number(port) }, () => resolve(socket));
    socket.once('error', reject);
  });
}

/** Sends `text` and resolves with the echo, or 'timeout' / 'error' / 'closed'. */
function roundTrip(socket: Socket, text: string, timeoutMs: number): Promise<string> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve('timeout'), timeoutMs);
    socket.once('data', (data) => {
      clearTimeout(timer);
      resolve(data.toString());
    });
    socket.once('error', () => {
      clearTimeout(timer);
      resolve('error');
    });
    socket.once('close', () => {
      clearTimeout(timer);
      resolve('closed');
    });
    socket.write(text);
  });
}

describe('fault proxy', () => {
  let echo: Server;
  let proxy: FaultProxy;

  before(async () => {
    echo = createServer((socket) => {
      socket.on('error', () => {});
      socket.pipe(socket);
    });
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    const address = echo.address();
    proxy = await startFaultProxy(`127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`);
  });

  after(async () => {
    await proxy.close();
    await new Promise<void>((resolve) => echo.close(() => resolve()));
  });

  it('passes, blackholes, drops, delays and resets, switched at runtime', async () => {
    const socket = await connect(proxy.address);
    assert.equal(await roundTrip(socket, 'a', 2_000), 'a');

    proxy.setMode('blackhole');
    assert.equal(await roundTrip(socket, 'b', 300), 'timeout', 'nothing crosses a partition');
    const late = new Promise<string>((resolve) => socket.once('data', (data) => resolve(data.toString())));
    proxy.setMode('pass');
    assert.equal(await late, 'b', 'a healed partition delivers what was held');

    proxy.setMode('drop');
    assert.equal(await roundTrip(socket, 'x', 300), 'timeout', 'nothing crosses');

    // Dropped bytes stay lost; the connection itself survives.
    proxy.setMode('delay', { delayMs: 250 });
    const startedMs = performance.now();
    assert.equal(await roundTrip(socket, 'c', 3_000), 'c');
    assert.ok(performance.now() - startedMs >= 450, 'delayed both ways');

    proxy.setMode('reset');
    const outcome = await roundTrip(socket, 'd', 2_000);
    assert.ok(outcome === 'error' || outcome === 'closed', `reset ends the connection (${outcome})`);
    const fresh = await connect(proxy.address).then(
      (s) => roundTrip(s, 'e', 2_000),
      () => 'error',
    );
    assert.ok(fresh === 'error' || fresh === 'closed', `new connections are reset (${fresh})`);

    proxy.setMode('pass');
    assert.equal(await roundTrip(await connect(proxy.address), 'f', 2_000), 'f');
  });
});
