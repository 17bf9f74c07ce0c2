import { BlockList, isIP } from 'node:net';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKnownOptions, optionNames } from '../core/validate.js';

/**
 * Which client a request comes from, as a rate limiting key, without the usual traps:
 *
 * - **Spoofed X-Forwarded-For.** Any client can send the header. It is read only when the socket
 *   peer is a trusted proxy, and then walked right to left (each proxy appends the address it saw),
 *   skipping trusted hops; the first untrusted address is the client. A client cannot choose its
 *   key by prepending addresses, because those sit left of the first untrusted hop.
 * - **Padded X-Forwarded-For.** Prepending hundreds of members changes nothing either: the walk
 *   never looks left of the first untrusted hop, and at most the 32 rightmost members are read
 *   (found by scanning back from the end, so a huge header costs no more than a short one). A
 *   chain of 32 trusted hops ends the walk: the 32nd member from the right is the client.
 * - **IPv6 rotation.** One IPv6 subscriber usually holds a whole /64 (often a /56 or /48) and can
 *   use a fresh address per request; keying on the full address gives every request its own
 *   bucket. Addresses are grouped by prefix, /64 by default.
 * - **IPv4-mapped IPv6** (`::ffff:203.0.113.7`, what a dual-stack socket reports for IPv4 peers)
 *   is the IPv4 address, so the same client gets the same key on either stack.
 * - **Garbage headers.** A malformed member (`unknown`, an obfuscated identifier, junk, a member
 *   over 128 characters) reached by the walk ends it: the client is the last address read, i.e.
 *   the trusted hop right of the malformed member, or the peer when that member is the rightmost.
 *   Only a trusted proxy writes members right of the client, so a client cannot choose its key
 *   this way; it gets one of your proxies' addresses. The resolver never throws on request input.
 */
export interface ClientAddressOptions {
  /**
   * Proxies whose X-Forwarded-For is believed: CIDRs (`10.0.0.0/8`, `2001:db8::/32`), single
   * addresses, or the names `loopback`, `private` (RFC 1918 and fc00::/7) and `linklocal`.
   * Default none: X-Forwarded-For is ignored and the socket peer is the client.
   */
  trustedProxies?: string[];
  /** Group IPv6 clients by this prefix length. Default 64; 128 keys each address. */
  ipv6PrefixLength?: number;
  /** Group IPv4 clients by this prefix length. Default 32 (each address). */
  ipv4PrefixLength?: number;
}

/**
 * `(peerAddress, forwardedFor) => key`: `peerAddress` is `socket.remoteAddress`, `forwardedFor`
 * the raw `x-forwarded-for` header value(s). The key is `203.0.113.7`, `203.0.113.0/24` or
 * `2001:db8:1:2::/64`, or `unknown` when the peer address itself is missing or not an IP (a Unix
 * socket, a destroyed socket).
 */
export type ClientAddressResolver = (
  peerAddress: string,
  forwardedFor: string | string[] | undefined,
) => string;

export const DEFAULT_IPV6_PREFIX_LENGTH = 64;
export const DEFAULT_IPV4_PREFIX_LENGTH = 32;
/** The key for a peer with no usable address. */
export const UNKNOWN_CLIENT_ADDRESS = 'unknown';
/**
 * X-Forwarded-For members read at most, from the right. A real chain reaches its first untrusted
 * address within a few hops; the cap bounds the work of a padded header. Reaching it does not make
 * the header malformed: the last member read is the client.
 */
const MAX_FORWARDED_HOPS = 32;
/**
 * Longest X-Forwarded-For member read, spaces included: a 64-character address (parseAddress's
 * limit) in brackets with a port, plus room for whitespace. Longer is malformed, and is found
 * without scanning further back than this.
 */
const MAX_MEMBER_LENGTH = 128;
const COMMA = 0x2c;

const NAMED_RANGES: Record<string, string[]> = {
  loopback: ['127.0.0.0/8', '::1/128'],
  private: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', 'fc00::/7'],
  linklocal: ['169.254.0.0/16', 'fe80::/10'],
};

interface ParsedAddress {
  family: 4 | 6;
  /** 4 or 16 bytes. */
  bytes: number[];
  /** Canonical text: dotted quad, or RFC 5952 IPv6. */
  text: string;
}

const CLIENT_ADDRESS_OPTIONS = optionNames<ClientAddressOptions>({
  trustedProxies: true,
  ipv6PrefixLength: true,
  ipv4PrefixLength: true,
});

