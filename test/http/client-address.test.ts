import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createClientAddressResolver } from '../../src/http/client-address.js';

describe('client address resolver', () => {
  it('without trusted proxies the socket peer is the client, whatever X-Forwarded-For says', () => {
    const resolve = createClientAddressResolver();
    assert.equal(resolve('203.0.113.7', '198.51.100.1'), '203.0.113.7');
    assert.equal(resolve('203.0.113.7', undefined), '203.0.113.7');
  });

  it('ignores a spoofed X-Forwarded-For from an untrusted peer', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    assert.equal(resolve('203.0.113.7', '198.51.100.1, 10.0.0.2'), '203.0.113.7');
  });

  it('walks right to left past trusted hops to the first untrusted address', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8', '192.168.1.5'] });
    // The client prepended a fake address; the real client is the one the first proxy appended.
    assert.equal(resolve('10.0.0.1', '1.1.1.1, 203.0.113.7, 192.168.1.5, 10.0.0.9'), '203.0.113.7');
    assert.equal(resolve('10.0.0.1', ['1.1.1.1, 203.0.113.7', '10.0.0.9']), '203.0.113.7');
    assert.equal(resolve('10.0.0.1', '203.0.113.8'), '203.0.113.8');
  });

  it('uses the leftmost address when every hop is trusted', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    assert.equal(resolve('10.0.0.1', '10.1.1.1, 10.2.2.2'), '10.1.1.1');
  });

  it('a malformed rightmost member makes the peer the client, never throwing', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    for (const header of [
      'garbage',
      '203.0.113.7, unknown',
      '',
      ' , ',
      '999.1.1.1',
      '203.0.113.7,,',
      '_hidden',
      '[::1',
      '1.2.3.4:99999999',
      'x'.repeat(10_000),
      `203.0.113.7, ${' '.repeat(200)}10.0.0.3`,
      ['203.0.113.7', '\u0000'],
    ]) {
      assert.equal(resolve('10.0.0.1', header), '10.0.0.1', JSON.stringify(header).slice(0, 60));
    }
  });

  it('a malformed member further left ends the walk at the trusted hop right of it', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    // 10.0.0.9 (trusted) appended `unknown`: who was before it cannot be known, and whatever the
    // client wrote further left is never read.
    assert.equal(resolve('10.0.0.1', '203.0.113.7, unknown, 10.0.0.9'), '10.0.0.9');
    assert.equal(resolve('10.0.0.1', '6.6.6.6, garbage, 10.0.0.8, 10.0.0.9'), '10.0.0.8');
    assert.equal(resolve('10.0.0.1', ['6.6.6.6', '_hidden', '10.0.0.9']), '10.0.0.9');
    // A client's own junk sits left of the address its first proxy appended, and is never read.
    assert.equal(resolve('10.0.0.1', 'garbage, 203.0.113.7, 10.0.0.9'), '203.0.113.7');
  });

  it('a client padding X-Forwarded-For with any number of members keeps its own key', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['loopback'] });
    for (const members of [31, 32, 33, 100, 10_000]) {
      const padding = Array.from({ length: members }, (_, i) => `10.9.${(i >> 8) & 255}.${i & 255}`);
      // The client sent the padding; the trusted balancer appended the address it saw.
      assert.equal(resolve('127.0.0.1', `${padding.join(', ')}, 203.0.113.7`), '203.0.113.7', `${members}`);
      assert.equal(resolve('127.0.0.1', [padding.join(','), '203.0.113.7']), '203.0.113.7', `${members}`);
    }
  });

  it('a long chain of trusted hops: the client is the first untrusted one within 32, else the 32nd from the right', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    const hops = (count: number) => Array.from({ length: count }, (_, i) => `10.0.${i >> 8}.${i & 255}`);
    // 30 trusted hops behind the client: it is found.
    assert.equal(resolve('10.0.0.1', ['203.0.113.7', ...hops(30)].join(', ')), '203.0.113.7');
    // 31 trusted hops: the client is the 32nd member from the right, still read.
    assert.equal(resolve('10.0.0.1', ['203.0.113.7', ...hops(31)].join(', ')), '203.0.113.7');
    // 32 or more: the walk stops at the 32nd member from the right, a trusted hop, never at the peer.
    assert.equal(resolve('10.0.0.1', ['203.0.113.7', ...hops(32)].join(', ')), '10.0.0.0');
    assert.equal(resolve('10.0.0.1', ['203.0.113.7', ...hops(40)].join(', ')), '10.0.0.8');
    assert.equal(resolve('10.0.0.1', hops(100).join(',')), '10.0.0.68');
    assert.equal(resolve('10.0.0.1', hops(5)), '10.0.0.0', 'all trusted, under the cap: the leftmost');
  });

  it('a huge header costs no more than a short one: only its rightmost members are read', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    const padding = '10.0.0.3, '.repeat(1_000_000); // 10 MB
    const cases: [string | string[], string][] = [
      [`${padding}203.0.113.7`, '203.0.113.7'],
      [`${padding}10.0.0.4`, '10.0.0.3'],
      [`${padding}203.0.113.7, 10.0.0.4`, '203.0.113.7'],
      [`203.0.113.7, ${'x'.repeat(10_000_000)}`, '10.0.0.1'],
      [[padding, '203.0.113.7'], '203.0.113.7'],
    ];
    // Splitting 10 MB takes tens of milliseconds and allocates a million strings; 200 calls of
    // that take seconds. Reading 32 members from the end takes microseconds.
    const startedAt = performance.now();
    for (let i = 0; i < 200; i++) {
      for (const [header, key] of cases) assert.equal(resolve('10.0.0.1', header), key);
    }
    const elapsedMs = performance.now() - startedAt;
    assert.ok(elapsedMs < 1_000, `1,000 resolutions of 10 MB headers took ${elapsedMs.toFixed(0)} ms`);
  });

  it('accepts ports and bracketed IPv6 in X-Forwarded-For members', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['loopback'], ipv6PrefixLength: 128 });
    assert.equal(resolve('127.0.0.1', '203.0.113.7:5123'), '203.0.113.7');
    assert.equal(resolve('::1', '[2001:db8::5]:443'), '2001:db8::5');
    assert.equal(resolve('::1', ' 2001:DB8:0:0:0:0:0:5 '), '2001:db8::5');
  });

  it('groups IPv6 clients by /64 by default', () => {
    const resolve = createClientAddressResolver();
    assert.equal(resolve('2001:db8:1:2:aaaa:bbbb:cccc:dddd', undefined), '2001:db8:1:2::/64');
    assert.equal(resolve('2001:db8:1:2::1', undefined), '2001:db8:1:2::/64');
    assert.notEqual(resolve('2001:db8:1:3::1', undefined), '2001:db8:1:2::/64');
    assert.equal(resolve('fe80::1%eth0', undefined), 'fe80::/64');
  });

  it('honours configured prefix lengths', () => {
    const resolve = createClientAddressResolver({ ipv6PrefixLength: 56, ipv4PrefixLength: 24 });
    assert.equal(resolve('2001:db8:1:2ff::1', undefined), '2001:db8:1:200::/56');
    assert.equal(resolve('203.0.113.77', undefined), '203.0.113.0/24');
    const exact = createClientAddressResolver({ ipv6PrefixLength: 128 });
    assert.equal(exact('2001:0db8:0000:0000:0001:0000:0000:0001', undefined), '2001:db8::1:0:0:1');
  });

  it('treats IPv4-mapped IPv6 as IPv4, for the key and for trust', () => {
    const resolve = createClientAddressResolver({ trustedProxies: ['10.0.0.0/8'] });
    assert.equal(resolve('::ffff:203.0.113.7', undefined), '203.0.113.7');
    assert.equal(resolve('::ffff:cb00:7107', undefined), '203.0.113.7');
    assert.equal(resolve('::ffff:10.0.0.1', '198.51.100.4'), '198.51.100.4');
    assert.equal(resolve('10.0.0.1', '::ffff:198.51.100.4'), '198.51.100.4');
  });

  it('returns unknown for a missing or non-IP peer', () => {
    const resolve = createClientAddressResolver();
    assert.equal(resolve('', undefined), 'unknown');
    assert.equal(resolve(undefined as unknown as string, '1.2.3.4'), 'unknown');
    assert.equal(resolve('/tmp/socket', undefined), 'unknown');
  });

  it('rejects invalid options at construction', () => {
    for (const trustedProxies of [['10.0.0.0/33'], ['nonsense'], ['10.0.0.0/x'], [42]]) {
      assert.throws(() => createClientAddressResolver({ trustedProxies: trustedProxies as string[] }), {
        code: 'ERR_SPILLWAY_INVALID_OPTION',
      });
    }
    assert.throws(() => createClientAddressResolver({ ipv6PrefixLength: 129 }), {
      code: 'ERR_SPILLWAY_INVALID_OPTION',
    });
  });

  it('accepts IPv6 and mapped CIDRs as trusted proxies', () => {
    const resolve = createClientAddressResolver({
      trustedProxies: ['2001:db8::/32', '::ffff:172.16.0.0/108'],
    });
    assert.equal(resolve('2001:db8::9', '203.0.113.7'), '203.0.113.7');
    assert.equal(resolve('172.16.3.4', '203.0.113.7'), '203.0.113.7');
    assert.equal(resolve('172.32.0.1', '203.0.113.7'), '172.32.0.1');
  });
});
