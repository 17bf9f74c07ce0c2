import type { IncomingHttpHeaders } from 'node:http';

/**
 * Hop-by-hop fields (RFC 9110 §7.6.1) describe one connection, not the message: a proxy consumes
 * them and never forwards them, and also drops every field the Connection header names.
 * `proxy-connection` is the non-standard cousin some clients still send.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/**
 * Fields named by `Connection` (lower case), e.g. `Connection: close, X-Internal` → `x-internal`;
 * undefined when there is no `Connection` field (most requests and responses on keep-alive).
 */
function connectionNamed(
  headers: IncomingHttpHeaders | Record<string, string | string[] | undefined>,
): Set<string> | undefined {
  const value = headers.connection;
  if (value === undefined) return undefined;
  const named = new Set<string>();
  for (const token of (Array.isArray(value) ? value.join(',') : value).split(',')) {
    const name = token.trim().toLowerCase();
    if (name !== '') named.add(name);
  }
  return named;
}

export function isHopByHop(name: string): boolean {
  return HOP_BY_HOP.has(name);
}

export interface ForwardingFacts {
  /** The socket peer, as Node reports it. */
  peerAddress: string | undefined;
  /** Whether the peer is a trusted proxy (its X-Forwarded-* are kept and extended). */
  peerTrusted: boolean;
  /** `http` or `https`: how the client reached this proxy. */
  protocol: string;
  preserveHost: boolean;
}

/**
 * The request fields sent upstream: hop-by-hop fields removed, `Expect` removed (this proxy
 * already answered `100-continue` to the client; undici rejects the field), and X-Forwarded-For /
 * -Proto / -Host set. An untrusted peer's X-Forwarded-* are replaced, not extended, so a client
 * cannot plant a chain the upstream might believe. `Host` is the upstream's unless `preserveHost`.
 */
export function upstreamRequestHeaders(
  headers: IncomingHttpHeaders,
  facts: ForwardingFacts,
): Record<string, string | string[]> {
  const named = connectionNamed(headers);
  const out: Record<string, string | string[]> = {};
  // Own fields only (never anything inherited), without an [name, value] array per field.
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (value === undefined || HOP_BY_HOP.has(name) || named?.has(name)) continue;
    if (name === 'expect' || name === 'host') continue;
    if (name === 'x-forwarded-for' || name === 'x-forwarded-proto' || name === 'x-forwarded-host') continue;
    out[name] = value;
  }
  if (facts.preserveHost && headers.host !== undefined) out.host = headers.host;
  const peer = facts.peerAddress ?? 'unknown';
  const priorFor = facts.peerTrusted ? joinValues(headers['x-forwarded-for']) : undefined;
  out['x-forwarded-for'] = priorFor ? `${priorFor}, ${peer}` : peer;
  const priorProto = facts.peerTrusted ? joinValues(headers['x-forwarded-proto']) : undefined;
  out['x-forwarded-proto'] = priorProto ?? facts.protocol;
  const priorHost = facts.peerTrusted ? joinValues(headers['x-forwarded-host']) : undefined;
  const host = priorHost ?? headers.host;
  if (host !== undefined) out['x-forwarded-host'] = host;
  return out;
}

/** Response fields from the upstream minus hop-by-hop ones (Node frames the body to the client itself). */
export function clientResponseHeaders(
  headers: Record<string, string | string[] | undefined>,
): Record<string, string | string[]> {
  const named = connectionNamed(headers);
  const out: Record<string, string | string[]> = {};
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (value === undefined || HOP_BY_HOP.has(name) || named?.has(name)) continue;
    out[name] = value;
  }
  return out;
}

function joinValues(value: string | string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  const text = Array.isArray(value) ? value.join(', ') : value;
  return text.trim() === '' ? undefined : text;
}