export function createClientAddressResolver(options: ClientAddressOptions = {}): ClientAddressResolver {
  assertKnownOptions(options, CLIENT_ADDRESS_OPTIONS, 'createClientAddressResolver');
  const ipv6PrefixLength = prefixOption(
    'ipv6PrefixLength',
    options.ipv6PrefixLength,
    DEFAULT_IPV6_PREFIX_LENGTH,
    128,
  );
  const ipv4PrefixLength = prefixOption(
    'ipv4PrefixLength',
    options.ipv4PrefixLength,
    DEFAULT_IPV4_PREFIX_LENGTH,
    32,
  );
  const trusted = options.trustedProxies ?? [];
  if (!Array.isArray(trusted)) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'trustedProxies must be an array of CIDRs', {
      field: 'trustedProxies',
    });
  }
  const blockList = trustedBlockList(trusted);
  const anyTrusted = trusted.length > 0;

  const isTrusted = (address: ParsedAddress): boolean =>
    blockList.check(address.text, address.family === 4 ? 'ipv4' : 'ipv6');

  const keyOf = (address: ParsedAddress): string =>
    address.family === 4 ? prefixKey(address, ipv4PrefixLength) : prefixKey(address, ipv6PrefixLength);

  return (peerAddress, forwardedFor) => {
    const peer = parseAddress(peerAddress);
    if (peer === undefined) return UNKNOWN_CLIENT_ADDRESS;
    if (!anyTrusted || forwardedFor === undefined || !isTrusted(peer)) return keyOf(peer);
    return keyOf(forwardedClient(forwardedFor, peer, isTrusted));
  };
}

/**
 * `(address) => boolean`: whether a socket peer is one of `trustedProxies` (same syntax as
 * `ClientAddressOptions.trustedProxies`). For code that must also decide whether to keep a peer's
 * X-Forwarded-* fields, such as a proxy extending the chain. Never throws on the address.
 */
export function createTrustedProxyMatcher(trustedProxies: string[] = []): (address: string) => boolean {
  if (!Array.isArray(trustedProxies)) {
    throw new SpillwayError(ErrorCode.InvalidOption, 'trustedProxies must be an array of CIDRs', {
      field: 'trustedProxies',
    });
  }
  if (trustedProxies.length === 0) return () => false;
  const blockList = trustedBlockList(trustedProxies);
  return (address) => {
    const parsed = parseAddress(address);
    return parsed !== undefined && blockList.check(parsed.text, parsed.family === 4 ? 'ipv4' : 'ipv6');
  };
}

function trustedBlockList(trusted: readonly unknown[]): BlockList {
  const blockList = new BlockList();
  for (const entry of trusted) addTrusted(blockList, entry);
  return blockList;
}

function prefixOption(field: string, value: number | undefined, fallback: number, max: number): number {
  const prefix = value ?? fallback;
  if (typeof prefix !== 'number' || !Number.isInteger(prefix) || prefix < 0 || prefix > max) {
    throw new SpillwayError(ErrorCode.InvalidOption, `${field} must be an integer in [0, ${max}]`, { field });
  }
  return prefix;
}

function addTrusted(blockList: BlockList, entry: unknown): void {
  const invalid = () =>
    new SpillwayError(
      ErrorCode.InvalidOption,
      `trustedProxies: ${JSON.stringify(entry)} is not a CIDR, an IP address or one of ${Object.keys(NAMED_RANGES).join(', ')}`,
      { field: 'trustedProxies', value: entry },
    );
  if (typeof entry !== 'string') throw invalid();
  const named = NAMED_RANGES[entry];
  if (named !== undefined) {
    for (const range of named) addTrusted(blockList, range);
    return;
  }
  const slash = entry.indexOf('/');
  const address = parseAddress(slash === -1 ? entry : entry.slice(0, slash));
  if (address === undefined) throw invalid();
  const max = address.family === 4 ? 32 : 128;
  let prefix = max;
  if (slash !== -1) {
    const text = entry.slice(slash + 1);
    if (!/^\d{1,3}$/.test(text)) throw invalid();
    prefix = Number(text);
    // `::ffff:10.0.0.0/104` names IPv4 space: parseAddress unmapped it, so shift the prefix too.
    if (address.family === 4 && isIP(entry.slice(0, slash)) === 6) prefix -= 96;
    if (prefix < 0 || prefix > max) throw invalid();
  }
  blockList.addSubnet(address.text, prefix, address.family === 4 ? 'ipv4' : 'ipv6');
}

/**
 * The client named by the X-Forwarded-For value(s) a trusted `peer` sent: walking members from the
 * right (later header lines first), the first untrusted address; or the last address read when the
 * walk ends early, at a malformed member or after MAX_FORWARDED_HOPS members. Members are found by
 * scanning back from the end, so nothing left of the last member read is ever looked at.
 */
function forwardedClient(
  forwardedFor: string | string[],
  peer: ParsedAddress,
  isTrusted: (address: ParsedAddress) => boolean,
): ParsedAddress {
  let client = peer;
  let read = 0;
  const lines = typeof forwardedFor === 'string' ? 1 : forwardedFor.length;
  for (let line = lines - 1; line >= 0; line--) {
    const value = typeof forwardedFor === 'string' ? forwardedFor : forwardedFor[line];
    if (typeof value !== 'string') return client;
    let end = value.length;
    for (;;) {
      const start = memberStart(value, end);
      if (start === -1) return client;
      const hop = parseForwardedMember(value.slice(start, end));
      if (hop === undefined) return client;
      client = hop;
      read++;
      if (!isTrusted(hop) || read === MAX_FORWARDED_HOPS) return client;
      if (start === 0) break;
      end = start - 1;
    }
  }
  return client;
}

