import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { parse } from 'yaml';
import { mergeRateLimitFields } from '../../src/http/proxy/rate-limit-merge.js';
import { compileKeyTemplate, MAX_KEY_BYTES } from '../../src/http/rules/key-template.js';
import { matchBuckets, type RequestFacts } from '../../src/http/rules/match-buckets.js';
import { loadProxyRules, parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import {
  compilePathPrefix,
  compileRoutePattern,
  DEFAULT_PATH_MATCHING,
  normalizeRequestPath,
  requestPathReadings,
} from '../../src/http/rules/route-pattern.js';

describe('route patterns and path normalization', () => {
  it('matches literals, parameters and a trailing rest', () => {
    const route = compileRoutePattern('/v1/payments/:id');
    assert.deepEqual(route.match('/v1/payments/42'), { id: '42' });
    assert.equal(route.match('/v1/payments'), undefined);
    assert.equal(route.match('/v1/payments/42/refunds'), undefined);
    assert.deepEqual(compileRoutePattern('/static/*').match('/static/a/b'), {});
    assert.deepEqual(compileRoutePattern('/static/*').match('/static'), {});
    assert.deepEqual(compileRoutePattern('/').match('/'), {});
    assert.deepEqual(compileRoutePattern('/v1/').match('/v1'), {});
  });

  it('ignores the letter case of literals by default; parameters keep theirs', () => {
    const route = compileRoutePattern('/v1/Payments/:id');
    assert.deepEqual(route.match('/V1/PAYMENTS/AbC'), { id: 'AbC' });
    assert.deepEqual(route.match('/v1/payments/abc'), { id: 'abc' });
    assert.equal(route.match('/v1/paymentz/abc'), undefined);
    const sensitive = compileRoutePattern('/v1/Payments/:id', {
      ...DEFAULT_PATH_MATCHING,
      caseSensitive: true,
    });
    assert.deepEqual(sensitive.match('/v1/Payments/1'), { id: '1' });
    assert.equal(sensitive.match('/v1/payments/1'), undefined);
    const prefix = compilePathPrefix('/Admin/');
    assert.ok(prefix.matches('/admin') && prefix.matches('/ADMIN/x') && prefix.matches('/aDmIn/x/y'));
    assert.ok(!prefix.matches('/adminx') && !prefix.matches('/adm') && !prefix.matches('/x/admin'));
    const sensitivePrefix = compilePathPrefix('/Admin', { ...DEFAULT_PATH_MATCHING, caseSensitive: true });
    assert.ok(sensitivePrefix.matches('/Admin/x') && !sensitivePrefix.matches('/admin/x'));
    assert.ok(compilePathPrefix('/').matches('/anything'));
  });

  it('rejects malformed patterns', () => {
    for (const bad of ['v1', '/a/*/b', '/a/:', '/a/:id/:id', '/a//b', '/a/x*', '/a\\b', '/a;x/b']) {
      assert.throws(() => compileRoutePattern(bad), Error, bad);
    }
  });

  it('allows "\\" and ";" in patterns when routing reads them as characters', () => {
    const plain = { caseSensitive: false, backslashAsSlash: false, stripPathParameters: false };
    assert.deepEqual(compileRoutePattern('/a\\b;v=1/:id', plain).match('/A\\b;v=1/7'), { id: '7' });
    assert.ok(compilePathPrefix('/a\\b', plain).matches('/a\\b/c'));
  });

  it('normalizes the spellings an upstream router would treat as one path', () => {
    assert.equal(normalizeRequestPath('/v1//payments/./x/../42/?a=1'), '/v1/payments/42');
    assert.equal(normalizeRequestPath('/v1/%70ayments/%2e%2e/x'), '/v1/x');
    assert.equal(normalizeRequestPath('/a%2fb'), '/a%2Fb', 'an encoded slash stays a character');
    assert.equal(normalizeRequestPath('http://example.com/x/y?q'), '/x/y');
    assert.equal(normalizeRequestPath('/../../etc'), '/etc');
    assert.equal(normalizeRequestPath(''), '/');
    assert.equal(normalizeRequestPath('*'), '/');
  });

  it('reads "\\" as "/" and cuts ";params" from each segment before resolving dot segments', () => {
    assert.equal(normalizeRequestPath('/admin\\x\\..\\y?q=\\'), '/admin/y');
    assert.equal(normalizeRequestPath('/admin;/x'), '/admin/x');
    assert.equal(normalizeRequestPath('/admin;jsessionid=1/x;a=b;c'), '/admin/x');
    assert.equal(normalizeRequestPath('/x/..;/admin/x'), '/admin/x', 'Tomcat reads "..;" as ".."');
    assert.equal(normalizeRequestPath('/;x/admin'), '/admin');
    assert.equal(normalizeRequestPath('/admin%3Bx/y'), '/admin%3Bx/y', 'an encoded ";" stays a character');
    assert.equal(normalizeRequestPath('/Admin/X'), '/Admin/X', 'case is left to the patterns');
    assert.equal(
      normalizeRequestPath('/admin;/x/..;/y', { backslashAsSlash: true, stripPathParameters: false }),
      '/admin;/x/..;/y',
    );
    assert.equal(
      normalizeRequestPath('/admin\\x/..\\y', { backslashAsSlash: false, stripPathParameters: true }),
      '/admin\\x/..\\y',
    );
  });

  it('reads a path with ";" or "\\" both with and without each rewrite, most rewritten first', () => {
    // The review's spellings: the rewrite makes a ".." or an empty segment that removes "files",
    // which Express, Fastify, Go and nginx keep (and so route to the files handler).
    // The last reading of a path with ";" is cut at the first one, dot segments kept: Fastify's
    // with useSemicolonDelimiter, which reads the rest as a query.
    assert.deepEqual(requestPathReadings('/files/..;/x'), ['/x', '/files/..;/x', '/files/..']);
    assert.deepEqual(requestPathReadings('/Files/..;/x'), ['/x', '/Files/..;/x', '/Files/..']);
    // The WHATWG parser counts the empty segment: "/files/\\..\\x" is /files/x to it.
    assert.deepEqual(requestPathReadings('/files/\\..\\x'), ['/x', '/files/\\..\\x', '/files/x']);
    assert.deepEqual(requestPathReadings('/files/;/../x'), ['/x', '/files/x', '/files/;/../x', '/files']);
    assert.deepEqual(requestPathReadings('/v1/payments/;x'), ['/v1/payments', '/v1/payments/;x']);
    assert.deepEqual(requestPathReadings('/v1/payments/4\\2'), ['/v1/payments/4/2', '/v1/payments/4\\2']);
    assert.deepEqual(requestPathReadings('/v1/payments/..;'), ['/v1', '/v1/payments/..;', '/v1/payments/..']);
    // Both characters: each rewrite also alone. The WHATWG parser (\ only) routes this to
    // /files/x, which neither the plain nor the fully rewritten reading is.
    assert.equal(new URL('http://h/files\\x/..;/..').pathname, '/files/x/');
    assert.deepEqual(requestPathReadings('/files\\x/..;/..'), [
      '/',
      '/files/x',
      '/files\\x',
      '/files\\x/..;/..',
      '/files\\x/..',
    ]);
    assert.deepEqual(requestPathReadings('/a;b\\c/d'), ['/a/c/d', '/a/d', '/a;b/c/d', '/a;b\\c/d', '/a']);
    // One reading without the characters, or with them only in the query, escaped or turned off
    // (the dot segments here add the reading that keeps them, last).
    assert.deepEqual(requestPathReadings('/v1/payments/42/?q=;\\'), ['/v1/payments/42']);
    assert.deepEqual(requestPathReadings('/v1//payments/./42/?q=;\\'), [
      '/v1/payments/42',
      '/v1/payments/./42',
    ]);
    assert.deepEqual(requestPathReadings('/a%3B/b%5C/..'), ['/a%3B', '/a%3B/b%5C/..']);
    assert.deepEqual(
      requestPathReadings('/files/..;/\\..\\x', { backslashAsSlash: false, stripPathParameters: false }),
      ['/files/..;/\\..\\x'],
    );
    assert.deepEqual(
      requestPathReadings('/files/..;/x', { backslashAsSlash: true, stripPathParameters: false }),
      ['/files/..;/x'],
    );
  });

  it('also reads a path with dot segments kept, as Express 5 and Fastify 5 route it', () => {
    // They route ".." and "." (also "%2e" spellings, decoded) as ordinary segments: Express runs
    // its /admin handler for /admin/../users and /v1/payments/:id/refunds with id ".." here.
    assert.deepEqual(requestPathReadings('/admin/../users'), ['/users', '/admin/../users']);
    assert.deepEqual(requestPathReadings('/admin/%2e%2e/users'), ['/users', '/admin/../users']);
    assert.deepEqual(requestPathReadings('/v1/payments/../refunds'), [
      '/v1/refunds',
      '/v1/payments/../refunds',
    ]);
    assert.deepEqual(requestPathReadings('/v1/payments/%2E%2E/refunds'), [
      '/v1/refunds',
      '/v1/payments/../refunds',
    ]);
    assert.deepEqual(requestPathReadings('/v1/payments/./refunds'), [
      '/v1/payments/refunds',
      '/v1/payments/./refunds',
    ]);
    assert.deepEqual(requestPathReadings('/a/.%2E/b'), ['/b', '/a/../b']);
    assert.deepEqual(compileRoutePattern('/v1/payments/:id/refunds').match('/v1/payments/../refunds'), {
      id: '..',
    });
    // Kept also with both rewrites off (Express and Fastify apply neither); the kept reading is last.
    assert.deepEqual(
      requestPathReadings('/admin/../users', { backslashAsSlash: false, stripPathParameters: false }),
      ['/users', '/admin/../users'],
    );
    assert.deepEqual(requestPathReadings('/files/..;/x/..'), [
      '/',
      '/files/..;',
      '/files/..;/x/..',
      '/files/..',
    ]);
    // Dots inside a segment are no dot segment: one reading, normalized once.
    assert.deepEqual(requestPathReadings('/.well-known/a.b/..x/%2ex'), ['/.well-known/a.b/..x/.x']);
  });

  it('also reads a path with "//" or "\\" as the WHATWG URL parser does (routing.backslashAsSlash)', () => {
    // new URL(req.url, base) reads "//evil/…" and "/\\evil/…" as an authority, and counts empty
    // segments when resolving "..": each of these is /v1/payments/1 to a fetch-API server.
    for (const target of [
      '//evil/v1/payments/1',
      '/\\evil/v1/payments/1',
      '/v1//../payments/1',
      '/v1//%2e%2e/payments/1',
    ]) {
      assert.equal(new URL(target, 'http://h').pathname, '/v1/payments/1', target);
    }
    assert.deepEqual(requestPathReadings('//evil/v1/payments/1'), ['/evil/v1/payments/1', '/v1/payments/1']);
    assert.deepEqual(requestPathReadings('/\\evil/v1/payments/1'), [
      '/evil/v1/payments/1',
      '/\\evil/v1/payments/1',
      '/v1/payments/1',
    ]);
    assert.deepEqual(requestPathReadings('/v1//../payments/1'), [
      '/payments/1',
      '/v1/payments/1',
      '/v1/../payments/1',
    ]);
    assert.deepEqual(requestPathReadings('/v1//%2e%2e/payments/1'), [
      '/payments/1',
      '/v1/payments/1',
      '/v1/../payments/1',
    ]);
    // Not without routing.backslashAsSlash, which is what models the WHATWG parser.
    assert.deepEqual(
      requestPathReadings('//evil/v1/payments/1', { backslashAsSlash: false, stripPathParameters: true }),
      ['/evil/v1/payments/1'],
    );
    // A target the parser rejects (a bad host) fails in the upstream too: no reading of its own.
    assert.deepEqual(requestPathReadings('//[bad/x'), ['/[bad/x']);
    assert.deepEqual(requestPathReadings('//h:99999/x'), ['/h:99999/x']);
  });

  it('gives a hostile path at most seven readings, cheaply and without throwing', () => {
    const hostile = '//h:1/a;b\\c/.%2e//d/..;/'.repeat(600).slice(0, 14_000);
    const readings = requestPathReadings(hostile);
    assert.ok(readings.length >= 5 && readings.length <= 7, `${readings.length} readings`);
    assert.equal(new Set(readings).size, readings.length, 'no duplicates');
    const started = performance.now();
    for (let i = 0; i < 20; i++) requestPathReadings(hostile);
    const each = (performance.now() - started) / 20;
    assert.ok(each < 20, `${each.toFixed(2)} ms a reading set`);
    for (const odd of ['//', '/\\', '//@', '//%zz/x', '/%2e%2e%2f..', '//h/..//..', '/\\\\/\\']) {
      assert.ok(requestPathReadings(odd).length >= 1, odd);
    }
  });
});

describe('key templates', () => {
  const context = {
    client: '2001:db8:1:2::/64',
    method: 'POST',
    route: '/v1/payments/:id',
    params: { id: '42' },
    header: (name: string) => ({ 'x-api-key': 'acme', 'x-evil': 'a}b{c\tdef' })[name],
  };

  it('renders placeholders', () => {
    assert.equal(
      compileKeyTemplate('pay:{method}:{client}:{param:id}:{header:x-api-key}', ['id']).render(context),
      'pay:POST:2001:db8:1:2::/64:42:acme',
    );
    assert.equal(compileKeyTemplate('{route}', []).render(context), '/v1/payments/:id');
    assert.equal(compileKeyTemplate('fixed', []).render(context), 'fixed');
  });

  it('hashes unsafe or secret values and renders a missing value as "-"', () => {
    const unsafe = compileKeyTemplate('k={header:x-evil}', []).render(context);
    assert.match(unsafe, /^k=h\.[0-9a-f]{16}$/);
    assert.match(compileKeyTemplate('k={headerHash:x-api-key}', []).render(context), /^k=[0-9a-f]{16}$/);
    assert.equal(compileKeyTemplate('k={header:x-missing}', []).render(context), 'k=-');
  });

  it('folds a rendered key over MAX_KEY_BYTES to its leading text and a hash of the whole key', () => {
    const template = compileKeyTemplate('caller:{header:a}:{header:b}', []);
    const render = (a: string, b: string) =>
      template.render({ ...context, header: (name: string) => ({ a, b })[name] });
    const short = render('x', 'y');
    assert.equal(short, 'caller:x:y');
    const long = render('a'.repeat(128), 'b'.repeat(128));
    assert.match(long, /^caller:~h\.[0-9a-f]{32}$/);
    assert.ok(Buffer.byteLength(long) <= MAX_KEY_BYTES);
    assert.notEqual(render('a'.repeat(128), 'c'.repeat(128)), long, 'distinct values stay distinct keys');
    assert.equal(render('a'.repeat(128), 'b'.repeat(128)), long, 'and the same values the same key');
    // Exactly at the bound: kept as rendered.
    const atBound = render('a'.repeat(128), 'b'.repeat(MAX_KEY_BYTES - 'caller::'.length - 128));
    assert.equal(Buffer.byteLength(atBound), MAX_KEY_BYTES);
    assert.ok(atBound.endsWith('bbb'));
    // Multi-byte literal text counts in UTF-8 bytes, as the global limiter counts it.
    const wide = compileKeyTemplate(`${'é'.repeat(60)}:{header:a}`, []).render({
      ...context,
      header: () => 'v'.repeat(100),
    });
    assert.ok(Buffer.byteLength(wide) <= MAX_KEY_BYTES, `${Buffer.byteLength(wide)} bytes`);
    assert.ok(wide.includes('~h.'));
  });

  it('rejects a constant key over MAX_KEY_BYTES and a route parameter named __proto__', () => {
    assert.throws(
      () => compileKeyTemplate('k'.repeat(MAX_KEY_BYTES + 1), []),
      /a key of 201 bytes; at most 200/,
    );
    assert.throws(() => compileRoutePattern('/x/:__proto__'), /":__proto__" is reserved/);
  });

  it('renders HEAD as GET in {method} unless headMatchesGet is off', () => {
    const head = { ...context, method: 'HEAD' };
    assert.equal(compileKeyTemplate('m={method}', []).render(head), 'm=GET');
    assert.equal(compileKeyTemplate('m={method}', [], { headMatchesGet: false }).render(head), 'm=HEAD');
  });

  it('rejects unknown placeholders and parameters the route does not capture', () => {
    assert.throws(() => compileKeyTemplate('{nope}', []), /unknown placeholder/);
    assert.throws(() => compileKeyTemplate('{param:id}', []), /not a parameter/);
    assert.throws(() => compileKeyTemplate('{header}', []), /bad placeholder/);
    assert.throws(() => compileKeyTemplate('a{b', []), /unmatched/);
  });
});

describe('rules file', () => {
  const head = 'version: 1\nupstream:\n  url: http://127.0.0.1:9000\nbackend:\n  kind: local\n';
  it('never quotes a password in an error: messages are logged and served in /healthz', () => {
    const files = [
      'version: 1\nupstream:\n  url: http://127.0.0.1:9000\nbackend:\n  kind: redis\n  url: redis+tls://default:hunter2@redis:6380\nbuckets: []\n',
      'version: 1\nupstream:\n  url: http://admin:hunter2@127.0.0.1:9000/path\nbackend:\n  kind: local\nbuckets: []\n',
      'version: 1\nupstream:\n  url: "http://admin:hunter2@[::1"\nbackend:\n  kind: local\nbuckets: []\n',
    ];
    for (const text of files) {
      assert.throws(
        () => parseProxyRules(text, 'r.yaml'),
        (error: Error) => !error.message.includes('hunter2') && /\*\*\*@|credentials/.test(error.message),
        text,
      );
    }
  });

  const failures: [body: string, message: string][] = [
    ['buckets:\n  - name: a\n    limit: 1\n', 'r.yaml:7:5: buckets[0].windowSec: is required (number)'],
    // Issue #35: a typo is named as itself, with a suggestion, before the field it left out.
    [
      'buckets:\n  - name: a\n    limt: 10\n    windowSec: 1\n',
      'r.yaml:8:5: buckets[0]: unknown field "limt"; did you mean "limit"? (allowed: name, key, limit, windowSec, mode, cost, match)',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { methds: [GET] }\n',
      'r.yaml:10:14: buckets[0].match: unknown field "methds"; did you mean "methods"? (allowed: methods, path, prefix, header)',
    ],
    [
      'clientAddress:\n  trustedProxy: [loopback]\nbuckets: []\n',
      'r.yaml:7:3: clientAddress: unknown field "trustedProxy"; did you mean "trustedProxies"? (allowed: trustedProxies, ipv6PrefixLength, ipv4PrefixLength)',
    ],
    // OpenAPI's braces would be literal text no request has: a bucket that silently limits nothing.
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { path: "/v1/users/{id}" }\n',
      'r.yaml:10:20: buckets[0].match.path: "/v1/users/{id}": "{id}" is not route pattern syntax (OpenAPI\'s braces match nothing here): write a parameter as ":id" (one whole segment), and a final "*" for the rest of the path',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { prefix: "/v1/{tenant}" }\n',
      'r.yaml:10:22: buckets[0].match.prefix: "/v1/{tenant}": "{tenant}" is not prefix syntax: a prefix is literal segments; for a parameter use match.path with ":tenant"',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    burst: 3\n',
      'r.yaml:10:5: buckets[0]: unknown field "burst" (allowed: name, key, limit, windowSec, mode, cost, match)',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n  - name: a\n    limit: 2\n    windowSec: 1\n',
      'r.yaml:10:11: buckets[1].name: duplicate bucket name "a" (first at buckets[0])',
    ],
    [
      'buckets:\n  - name: a\n    key: "x={param:id}"\n    limit: 1\n    windowSec: 1\n    match: { prefix: /v1 }\n',
      'r.yaml:8:10: buckets[0].key: "x={param:id}": {param:id} is not a parameter of the bucket\'s path pattern',
    ],
    [
      'server:\n  bodyTimeoutMs: -1\nbuckets: []\n',
      'r.yaml:7:18: server.bodyTimeoutMs: must be >= 0, got -1',
    ],
    [
      'server:\n  upgradeProtocols: [websocket, H2C]\nbuckets: []\n',
      'r.yaml:7:33: server.upgradeProtocols[1]: "H2C" cannot be tunnelled: an upgraded connection would carry HTTP requests the buckets never decide',
    ],
    [
      'server:\n  upgradeProtocols: ["HTTP/2.0"]\nbuckets: []\n',
      'r.yaml:7:22: server.upgradeProtocols[0]: "HTTP/2.0" cannot be tunnelled: an upgraded connection would carry HTTP requests the buckets never decide',
    ],
    [
      'server:\n  upgradeProtocols: ["web socket"]\nbuckets: []\n',
      'r.yaml:7:22: server.upgradeProtocols[0]: must be a protocol as the Upgrade header names it: a token, or token/version, got "web socket"',
    ],
    [
      'server:\n  bufferBodyBytes: -1\nbuckets: []\n',
      'r.yaml:7:20: server.bufferBodyBytes: must be >= 0, got -1',
    ],
    [
      'server:\n  maxUploadsPerClient: 1.5\nbuckets: []\n',
      'r.yaml:7:24: server.maxUploadsPerClient: expected int, got 1.5',
    ],
    [
      'server:\n  bodyMinRateGraceMs: 0\nbuckets: []\n',
      'r.yaml:7:23: server.bodyMinRateGraceMs: must be >= 1, got 0',
    ],
    [
      'server:\n  bodyMinBytesPerSec: 0.5\nbuckets: []\n',
      'r.yaml:7:23: server.bodyMinBytesPerSec: expected int, got 0.5',
    ],
    [
      'server:\n  upgradeIdleTimeoutMs: 1.5\nbuckets: []\n',
      'r.yaml:7:25: server.upgradeIdleTimeoutMs: expected int, got 1.5',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { methods: [get] }\n',
      'r.yaml:10:24: buckets[0].match.methods[0]: must be an upper-case method name, got "get"',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { path: "/a;v=1/b" }\n',
      'r.yaml:10:20: buckets[0].match.path: "/a;v=1/b": ";" starts a path parameter, cut from requests (routing.stripPathParameters): write the path without it',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { prefix: "/a\\\\b" }\n',
      'r.yaml:10:22: buckets[0].match.prefix: "/a\\b": "\\" is read as "/" in requests (routing.backslashAsSlash): write "/"',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { path: "/v1/./x" }\n',
      'r.yaml:10:20: buckets[0].match.path: "/v1/./x": "." is resolved in requests: write the path it leads to',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { prefix: "/v1/../x" }\n',
      'r.yaml:10:22: buckets[0].match.prefix: "/v1/../x": ".." is resolved in requests: write the path it leads to',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { path: "/%70ay/:id" }\n',
      'r.yaml:10:20: buckets[0].match.path: "/%70ay/:id": "%70" is decoded in requests: write "p"',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { prefix: "/caf%c3%a9" }\n',
      'r.yaml:10:22: buckets[0].match.prefix: "/caf%c3%a9": "%c3": requests are compared with percent-escapes in upper case: write "%C3"',
    ],
    [
      'buckets:\n  - name: a\n    limit: 1\n    windowSec: 1\n    match: { prefix: "/a//b" }\n',
      'r.yaml:10:22: buckets[0].match.prefix: "/a//b": empty segment (requests drop them)',
    ],
    [
      'routing:\n  caseSensitive: yes\nbuckets: []\n',
      'r.yaml:7:18: routing.caseSensitive: expected boolean, got "yes"',
    ],
  ];
  for (const [body, message] of failures) {
    it(`reports ${message.split(': ').slice(1).join(': ')}`, () => {
      assert.throws(
        () => parseProxyRules(head + body, 'r.yaml'),
        (error: Error & { code?: string }) => {
          assert.equal(error.code, 'ERR_SPILLWAY_INVALID_CONFIG');
          assert.equal(error.message, message);
          return true;
        },
      );
    });
  }

  it('reports upstream pool settings out of range: connectTimeoutMs 0 (undici would read it as 10 s), maxQueued below 0', () => {
    for (const [line, message] of [
      ['connectTimeoutMs: 0', 'r.yaml:4:21: upstream.connectTimeoutMs: must be >= 1, got 0'],
      ['maxQueued: -1', 'r.yaml:4:14: upstream.maxQueued: must be >= 0, got -1'],
    ]) {
      assert.throws(
        () =>
          parseProxyRules(
            `version: 1\nupstream:\n  url: http://127.0.0.1:9000\n  ${line}\nbackend: { kind: local }\nbuckets: []\n`,
            'r.yaml',
          ),
        (error: Error & { code?: string }) => {
          assert.equal(error.code, 'ERR_SPILLWAY_INVALID_CONFIG');
          assert.equal(error.message, message);
          return true;
        },
      );
    }
  });

  it('reports a bad upstream URL, backend and trusted proxy at their lines', () => {
    assert.throws(
      () =>
        parseProxyRules(
          'version: 1\nupstream:\n  url: http://x/path\nbackend: { kind: local }\nbuckets: []\n',
          'r.yaml',
        ),
      /^SpillwayError: r\.yaml:3:8: upstream\.url: must be http\(s\):\/\/host\[:port\]/,
    );
    assert.throws(
      () =>
        parseProxyRules(
          'version: 1\nupstream: { url: "http://x" }\nbackend: { kind: memcached }\nbuckets: []\n',
          'r.yaml',
        ),
      /r\.yaml:3:\d+: backend\.kind: must be one of "local", "redis", "global", got "memcached"/,
    );
    assert.throws(
      () =>
        parseProxyRules(
          'version: 1\nupstream: { url: "http://x" }\nclientAddress:\n  trustedProxies: [10.0.0.0/8, nonsense]\nbackend: { kind: local }\nbuckets: []\n',
          'r.yaml',
        ),
      /r\.yaml:4:32: clientAddress\.trustedProxies\[1\]: "nonsense" is not a CIDR/,
    );
  });

  it('refuses a billion-laughs alias bomb with ERR_SPILLWAY_INVALID_CONFIG (same reader as the limits file)', () => {
    const levels = Array.from({ length: 9 }, (_, i) => {
      const name = String.fromCharCode(98 + i);
      return `${name}: &${name} [${Array(10)
        .fill(`*${String.fromCharCode(97 + i)}`)
        .join(',')}]`;
    });
    const bomb = [
      'a: &a ["x","x","x","x","x","x","x","x","x","x"]',
      ...levels,
      'version: 1',
      'buckets: *j',
    ].join('\n');
    assert.throws(
      () => parseProxyRules(bomb, 'bomb.yaml'),
      (error: { code?: string; message?: string }) =>
        error.code === 'ERR_SPILLWAY_INVALID_CONFIG' &&
        /^bomb\.yaml:1:1: YAML error/.test(error.message ?? ''),
    );
  });

  it('examples/proxy-rules-global.yaml is valid and uses the global backend', async () => {
    const rules = await loadProxyRules(
      new URL('../../examples/proxy-rules-global.yaml', import.meta.url).pathname,
    );
    assert.equal(rules.backend.kind, 'global');
    assert.deepEqual(
      rules.buckets.map((b) => b.config.name),
      ['payments', 'search', 'per-caller', 'per-client'],
    );
  });

  it('examples/proxy-rules.yaml is valid', async () => {
    const rules = await loadProxyRules(new URL('../../examples/proxy-rules.yaml', import.meta.url).pathname);
    assert.deepEqual(
      rules.buckets.map((b) => b.config.name),
      ['per-caller', 'per-client', 'payments', 'anonymous', 'search-trial'],
    );
  });

  it('the example rules pair every bucket keyed by a client-chosen header with one keyed {client} (docs/security.md)', async () => {
    for (const file of ['proxy-rules.yaml', 'proxy-rules-global.yaml']) {
      const rules = await loadProxyRules(new URL(`../../examples/${file}`, import.meta.url).pathname);
      const byClient = rules.buckets.filter((b) => b.key.source.includes('{client}'));
      for (const bucket of rules.buckets) {
        if (!/\{header(Hash)?:/.test(bucket.key.source)) continue;
        const prefix = bucket.config.match?.prefix ?? bucket.config.match?.path ?? '/';
        const paired = byClient.some((b) => {
          const covers = b.config.match?.prefix ?? '/';
          return b.config.match?.path === undefined && prefix.startsWith(covers);
        });
        assert.ok(
          paired,
          `${file}: ${bucket.config.name} is keyed by a header; no {client} bucket covers ${prefix}`,
        );
      }
    }
  });

  it('fills defaults', () => {
    const rules = parseProxyRules(`${head}buckets:\n  - name: a\n    limit: 5\n    windowSec: 1\n`);
    assert.equal(rules.upstream.headersTimeoutMs, 30_000);
    assert.equal(rules.server.upgradeIdleTimeoutMs, 60_000);
    assert.equal(rules.server.bodyTimeoutMs, 60_000);
    assert.equal(rules.server.bodyMinBytesPerSec, 500);
    // No pause bound: no rate bound either unless set, as before the rate existed.
    assert.equal(
      parseProxyRules(`${head}server:\n  bodyTimeoutMs: 0\nbuckets: []\n`).server.bodyMinBytesPerSec,
      0,
    );
    // The rate's grace is its own (bodyMinRateGraceMs), so it stands without a pause bound.
    assert.equal(
      parseProxyRules(`${head}server:\n  bodyTimeoutMs: 0\n  bodyMinBytesPerSec: 100\nbuckets: []\n`).server
        .bodyMinBytesPerSec,
      100,
    );
    assert.equal(rules.server.bodyMinRateGraceMs, 1_000);
    assert.equal(rules.server.bufferBodyBytes, 65_536);
    assert.equal(rules.server.maxUploadsPerClient, 16);
    assert.deepEqual(rules.server.upgradeProtocols, ['websocket']);
    assert.deepEqual(
      parseProxyRules(`${head}server:\n  upgradeProtocols: [WebSocket, SPDY/3.1]\nbuckets: []\n`).server
        .upgradeProtocols,
      ['websocket', 'spdy/3.1'],
    );
    assert.equal(rules.clientAddress.ipv6PrefixLength, 64);
    assert.equal(rules.buckets[0]!.config.mode, 'enforce');
    assert.equal(rules.buckets[0]!.key.source, 'a');
    assert.deepEqual(rules.routing, {
      caseSensitive: false,
      headMatchesGet: true,
      backslashAsSlash: true,
      stripPathParameters: true,
    });
  });

  it("docs/proxy.md's tables of the rules file state the parser's defaults", async () => {
    const { readFileSync } = await import('node:fs');
    const doc = readFileSync(new URL('../../docs/proxy.md', import.meta.url), 'utf8');
    const section = doc.slice(doc.indexOf('## The rules file'), doc.indexOf('### Several buckets'));
    const rules = parseProxyRules(`${head}buckets:\n  - name: a\n    limit: 5\n    windowSec: 1\n`);
    const top = rules as unknown as Record<string, Record<string, unknown>>;
    const bucket = rules.buckets[0]!.config as unknown as Record<string, unknown>;
    let checked = 0;
    // Rows whose default is one code span: `| \`upstream.connections\` | \`128\` | ... |`.
    for (const [, field, written] of section.matchAll(/^\| `([\w.]+)` \| `([^`]+)` \|/gm)) {
      const [group, name] = field!.split('.');
      const value = name === undefined ? bucket[group!] : top[group!]?.[name];
      assert.notEqual(value, undefined, `${field}: not a field with a default`);
      assert.equal(JSON.stringify(value), JSON.stringify(parse(written!)), field);
      checked++;
    }
    assert.ok(checked >= 20, `checked ${checked} rows`);
  });

  it("matches a bucket when any reading of the path does, once, with the first matching reading's parameters", () => {
    const rules = parseProxyRules(`${head}buckets:
  - name: files
    limit: 5
    windowSec: 1
    match: { prefix: /files }
  - name: payments
    key: "p:{param:id}"
    limit: 5
    windowSec: 1
    match: { path: /v1/payments/:id }
`);
    const facts = (target: string): RequestFacts => ({
      method: 'GET',
      paths: requestPathReadings(target, rules.routing),
      client: '203.0.113.7',
      header: () => undefined,
      headerRepeated: () => false,
    });
    const keys = (target: string) => matchBuckets(rules.buckets, facts(target)).map((m) => m.key);
    assert.deepEqual(keys('/files/..;/x'), ['files']);
    assert.deepEqual(keys('/files/;/../files/x'), ['files'], 'two readings match: one bucket, charged once');
    assert.deepEqual(keys('/x'), []);
    // The most rewritten reading that matches gives the parameters: one key for 42 and 42;v=2.
    assert.deepEqual(keys('/v1/payments/42;v=2'), ['p:42']);
    assert.deepEqual(keys('/V1/Payments/42'), ['p:42']);
    // Only the plain reading matches these, so they are ids of their own (as Express sees them).
    const idKey = (id: string) =>
      rules.buckets[1]!.key.render({
        client: '',
        method: 'GET',
        route: '',
        params: { id },
        header: () => undefined,
      });
    assert.deepEqual(keys('/v1/payments/;x'), [idKey(';x')]);
    assert.deepEqual(keys('/v1/payments/4\\2'), [idKey('4\\2')]);
    assert.deepEqual(keys('/v1/payments/..;'), [idKey('..;')]);
  });

  it('lets methods: [GET] match HEAD unless routing.headMatchesGet is off', () => {
    const bucket = `buckets:\n  - name: a\n    limit: 5\n    windowSec: 1\n    match: { methods: [GET, POST] }\n`;
    assert.deepEqual([...parseProxyRules(head + bucket).buckets[0]!.methods!], ['GET', 'POST', 'HEAD']);
    const off = parseProxyRules(`${head}routing:\n  headMatchesGet: false\n${bucket}`);
    assert.deepEqual([...off.buckets[0]!.methods!], ['GET', 'POST']);
    assert.equal(off.routing.caseSensitive, false, 'the other routing defaults still apply');
  });
});

describe('merging upstream RateLimit fields', () => {
  const ours = { policy: '"api";q=5;w=60', limit: '"api";r=4;t=12' };
  it('keeps ours when the upstream sent none', () => {
    assert.deepEqual(mergeRateLimitFields(ours, { policy: undefined, limit: undefined }), ours);
  });
  it('appends ours after an upstream field that does not parse', () => {
    assert.deepEqual(mergeRateLimitFields(ours, { policy: 'garbage((', limit: 'r=3' }), {
      policy: 'garbage((, "api";q=5;w=60',
      limit: 'r=3, "api";r=4;t=12',
    });
  });
  it('keeps distinct policies from both sides', () => {
    assert.deepEqual(
      mergeRateLimitFields(ours, { policy: 'daily;q=1000;w=86400', limit: 'daily;r=10;t=100' }),
      {
        policy: 'daily;q=1000;w=86400, "api";q=5;w=60',
        limit: 'daily;r=10;t=100, "api";r=4;t=12',
      },
    );
  });
  it('a name the upstream repeats keeps its strictest member: the lowest r, not the last one sent', () => {
    // The review's case: the last of two "caller" members won, and the upstream's r=0 was lost.
    const proxy = { policy: '"caller";q=100000;w=1', limit: '"caller";r=99999;t=1' };
    assert.deepEqual(
      mergeRateLimitFields(proxy, {
        policy: '"caller";q=10;w=1',
        limit: '"caller";r=0;t=1, "caller";r=999999;t=1',
      }),
      { policy: '"caller";q=10;w=1', limit: '"caller";r=0;t=1' },
    );
    // Without a proxy member of that name: one member, the lowest r, on equal r the longer t.
    assert.deepEqual(
      mergeRateLimitFields(ours, {
        policy: undefined,
        limit: '"x";r=5;t=10, daily;r=1;t=9, "x";r=5;t=30, "x";r=7;t=1',
      }),
      { policy: '"api";q=5;w=60', limit: '"x";r=5;t=30, daily;r=1;t=9, "api";r=4;t=12' },
    );
  });

  it('a proxy member stricter than every repeated upstream member replaces them once', () => {
    assert.deepEqual(
      mergeRateLimitFields(ours, {
        policy: '"api";q=1000;w=60, "api";q=10;w=60, "api";q=50;w=1',
        limit: '"api";r=9;t=1, "api";r=8;t=1',
      }),
      { policy: '"api";q=5;w=60', limit: '"api";r=4;t=12' },
    );
  });

  it('repeated RateLimit-Policy members keep the lowest q per window; different windows are all kept', () => {
    assert.deepEqual(
      mergeRateLimitFields(ours, {
        policy: '"api";q=1000;w=60, "api";q=10;w=60, "api";q=50;w=1, "api";q=20;w=1',
        limit: '"api";r=3;t=20',
      }),
      { policy: '"api";q=10;w=60, "api";q=20;w=1', limit: '"api";r=3;t=20' },
    );
  });

  it('on equal r across the two sides the longer t wins; on a full tie the upstream member', () => {
    assert.deepEqual(mergeRateLimitFields(ours, { policy: '"api";q=9;w=60', limit: '"api";r=4;t=11' }), ours);
    assert.deepEqual(mergeRateLimitFields(ours, { policy: '"api";q=9;w=60', limit: '"api";r=4;t=12' }), {
      policy: '"api";q=9;w=60',
      limit: '"api";r=4;t=12',
    });
  });

  it('a name the upstream sends in one field only keeps our members in both fields when ours wins', () => {
    // Policy only upstream: ours (r=4) is the only remaining count, so it stands in RateLimit too.
    assert.deepEqual(mergeRateLimitFields(ours, { policy: '"api";q=1000;w=60', limit: undefined }), ours);
    // RateLimit only upstream and ours stricter: our RateLimit-Policy member is not dropped.
    assert.deepEqual(
      mergeRateLimitFields(ours, { policy: undefined, limit: '"api";r=9;t=1, "api";r=90;t=1' }),
      ours,
    );
    // RateLimit only upstream and the upstream stricter: its view of the name stands alone.
    assert.deepEqual(mergeRateLimitFields(ours, { policy: undefined, limit: '"api";r=0;t=5' }), {
      policy: undefined,
      limit: '"api";r=0;t=5',
    });
  });

  it('never loosens: each name is sent once, with the lowest r either side sent for it', () => {
    const member = fc.record({
      name: fc.constantFrom('a', 'b', 'c'),
      remaining: fc.nat({ max: 20 }),
      resetSec: fc.nat({ max: 20 }),
    });
    const list = fc.array(member, { maxLength: 6 });
    const text = (members: { name: string; remaining: number; resetSec: number }[]) =>
      members.map((m) => `"${m.name}";r=${m.remaining};t=${m.resetSec}`).join(', ');
    fc.assert(
      // The proxy's own field names each bucket once (bucket names are unique); the upstream's may repeat.
      fc.property(fc.uniqueArray(member, { selector: (m) => m.name }), list, (mine, theirs) => {
        const merged = mergeRateLimitFields(
          { policy: undefined, limit: mine.length === 0 ? undefined : text(mine) },
          { policy: undefined, limit: theirs.length === 0 ? undefined : text(theirs) },
        );
        const sent = new Map<string, number>();
        for (const m of [...mine, ...theirs])
          sent.set(m.name, Math.min(sent.get(m.name) ?? m.remaining, m.remaining));
        const out = (merged.limit ?? '').split(', ').filter((m) => m !== '');
        const names = out.map((m) => /^"(\w)"/.exec(m)![1]!);
        assert.equal(new Set(names).size, names.length, `one member per name: ${merged.limit}`);
        assert.deepEqual(new Set(names), new Set(sent.keys()));
        for (const m of out) {
          const [, name, remaining] = /^"(\w)";r=(\d+);t=\d+$/.exec(m)!;
          assert.equal(Number(remaining), sent.get(name!), `${name}: ${merged.limit}`);
        }
      }),
      { numRuns: 1000 },
    );
  });
});
