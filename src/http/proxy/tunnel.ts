import type { Duplex } from 'node:stream';
import { CLOSE_GRACE_MS } from '../../server/raw-response.js';

/** An upgraded client connection piped both ways to its upstream connection. */
export interface Tunnel {
  /** Cut both sides now. */
  destroy(): void;
}

/**
 * Pipes an upgraded client connection and its upstream connection both ways, as one tunnel that is
 * never half-open: when either side ends or closes, both are ended (what is queued is flushed,
 * then FIN) and destroyed once closed, or `CLOSE_GRACE_MS` later if a peer keeps its side open.
 * An error on either side destroys both at once. No bytes either way for `idleTimeoutMs` (0:
 * never) ends both. `onClosed` runs once, when both sides are closed.
 */
export function joinTunnel(
  client: Duplex,
  upstream: Duplex,
  idleTimeoutMs: number,
  onClosed: () => void,
): Tunnel {
  let closing = false;
  let open = 2;
  let grace: NodeJS.Timeout | undefined;
  const destroy = () => {
    client.destroy();
    upstream.destroy();
  };
  const idle = idleTimeoutMs > 0 ? setTimeout(() => end(), idleTimeoutMs) : undefined;
  const end = () => {
    if (closing) return;
    closing = true;
    clearTimeout(idle);
    // Bytes arriving from now on are read and dropped rather than written to a side being ended,
    // so each side still reads to its peer's FIN and closes without waiting out the grace.
    upstream.unpipe(client);
    client.unpipe(upstream);
    client.resume();
    upstream.resume();
    client.end();
    upstream.end();
    grace = setTimeout(destroy, CLOSE_GRACE_MS);
  };
  const closed = () => {
    end();
    if (--open > 0) return;
    clearTimeout(grace);
    onClosed();
  };
  if (idle !== undefined) {
    const active = () => {
      if (!closing) idle.refresh();
    };
    client.on('data', active);
    upstream.on('data', active);
  }
  client.on('end', end);
  upstream.on('end', end);
  client.on('error', destroy);
  upstream.on('error', destroy);
  for (const side of [client, upstream]) {
    // A side that closed before it was joined emits no more 'close'.
    if (side.closed) process.nextTick(closed);
    else side.once('close', closed);
  }
  upstream.pipe(client);
  client.pipe(upstream);
  // A side that ended or closed before it was joined emits no more 'end': end the tunnel now.
  if (client.readableEnded || upstream.readableEnded || client.destroyed || upstream.destroyed) end();
  return { destroy };
}
