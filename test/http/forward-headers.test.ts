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

  it('writes an IPv4-mapped peer as IPv4 and an IPv6 peer without its zone id', () => {
    assert.equal(
      upstreamRequestHeaders({ forwarded: 'x' }, facts('::ffff:203.0.113.7')).forwarded,
      'for=203.0.113.7;proto=http',
    );
    assert.equal(
      upstreamRequestHeaders({ forwarded: 'x' }, facts('fe80::fc:ff:fe00:1%eth0')).forwarded,
      'for="[fe80::fc:ff:fe00:1]";proto=http',
    );
  });

  it("drops an untrusted peer's every client-address field, and keeps a trusted one's", () => {
    const claims = {
      'x-real-ip': '6.6.6.6',
      'true-client-ip': '6.6.6.6',
      'x-client-ip': '6.6.6.6',
      'client-ip': '6.6.6.6',
      'cf-connecting-ip': '6.6.6.6',
      'fastly-client-ip': '6.6.6.6',
      'x-cluster-client-ip': '6.6.6.6',
      'x-forwarded': 'for=6.6.6.6',
      'forwarded-for': '6.6.6.6',
      'x-original-forwarded-for': '6.6.6.6',
      'x-forwarded-port': '443',
    };
    const untrusted = upstreamRequestHeaders({ ...claims, 'x-other': '1' }, facts('203.0.113.7'));
    for (const name of Object.keys(claims)) assert.equal(untrusted[name], undefined, name);
    assert.equal(untrusted['x-other'], '1');
    const trusted = upstreamRequestHeaders(claims, facts('10.0.0.1', true));
    for (const [name, value] of Object.entries(claims)) assert.equal(trusted[name], value, name);
  });

  it('treats a Forwarded named in Connection as hop-by-hop: dropped, nothing added', () => {
    const out = upstreamRequestHeaders(
      { connection: 'forwarded', forwarded: 'for=1.2.3.4' },
      facts('::1', true),
    );
    assert.equal(out.forwarded, undefined);
  });
});
