import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { type RawResponse, writeRawResponse } from '../../server/raw-response.js';

/** What the proxy takes and forwards: the standard methods but CONNECT (others are forwarded too). */
export const FORWARDED_METHODS = 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE';

/** Shared, never mutated: most requests match no bucket or carry no RateLimit fields. */
export const NO_HEADERS: Record<string, string> = Object.freeze({}) as Record<string, string>;

/** An answer from the proxy itself: a JSON body, never cached. */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): void {
  const text = `${JSON.stringify(body)}\n`;
  res.writeHead(status, {
    ...headers,
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
  });
  res.end(text);
}

/** What the proxy answers on a socket no `ServerResponse` writes to: a JSON body, as `sendJson`. */
export function sendRawJson(
  socket: Duplex,
  status: number,
  headers: Record<string, string>,
  body: Record<string, unknown>,
): void {
  writeRawResponse(socket, rawJson(status, headers, body));
}

export function rawJson(
  status: number,
  headers: Record<string, string>,
  body: Record<string, unknown>,
): RawResponse {
  return {
    status,
    headers,
    contentType: 'application/json; charset=utf-8',
    body: `${JSON.stringify(body)}\n`,
  };
}

/** The 400 of a request whose key header came on several lines or as a list (`repeatedKeyHeader`). */
export function repeatedHeaderBody(name: string): { error: string; message: string; header: string } {
  return {
    error: 'repeated_key_header',
    message: `the ${name} header is part of a rate limit key and must be sent once, as one value; it came on several lines or as a comma-separated list`,
    header: name,
  };
}

/** The 429 of a request whose client already has `max` request bodies in progress (`ClientUploads`). */
export function tooManyUploadsBody(max: number): {
  error: string;
  message: string;
  retryAfterSeconds: number;
} {
  return {
    error: 'too_many_uploads',
    message: `this client already has ${max} request bodies in progress, the most the proxy takes from one client at a time`,
    retryAfterSeconds: 1,
  };
}

/** The origin-form target to forward, or undefined for `*` and unparsable absolute forms. */
export function requestTarget(req: IncomingMessage): string | undefined {
  const url = req.url;
  if (url === undefined || url === '') return undefined;
  if (url.startsWith('/')) return url;
  try {
    const parsed = new URL(url);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return undefined;
    return `${parsed.pathname}${parsed.search}`;
  } catch {
    return undefined;
  }
}

export function hasBody(req: IncomingMessage): boolean {
  const length = req.headers['content-length'];
  if (length !== undefined) return length !== '0';
  return req.headers['transfer-encoding'] !== undefined;
}
