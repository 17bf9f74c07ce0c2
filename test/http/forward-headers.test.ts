import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { upstreamRequestHeaders } from '../../src/http/proxy/forward-headers.js';

const facts = (peerAddress: string | undefined, peerTrusted = false) => ({
  peerAddress,
  peerTrusted,
  protocol: 'http',
  preserveHost: false,
});

describe('upstream request headers: Forwarded (RFC 7239)', () => {
  it('writes an IPv6 peer bracketed and quoted, a missing one as unknown, a host with a port quoted', () => {
    const headers = { host: 'shop.example:8080', forwarded: 'for=6.6.6.6' };
    assert.equal(
      upstreamRequestHeaders(headers, facts('2001:db8::5')).forwarded,
      'for="[2001:db8::5]";proto=http;host="shop.example:8080"',
    );
    assert.equal(
      upstreamRequestHeaders({ forwarded: 'for=6.6.6.6' }, facts(undefined)).forwarded,
      'for=unknown;proto=http',
    );
    assert.equal(
      upstreamRequestHeaders({ host: 'shop.example', forwarded: 'x' }, facts('203.0.113.7')).forwarded,
      'for=203.0.113.7;proto=http;host=shop.example',
    );
    assert.equal(
      upstreamRequestHeaders({ host: 'a"b\\c', forwarded: 'x' }, facts('203.0.113.7')).forwarded,
      'for=203.0.113.7;proto=http;host="a\\"b\\\\c"',
      'a quoted-string escapes " and \\',
    );
  });

  it('treats a Forwarded named in Connection as hop-by-hop: dropped, nothing added', () => {
    const out = upstreamRequestHeaders(
      { connection: 'forwarded', forwarded: 'for=1.2.3.4' },
      facts('::1', true),
    );
    assert.equal(out.forwarded, undefined);
  });
});