/**
 * Start of the member of `value` that ends at `end` (just after the comma before it, or 0), or -1
 * when it is longer than MAX_MEMBER_LENGTH. Reads at most MAX_MEMBER_LENGTH + 1 characters.
 */
function memberStart(value: string, end: number): number {
  const stop = Math.max(0, end - MAX_MEMBER_LENGTH - 1);
  for (let i = end - 1; i >= stop; i--) {
    if (value.charCodeAt(i) === COMMA) return i + 1;
  }
  return end <= MAX_MEMBER_LENGTH ? 0 : -1;
}

/** One X-Forwarded-For member: an address, tolerating `1.2.3.4:port` and `[v6]:port` forms. */
function parseForwardedMember(member: string): ParsedAddress | undefined {
  let text = member.trim();
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    if (close === -1) return undefined;
    const rest = text.slice(close + 1);
    if (rest !== '' && !/^:\d{1,5}$/.test(rest)) return undefined;
    text = text.slice(1, close);
  } else {
    const colon = text.indexOf(':');
    if (colon !== -1 && colon === text.lastIndexOf(':') && /^:\d{1,5}$/.test(text.slice(colon))) {
      text = text.slice(0, colon);
    }
  }
  return parseAddress(text);
}

/** Parses an IP address (IPv6 zone ids dropped, IPv4-mapped unmapped); undefined when it is not one. */
function parseAddress(input: unknown): ParsedAddress | undefined {
  if (typeof input !== 'string' || input.length === 0 || input.length > 64) return undefined;
  let text = input;
  const zone = text.indexOf('%');
  if (zone !== -1) text = text.slice(0, zone);
  const family = isIP(text);
  if (family === 4) {
    const bytes = text.split('.').map(Number);
    return { family: 4, bytes, text: bytes.join('.') };
  }
  if (family !== 6) return undefined;
  const bytes = ipv6Bytes(text);
  if (isIpv4Mapped(bytes)) {
    const v4 = bytes.slice(12);
    return { family: 4, bytes: v4, text: v4.join('.') };
  }
  return { family: 6, bytes, text: formatIpv6(bytes) };
}

function isIpv4Mapped(bytes: number[]): boolean {
  for (let i = 0; i < 10; i++) if (bytes[i] !== 0) return false;
  return bytes[10] === 0xff && bytes[11] === 0xff;
}

/** 16 bytes of an address `net.isIP` already accepted as IPv6. */
function ipv6Bytes(text: string): number[] {
  let head = text;
  const tail: number[] = [];
  const lastColon = text.lastIndexOf(':');
  if (text.indexOf('.', lastColon) !== -1) {
    // Embedded dotted quad in the last 32 bits.
    const quad = text
      .slice(lastColon + 1)
      .split('.')
      .map(Number);
    tail.push(quad[0]!, quad[1]!, quad[2]!, quad[3]!);
    head = text.slice(0, lastColon + 1);
    if (head.endsWith(':') && !head.endsWith('::')) head = head.slice(0, -1);
  }
  const groups = (part: string): number[] =>
    part === '' ? [] : part.split(':').map((g) => Number.parseInt(g, 16));
  const gap = head.indexOf('::');
  let hextets: number[];
  const total = 8 - tail.length / 2;
  if (gap === -1) {
    hextets = groups(head);
  } else {
    const left = groups(head.slice(0, gap));
    const right = groups(head.slice(gap + 2));
    hextets = [...left, ...new Array<number>(total - left.length - right.length).fill(0), ...right];
  }
  const bytes: number[] = [];
  for (const hextet of hextets) bytes.push(hextet >> 8, hextet & 0xff);
  bytes.push(...tail);
  return bytes;
}

/** RFC 5952: lower case, no leading zeros, the longest run (2+) of zero groups as `::` (leftmost on ties). */
function formatIpv6(bytes: number[]): string {
  const hextets: number[] = [];
  for (let i = 0; i < 16; i += 2) hextets.push((bytes[i]! << 8) | bytes[i + 1]!);
  let bestStart = -1;
  let bestLength = 1;
  for (let i = 0; i < 8; ) {
    if (hextets[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && hextets[j] === 0) j++;
    if (j - i > bestLength) {
      bestStart = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = (list: number[]) => list.map((h) => h.toString(16)).join(':');
  if (bestStart === -1) return hex(hextets);
  return `${hex(hextets.slice(0, bestStart))}::${hex(hextets.slice(bestStart + bestLength))}`;
}

function prefixKey(address: ParsedAddress, prefixLength: number): string {
  const max = address.family === 4 ? 32 : 128;
  if (prefixLength >= max) return address.text;
  const masked = address.bytes.map((byte, index) => {
    const bitsLeft = prefixLength - index * 8;
    if (bitsLeft >= 8) return byte;
    if (bitsLeft <= 0) return 0;
    return byte & (0xff << (8 - bitsLeft)) & 0xff;
  });
  const text = address.family === 4 ? masked.join('.') : formatIpv6(masked);
  return `${text}/${prefixLength}`;
}
