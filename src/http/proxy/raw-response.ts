import type { Duplex } from 'node:stream';
import { CLOSE_GRACE_MS } from './tunnel.js';

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  413: 'Content Too Large',
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/**
 * A whole HTTP/1.1 response, with a JSON body, on a socket no `ServerResponse` writes to (one Node
 * handed over for an upgrade or CONNECT, or gave up parsing: see `client-error.ts`); closes it,
 * and destroys it `CLOSE_GRACE_MS` after if the peer keeps its side open.
 */
export function writeRawResponse(
  socket: Duplex,
  status: number,
  headers: Record<string, string>,
  body: Record<string, unknown>,
): void {
  const text = `${JSON.stringify(body)}\n`;
  let head = `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}\r\n`;
  for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
  head += `content-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(text)}\r\n`;
  head += 'cache-control: no-store\r\n';
  head += 'connection: close\r\n\r\n';
  socket.end(head + text);
  setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
}
