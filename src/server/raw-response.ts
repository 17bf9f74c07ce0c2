import type { Duplex } from 'node:stream';

/**
 * How long a socket a server has ended (its last bytes queued, then FIN) may stay open waiting for
 * the peer to close its side, before it is destroyed: ample for a peer to read a response and close;
 * a peer that keeps a half-closed connection open gets nothing from holding it.
 */
export const CLOSE_GRACE_MS = 1_000;

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  413: 'Content Too Large',
  417: 'Expectation Failed',
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  501: 'Not Implemented',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
  505: 'HTTP Version Not Supported',
};

export interface RawResponse {
  status: number;
  /** Lower-case names; `content-type`, `content-length`, `cache-control` and `connection` are set here. */
  headers?: Record<string, string>;
  contentType: string;
  body: string;
}

/**
 * A whole HTTP/1.1 response on a socket no `ServerResponse` writes to (one Node handed over for an
 * upgrade or CONNECT, or gave up parsing: see `http-client-error.ts`), `Cache-Control: no-store`,
 * `Connection: close`; ends the socket, and destroys it `CLOSE_GRACE_MS` after if the peer keeps
 * its side open.
 */
export function writeRawResponse(socket: Duplex, response: RawResponse): void {
  let head = `HTTP/1.1 ${response.status} ${STATUS_TEXT[response.status] ?? 'Error'}\r\n`;
  for (const [name, value] of Object.entries(response.headers ?? {})) head += `${name}: ${value}\r\n`;
  head += `content-type: ${response.contentType}\r\ncontent-length: ${Buffer.byteLength(response.body)}\r\n`;
  head += 'cache-control: no-store\r\n';
  head += 'connection: close\r\n\r\n';
  socket.end(head + response.body);
  setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
}
