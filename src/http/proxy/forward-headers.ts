import type { IncomingHttpHeaders } from 'node:http';

/**
 * Hop-by-hop fields (RFC 9110 §7.6.1) describe one connection, not the message: a proxy consumes
 * them and never forwards them, and also drops every field the Connection header names.
 * `proxy-connection` is the non-standard cousin some clients still send. The proxy
 * authentication fields address the next proxy on the chain, which is this one (RFC 9110 §11.7):
 * a client's credentials for it, or an upstream's challenge and answer to a next hop that is not
 * the client. Other `Proxy-*` fields are end to end (`Proxy-Status`, RFC 9209) and pass.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authentication-info',
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

/**
 * Fields upstreams read as the client's address, written by a proxy or CDN in front of them
 * (nginx `X-Real-IP`, Akamai/Cloudflare `True-Client-IP`, `CF-Connecting-IP`, `Fastly-Client-IP`,
 * ...). From an untrusted peer they are the client's own claims and are dropped, as is every
 * `X-Forwarded-*` field this proxy does not set (`-Port`, `-Ssl`, `-Prefix`, ...). From a trusted
 * peer they are passed on unchanged. `Forwarded` is handled apart: see upstreamRequestHeaders.
 */
const CLIENT_ADDRESS_FIELDS = new Set([
  'x-real-ip',
  'true-client-ip',
  'x-client-ip',
  'client-ip',
  'cf-connecting-ip',
  'fastly-client-ip',
  'x-cluster-client-ip',
  'x-forwarded',
  'forwarded-for',
  'x-original-forwarded-for',
]);

function isProxyClaim(name: string): boolean {
  return name.startsWith('x-forwarded-') || CLIENT_ADDRESS_FIELDS.has(name);
}

/** An RFC 7239 `token`; anything else is sent as a `quoted-string`. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

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
 * -Proto / -Host set. A trusted peer's fields are extended (X-Forwarded-For, `Forwarded`) or kept;
 * an untrusted peer's are replaced, and its other client-address fields (CLIENT_ADDRESS_FIELDS,
 * other X-Forwarded-*) dropped, so a client cannot plant anything an upstream might believe.
 * `Forwarded` (RFC 7239) gets this proxy's element only when the request carries one: added to a
 * field no proxy in front wrote, it would be all an upstream preferring it (Spring) reads, naming
 * the balancer as the client. `Host` is the upstream's unless `preserveHost`.
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
    if (value === undefined || !endToEnd(name, named)) continue;
    if (name === 'expect' || name === 'host' || name === 'forwarded') continue;
    if (name === 'x-forwarded-for' || name === 'x-forwarded-proto' || name === 'x-forwarded-host') continue;
    if (!facts.peerTrusted && isProxyClaim(name)) continue;
    out[name] = value;
  }
  if (facts.preserveHost && headers.host !== undefined) out.host = headers.host;
  if (headers.forwarded !== undefined && !named?.has('forwarded')) {
    const element = forwardedElement(facts, headers.host);
    const prior = facts.peerTrusted ? joinValues(headers.forwarded) : undefined;
    out.forwarded = prior ? `${prior}, ${element}` : element;
  }
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
    if (value !== undefined && endToEnd(name, named)) out[name] = value;
  }
  return out;
}

/**
 * This proxy's RFC 7239 element: `for=203.0.113.7;proto=http;host=example.com`, an IPv6 peer as
 * `for="[2001:db8::1]"`, a missing one as `for=unknown`; `host` is the `Host` received, quoted when
 * it is not a token (`host="example.com:8080"`).
 */
function forwardedElement(facts: ForwardingFacts, host: string | undefined): string {
  const element = `for=${forwardedNode(facts.peerAddress)};proto=${facts.protocol}`;
  if (host === undefined || host === '') return element;
  return `${element};host=${TOKEN.test(host) ? host : `"${host.replace(/["\\]/g, '\\$&')}"`}`;
}

/**
 * A peer as an RFC 7239 node: an IPv4-mapped IPv6 address (what a dual-stack socket reports for an
 * IPv4 peer) as the IPv4 address it is, as the client address resolver keys it; other IPv6
 * bracketed and quoted, without a zone id (`fe80::1%eth0`: the node grammar has no room for one,
 * and the zone names an interface of this host, meaningless upstream).
 */
function forwardedNode(peer: string | undefined): string {
  if (peer === undefined || peer === '') return 'unknown';
  if (!peer.includes(':')) return peer;
  if (peer.startsWith('::ffff:') && peer.includes('.')) return peer.slice(7);
  const zone = peer.indexOf('%');
  return `"[${zone === -1 ? peer : peer.slice(0, zone)}]"`;
}

function joinValues(value: string | string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  const text = Array.isArray(value) ? value.join(', ') : value;
  return text.trim() === '' ? undefined : text;
}

/** A field that goes on to the next hop: not hop-by-hop, and not named by `Connection` (RFC 9110 §7.6.1). */
function endToEnd(name: string, connectionNamed: ReadonlySet<string> | undefined): boolean {
  return !HOP_BY_HOP.has(name) && connectionNamed?.has(name) !== true;
}
