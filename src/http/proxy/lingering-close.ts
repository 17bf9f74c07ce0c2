import type { IncomingMessage } from 'node:http';

/**
 * How long the rest of an unread request body is read and dropped after a connection's last
 * response, at most (nginx's `lingering_time`); each pause is bounded by `server.bodyTimeoutMs`.
 */
const LINGER_MS = 30_000;

/**
 * nginx's lingering close, for a connection whose last response goes out before its request body
 * was read (the upstream answered early, or failed): Node would close the socket as soon as the
 * response is written, and the kernel answers the client's next bytes with a reset, which may
 * reach the client before it has read the response and destroy it; while the body is left unread
 * without a close, the connection stalls for ever (`req` was being read, so Node never discards
 * the rest itself). Instead, once the response is out, the socket is ended (FIN) and the rest of
 * the body is read and dropped until it ends, pauses `idleTimeoutMs` (0: no pause bound), or
 * `LINGER_MS` passes; then the socket is destroyed.
 */
export function lingeringClose(req: IncomingMessage, idleTimeoutMs: number): void {
  const socket = req.socket;
  const closeNow = socket.destroySoon;
  // Node's server calls `destroySoon` once the response marked `Connection: close` is written.
  socket.destroySoon = () => {
    if (req.complete || socket.destroyed) {
      closeNow.call(socket);
      return;
    }
    socket.end();
    const stop = () => {
      clearTimeout(total);
      clearTimeout(idle);
      socket.destroy();
    };
    const total = setTimeout(stop, LINGER_MS);
    const idle = idleTimeoutMs > 0 ? setTimeout(stop, Math.min(idleTimeoutMs, LINGER_MS)) : undefined;
    // Read in paused mode, beside the body iterator undici may not have returned yet (its
    // `readable` listener would keep `resume()` from switching to flowing).
    const drop = () => {
      while (req.read() !== null) idle?.refresh();
    };
    req.on('readable', drop);
    req.once('end', stop);
    socket.once('close', stop);
    drop();
  };
}
