import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * Test helper: a TCP proxy on loopback that sits between two tiers and injects network faults,
 * switchable at runtime without restarting either side.
 *
 * - `pass`: bytes flow both ways untouched.
 * - `blackhole`: a partition as TCP sees it: connections stay open (no RST, no FIN) and nothing
 *   crosses either way; callers only learn from their own deadlines. Bytes are held, not lost
 *   (reading pauses, as TCP keeps retransmitting), and flow again when the mode changes: a
 *   partition that heals. New connections are accepted and held too.
 * - `drop`: like `blackhole`, but the bytes are discarded for good (a middlebox eating traffic):
 *   protocol state on both ends is lost, so only the endpoints' own liveness checks recover.
 * - `delay`: every chunk is forwarded after `delayMs` in each direction (order kept).
 * - `reset`: every open connection is destroyed (RST) and new ones are reset on accept.
 */
export type FaultMode = 'pass' | 'blackhole' | 'drop' | 'delay' | 'reset';

export interface FaultProxy {
  /** `127.0.0.1:<port>` to give the client side. */
  readonly address: string;
  readonly port: number;
  readonly mode: FaultMode;
  /** Switch mode; `delayMs` applies to `delay`. Switching to `reset` resets every open connection. */
  setMode(mode: FaultMode, options?: { delayMs?: number }): void;
  /** Point the proxy at another upstream (a restarted process on a new port). */
  setTarget(target: string): void;
  /** Connections accepted so far, and currently open. */
  readonly accepted: number;
  readonly open: number;
  close(): Promise<void>;
}

interface Pair {
  client: Socket;
  upstream: Socket;
}

export async function startFaultProxy(
  target: string,
  { mode = 'pass' as FaultMode, delayMs = 0, port = 0 } = {},
): Promise<FaultProxy> {
  let upstreamTarget = parseTarget(target);
  let currentMode: FaultMode = mode;
  let currentDelayMs = delayMs;
  let accepted = 0;
  const pairs = new Set<Pair>();

  const forward = (from: Socket, to: Socket) => {
    from.on('data', (chunk: Buffer) => {
      if (currentMode === 'drop' || currentMode === 'reset') return;
      if (currentMode === 'delay' && currentDelayMs > 0) {
        setTimeout(() => {
          if (!to.destroyed) to.write(chunk);
        }, currentDelayMs);
        return;
      }
      if (!to.destroyed) to.write(chunk);
    });
  };

  const server: Server = createServer({ noDelay: true }, (client) => {
    accepted++;
    if (currentMode === 'reset') {
      client.resetAndDestroy();
      return;
    }
    const upstream = createConnection({ ...upstreamTarget, noDelay: true });
    const pair: Pair = { client, upstream };
    pairs.add(pair);
    forward(client, upstream);
    forward(upstream, client);
    if (currentMode === 'blackhole') {
      client.pause();
      upstream.pause();
    }
    const end = () => {
      pairs.delete(pair);
      if (!client.destroyed) client.destroy();
      if (!upstream.destroyed) upstream.destroy();
    };
    // A closed side closes the other, unless partitioned: a partition hides even the FIN (the
    // half-dead pair is kept until a reset or close() ends it).
    const closeOther = () => {
      if (currentMode !== 'blackhole' && currentMode !== 'drop') end();
    };
    client.on('close', closeOther);
    upstream.on('close', closeOther);
    client.on('error', () => {});
    upstream.on('error', () => {});
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  const boundPort = typeof address === 'object' && address ? address.port : 0;

  return {
    address: `127.0.0.1:${boundPort}`,
    port: boundPort,
    get mode() {
      return currentMode;
    },
    get accepted() {
      return accepted;
    },
    get open() {
      return pairs.size;
    },
    setMode(next: FaultMode, options: { delayMs?: number } = {}) {
      currentMode = next;
      if (options.delayMs !== undefined) currentDelayMs = options.delayMs;
      for (const pair of pairs) {
        if (next === 'blackhole') {
          pair.client.pause();
          pair.upstream.pause();
        } else {
          pair.client.resume();
          pair.upstream.resume();
        }
      }
      if (next === 'reset') {
        for (const pair of pairs) {
          pair.client.resetAndDestroy();
          pair.upstream.resetAndDestroy();
        }
        pairs.clear();
      }
    },
    setTarget(next: string) {
      upstreamTarget = parseTarget(next);
    },
    close() {
      for (const pair of pairs) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      pairs.clear();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function parseTarget(target: string): { host: string; port: number } {
  const at = target.lastIndexOf(':');
  const host = target.slice(0, at).replace(/^\[|\]$/g, '') || '127.0.0.1';
  return { host, port: Number(target.slice(at + 1)) };
}
