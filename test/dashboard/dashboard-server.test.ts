import assert from 'node:assert/strict';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { connect } from 'node:net';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { pino } from 'pino';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { createController } from '../../src/control/controller.js';
import { ManualClock } from '../../src/core/clock.js';
import { createAdminActions } from '../../src/dashboard/admin-actions.js';
import { createAdminOverrides } from '../../src/dashboard/admin-overrides.js';
import { checkBearer } from '../../src/dashboard/admin-token.js';
import { createBucketHistory } from '../../src/dashboard/bucket-history.js';
import { type DashboardServer, startDashboardServer } from '../../src/dashboard/dashboard-server.js';
import type { DashboardView } from '../../src/dashboard/dashboard-view.js';
import { streamClientKey } from '../../src/dashboard/event-stream.js';
import { observeTimers } from '../../src/dashboard/tick-observer.js';
import type { TuningSource } from '../../src/dashboard/tuning-source.js';
import { createHostCheck } from '../../src/server/host-allowlist.js';
import { call, hostReport } from '../control/report-fixtures.js';
import { waitFor } from '../integration/spillway-process.js';
import { readEvents } from './sse-reader.js';

// The dashboard server in process, on a real socket, over a controller on a manual clock: ticks
// happen exactly when the test says, so event counts and history are exact.

const LIMITS = `
version: 1
intervalMs: 1000
buckets:
  - key: a
    limitRps: 100
  - key: b
    limitRps: 10
    mode: shadow
  - key: c
    limitRps: 5
`;
const TOKEN = 'in-process-token-0123456789';

function captureLogger() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  // `warn`: the audit line must come out whatever the level.
  return { logger: pino({ level: 'warn' }, stream), lines };
}

describe('dashboard server (in process, manual clock)', () => {
  const clock = new ManualClock();
  let ticks = 0;
  let server: DashboardServer;
  const { logger, lines } = captureLogger();
  const overrides = createAdminOverrides(parseLimitsConfig(LIMITS));
  const controller = createController({
    id: 'ctl',
    config: overrides.effective(),
    scheduler: observeTimers(clock, () => {
      ticks++;
      server?.onTick();
    }),
  });
  const tuning: TuningSource = {
    name: 'fixed test engine',
    suggestions: () => [
      { id: 's1', rule: 'a', currentLimitRps: 100, suggestedLimitRps: 150, reason: 'test says so' },
    ],
    accepted(id) {
      acceptedIds.push(id);
    },
  };
  const acceptedIds: string[] = [];
  let sequence = 0;
  const report = (offered: Record<string, number>) =>
    call(
      controller.handleReport,
      hostReport({
        id: 'h1',
        sequence: ++sequence,
        endMs: clock.nowMs(),
        buckets: Object.entries(offered).map(([bucket, n]) => ({ bucket, offered: n })),
      }),
    );

  before(async () => {
    server = await startDashboardServer({
      controller,
      overrides,
      admin: createAdminActions({ overrides, controller, logger, tuning, nowMs: () => clock.nowMs() }),
      adminToken: TOKEN,
      tuning,
      logger,
      heartbeatMs: 50,
      maxStreamClients: 2,
      historyLength: 3,
      view: { maxBuckets: 2 },
    });
    controller.start();
  });
  after(async () => {
    controller.stop();
    await server.close();
  });

  it('serves the page, its script, style and uPlot with a strict content security policy', async () => {
    for (const [path, type] of [
      ['/', 'text/html'],
      ['/index.html', 'text/html'],
      ['/app.js', 'text/javascript'],
      ['/style.css', 'text/css'],
      ['/vendor/uPlot.iife.min.js', 'text/javascript'],
      ['/vendor/uPlot.min.css', 'text/css'],
    ] as const) {
      const response = await fetch(`${server.url}${path.slice(1)}`);
      assert.equal(response.status, 200, path);
      assert.ok(response.headers.get('content-type')?.startsWith(type), path);
      assert.ok((await response.text()).length > 100, path);
    }
    const page = await fetch(server.url);
    assert.match(page.headers.get('content-security-policy') ?? '', /script-src 'self'/);
    // Sent as written: fetch() would normalise the dots away before they reach the server.
    for (const path of [
      '/../package.json',
      '/vendor/../../package.json',
      '/vendor/%2e%2e/%2e%2e/package.json',
      '/dashboard/app.js',
      '/node_modules/uplot/package.json',
    ]) {
      assert.equal(await rawStatus(server.url, path), 404, path);
    }
    // A target no URL parser takes is the client's error, not the server's.
    for (const target of ['//[', 'http://[']) assert.equal(await rawStatus(server.url, target), 400, target);
  });

  it('one event per controller tick, the view bounded to the busiest buckets', async () => {
    report({ a: 50, b: 30, c: 1 });
    let subscribed: () => void = () => {};
    const connected = new Promise<void>((resolve) => {
      subscribed = resolve;
    });
    const pending = readEvents(`${server.url}api/stream`, 3, 5_000, { onEvent: () => subscribed() });
    // The first event is sent on connect: from then on the subscriber gets every tick.
    await connected;
    clock.advance(1000);
    server.onTick(); // a second call for the same version is not a second event
    report({ a: 50, b: 30, c: 1 });
    clock.advance(1000);
    const received = await pending;
    assert.deepEqual(
      received.map((e) => e.event),
      ['snapshot', 'tick', 'tick'],
    );
    const events = received.map((e) => JSON.parse(e.data) as DashboardView);
    assert.deepEqual(
      events.map((e) => e.controller.ticks),
      [0, 1, 2],
    );
    const last = events[2]!;
    assert.equal(last.bucketsTotal, 3);
    assert.deepEqual(
      last.buckets.map((b) => b.key),
      ['a', 'b'],
      'the two busiest, by key',
    );
    assert.equal(ticks, 2);
  });

  it('keeps `historyLength` ticks of history, oldest first', async () => {
    for (let i = 0; i < 3; i++) {
      report({ a: 10 * (i + 1), b: 30, c: 1 });
      clock.advance(1000);
    }
    const history = (await (await fetch(`${server.url}api/history`)).json()) as {
      versions: number[];
      buckets: Record<string, { offeredRps: (number | null)[] }>;
    };
    assert.equal(history.versions.length, 3);
    assert.ok(history.versions[0]! < history.versions[1]! && history.versions[1]! < history.versions[2]!);
    assert.deepEqual(history.buckets.a!.offeredRps, [10, 20, 30]);
  });

  it('refuses a subscriber past maxStreamClients with 503, and sends heartbeats', async () => {
    const comments: string[] = [];
    const abort = new AbortController();
    const first = await fetch(`${server.url}api/stream`, { signal: abort.signal });
    assert.equal(first.status, 200);
    let subscribed: () => void = () => {};
    const connected = new Promise<void>((resolve) => {
      subscribed = resolve;
    });
    const second = readEvents(`${server.url}api/stream`, 2, 10_000, {
      comments,
      onEvent: () => subscribed(),
    });
    await connected;
    const third = await fetch(`${server.url}api/stream`);
    assert.equal(third.status, 503);
    assert.equal(
      ((await third.json()) as { error: { code: string } }).error.code,
      'ERR_SPILLWAY_CAPACITY_EXCEEDED',
    );
    await waitFor('a heartbeat', async () => (comments.includes(': heartbeat') ? true : undefined), {
      timeoutMs: 5_000,
      everyMs: 20,
    });
    clock.advance(1000);
    assert.equal((await second).length, 2);
    abort.abort();
    // Both slots free again once the server sees the subscribers go.
    const again = await waitFor('a free slot', async () => {
      const response = await fetch(`${server.url}api/stream`);
      if (response.status === 200) return response;
      await response.body?.cancel();
      return undefined;
    });
    await again.body?.cancel();
  });

  it('lists the tuning engine suggestions; accepting one applies its limit, audited at any log level', async () => {
    const list = (await (await fetch(`${server.url}api/tuning`)).json()) as {
      engine: string;
      suggestions: unknown[];
    };
    assert.equal(list.engine, 'fixed test engine');
    assert.equal(list.suggestions.length, 1);
    const response = await fetch(`${server.url}api/admin/tuning/accept`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ id: 's1' }),
    });
    assert.equal(response.status, 200);
    const result = (await response.json()) as {
      rule: string;
      after: { limitRps: number };
      suggestionId: string;
    };
    assert.deepEqual([result.rule, result.after.limitRps, result.suggestionId], ['a', 150, 's1']);
    assert.deepEqual(acceptedIds, ['s1']);
    assert.equal(overrides.effective().buckets[0]!.limitRps, 150);
    clock.advance(1000);
    assert.equal(controller.snapshot().buckets.find((b) => b.key === 'a')!.limitRps, 150);
    const audit = lines.find((l) => l.action === 'accept-suggestion');
    assert.ok(audit, 'audit line at level warn');
    assert.equal(audit.level, 30);
    assert.equal(audit.actor, 'admin');
    assert.equal(audit.suggestionId, 's1');
  });
});

describe('dashboard tick cost', () => {
  it('asks the controller for bounded snapshots only: the busiest buckets, children only when watched', async () => {
    const clock = new ManualClock();
    const overrides = createAdminOverrides(
      parseLimitsConfig(`
version: 1
intervalMs: 1000
buckets:
  - template: "api:caller=*"
    limitRps: 100
`),
    );
    const controller = createController({ id: 'ctl', config: overrides.effective(), scheduler: clock });
    const { logger } = captureLogger();
    // What every snapshot the server took materialized: listed buckets and children.
    const taken: { buckets: number; children: number }[] = [];
    const counted = {
      snapshot: (options?: Parameters<typeof controller.snapshot>[0]) => {
        const snapshot = controller.snapshot(options);
        taken.push({ buckets: snapshot.buckets.length, children: snapshot.children.length });
        return snapshot;
      },
    };
    const server = await startDashboardServer({
      controller: counted,
      overrides,
      admin: createAdminActions({ overrides, controller, logger }),
      logger,
      view: { maxBuckets: 3, maxChildren: 1 },
    });
    try {
      // 200 buckets from 2 children.
      for (const [child, offset] of [
        ['h1', 0],
        ['h2', 100],
      ] as const) {
        call(
          controller.handleReport,
          hostReport({
            id: child,
            sequence: 1,
            endMs: clock.nowMs(),
            buckets: Array.from({ length: 100 }, (_, i) => ({
              bucket: `api:caller=${offset + i}`,
              offered: offset + i,
            })),
          }),
        );
      }
      // Nobody watching: per tick one snapshot of the busiest 3 buckets, no children.
      for (let i = 0; i < 3; i++) {
        controller.tick();
        server.onTick();
      }
      assert.deepEqual(taken, [
        { buckets: 3, children: 0 },
        { buckets: 3, children: 0 },
        { buckets: 3, children: 0 },
      ]);
      const history = (await (await fetch(`${server.url}api/history`)).json()) as {
        atMs: number[];
        buckets: Record<string, unknown>;
      };
      assert.equal(history.atMs.length, 3, 'the history is kept with nobody watching');
      assert.deepEqual(Object.keys(history.buckets), ['api:caller=197', 'api:caller=198', 'api:caller=199']);

      // Watched: still the busiest 3 buckets, and the first child of 2.
      taken.length = 0;
      let subscribed: () => void = () => {};
      const connected = new Promise<void>((resolve) => {
        subscribed = resolve;
      });
      const pending = readEvents(`${server.url}api/stream`, 2, 5_000, { onEvent: () => subscribed() });
      await connected;
      controller.tick();
      server.onTick();
      const [, tick] = (await pending).map((e) => JSON.parse(e.data) as DashboardView);
      assert.deepEqual(taken, [
        { buckets: 3, children: 1 },
        { buckets: 3, children: 1 },
      ]);
      assert.equal(tick!.bucketsTotal, 200);
      assert.equal(tick!.childrenTotal, 2);
      assert.equal(tick!.hostsTotal, 2);
      assert.deepEqual(
        tick!.children.map((c) => c.id),
        ['h1'],
      );
    } finally {
      await server.close();
    }
  });
});

describe('Host header check (DNS rebinding)', () => {
  it('answers only the hosts it serves, on every route, before any work', async () => {
    const overrides = createAdminOverrides(parseLimitsConfig(LIMITS));
    const controller = createController({ id: 'ctl', config: overrides.effective() });
    const { logger } = captureLogger();
    const server = await startDashboardServer({
      controller,
      overrides,
      admin: createAdminActions({ overrides, controller, logger }),
      adminToken: TOKEN,
      logger,
      allowedHosts: ['dash.example.com', '10.1.2.3'],
      maxStreamClients: 1,
    });
    const { port } = server;
    try {
      for (const host of [
        `127.0.0.1:${port}`,
        `localhost:${port}`,
        'localhost',
        `[::1]:${port}`,
        'dash.example.com',
        `DASH.Example.com:${port}`,
        '10.1.2.3:443',
      ]) {
        assert.equal((await get(port, '/api/snapshot', host)).status, 200, host);
      }
      // A page on evil.example that re-pointed its name at 127.0.0.1 sends its own name.
      const refused = [
        `evil.example:${port}`,
        'evil.example',
        `127.0.0.1.nip.io:${port}`,
        `sub.dash.example.com:${port}`,
        `localhost.:${port}`,
        `10.9.9.9:${port}`,
        `[::2]:${port}`,
        'dash.example.com:80:80',
        '',
      ];
      for (const host of refused) {
        for (const path of [
          '/',
          '/app.js',
          '/api/snapshot',
          '/api/history',
          '/api/tuning',
          '/api/stream',
          '/nope',
        ]) {
          const response = await get(port, path, host);
          assert.equal(response.status, 403, `${host} ${path}`);
          const body = JSON.parse(response.body) as { error: { code: string; details: { host: string } } };
          assert.equal(body.error.code, 'ERR_SPILLWAY_HOST_NOT_ALLOWED', `${host} ${path}`);
          assert.equal(body.error.details.host, host);
        }
      }
      // Admin routes too, with the right token: the Host check comes first, the token check stays.
      const admin = await get(port, '/api/admin/check', `evil.example:${port}`, {
        authorization: `Bearer ${TOKEN}`,
      });
      assert.equal(admin.status, 403);
      assert.equal((await get(port, '/api/admin/check', `localhost:${port}`)).status, 401);
      // HTTP/1.0 without Host names nothing served here.
      assert.match(await rawResponse(server.url, 'GET /api/snapshot HTTP/1.0\r\n\r\n'), /^HTTP\/1\.1 403 /);
      // The refused stream requests took no slot: the one slot is still free.
      const stream = await fetch(`${server.url}api/stream`);
      assert.equal(stream.status, 200);
      await stream.body?.cancel();
    } finally {
      await server.close();
    }
  });

  it('bound to every address, serves any IP address and loopback names, and names only when listed', () => {
    const wildcard = createHostCheck({ listenHost: '0.0.0.0', allowedHosts: ['dash.example.com'] });
    for (const host of [
      '10.0.0.5:8081',
      '192.168.1.20',
      '[fe80::1]:8081',
      'localhost:8081',
      'dash.example.com',
    ]) {
      assert.equal(wildcard(host), true, host);
    }
    for (const host of ['evil.example:8081', 'localhost.evil.example', undefined]) {
      assert.equal(wildcard(host), false, String(host));
    }
    assert.equal(createHostCheck({ listenHost: '::' })('[2001:db8::1]:8081'), true);
    // Bound to one address that is not loopback: that address, not localhost.
    const single = createHostCheck({ listenHost: '10.0.0.5' });
    assert.equal(single('10.0.0.5:8081'), true);
    assert.equal(single('localhost:8081'), false);
    assert.equal(single('10.0.0.6:8081'), false);
    const v6 = createHostCheck({ listenHost: '::1' });
    assert.equal(v6('[::1]:8081'), true);
    assert.equal(v6('localhost'), true);
    assert.throws(() => createHostCheck({ listenHost: '127.0.0.1', allowedHosts: ['a.example:80'] }), {
      code: 'ERR_SPILLWAY_INVALID_OPTION',
    });
  });
});

describe('event-stream slots per client address', () => {
  it('one address gets maxStreamClientsPerAddress streams (then 429 with Retry-After); others still get in', async () => {
    const overrides = createAdminOverrides(parseLimitsConfig(LIMITS));
    const controller = createController({ id: 'ctl', config: overrides.effective() });
    const { logger } = captureLogger();
    const server = await startDashboardServer({
      controller,
      overrides,
      admin: createAdminActions({ overrides, controller, logger }),
      logger,
      maxStreamClients: 4,
      maxStreamClientsPerAddress: 2,
    });
    const open: IncomingMessage[] = [];
    // Every 127/8 address is loopback on Linux: distinct client addresses in one process.
    const subscribe = async (localAddress: string) => {
      const response = await streamFrom(server.port, localAddress);
      if (response.statusCode === 200) open.push(response);
      return response;
    };
    try {
      assert.equal((await subscribe('127.0.0.1')).statusCode, 200);
      assert.equal((await subscribe('127.0.0.1')).statusCode, 200);
      const refused = await subscribe('127.0.0.1');
      assert.equal(refused.statusCode, 429);
      assert.equal(refused.headers['retry-after'], '5');
      const body = JSON.parse(await text(refused)) as { error: { code: string } };
      assert.equal(body.error.code, 'ERR_SPILLWAY_TOO_MANY_STREAMS');
      // The slots that one client could not take are there for the others.
      assert.equal((await subscribe('127.0.0.2')).statusCode, 200);
      assert.equal((await subscribe('127.0.0.3')).statusCode, 200);
      // Every slot is taken, 127.0.0.1 holding two: a newcomer takes its oldest stream's slot.
      const evicted = open[0]!;
      const evictedEnded = new Promise<void>((resolve) => evicted.once('close', () => resolve()));
      evicted.resume();
      assert.equal((await subscribe('127.0.0.4')).statusCode, 200);
      await evictedEnded;
      open.shift();
      // Now every address holds one: nobody's stream is taken for a fifth address.
      const full = await subscribe('127.0.0.5');
      assert.equal(full.statusCode, 503);
      assert.equal(full.headers['retry-after'], '5');
      await text(full);
      // A client that closes a stream frees its slot for the next one, once the server has seen it go.
      open.pop()!.destroy();
      const again = await waitFor('a slot for 127.0.0.5', async () => {
        const response = await subscribe('127.0.0.5');
        if (response.statusCode === 200) return response;
        await text(response);
        return undefined;
      });
      assert.equal(again.statusCode, 200);
    } finally {
      for (const response of open) response.destroy();
      await server.close();
    }
  });

  it('eight addresses with four streams each cannot keep a ninth viewer out (the slots are shared fairly)', async () => {
    const overrides = createAdminOverrides(parseLimitsConfig(LIMITS));
    const controller = createController({ id: 'ctl', config: overrides.effective() });
    const { logger } = captureLogger();
    const server = await startDashboardServer({
      controller,
      overrides,
      admin: createAdminActions({ overrides, controller, logger }),
      logger,
    });
    const open: IncomingMessage[] = [];
    const subscribe = async (localAddress: string) => {
      const response = await streamFrom(server.port, localAddress);
      if (response.statusCode === 200) {
        response.resume();
        open.push(response);
      }
      return response;
    };
    try {
      for (let address = 1; address <= 8; address++) {
        for (let stream = 0; stream < 4; stream++) {
          assert.equal((await subscribe(`127.0.1.${address}`)).statusCode, 200);
        }
      }
      // The attacker's 32 streams hold every default slot; an honest viewer still gets in...
      const honest = await subscribe('127.0.2.1');
      assert.equal(honest.statusCode, 200);
      // ...and keeps its stream while the attacker reconnects from all its addresses.
      let honestClosed = false;
      honest.once('close', () => {
        honestClosed = true;
      });
      for (let address = 1; address <= 8; address++) await subscribe(`127.0.1.${address}`);
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(honestClosed, false);
    } finally {
      for (const response of open) response.destroy();
      await server.close();
    }
  });

  it('counts an IPv4-mapped address as IPv4 and an IPv6 /64 as one client', () => {
    assert.equal(streamClientKey('::ffff:10.0.0.7'), '10.0.0.7');
    assert.equal(streamClientKey('10.0.0.7'), '10.0.0.7');
    assert.equal(streamClientKey('2001:db8:1:2::1'), streamClientKey('2001:0db8:0001:0002:ffff:1:2:3'));
    assert.notEqual(streamClientKey('2001:db8:1:2::1'), streamClientKey('2001:db8:1:3::1'));
    assert.equal(streamClientKey('::1'), '0:0:0:0::/64');
    assert.equal(streamClientKey('fe80::1%eth0'), streamClientKey('fe80::2'));
  });
});

describe('admin overrides on top of the limits file', () => {
  const file = parseLimitsConfig(LIMITS);

  it('apply on top of the file and say where each value came from', () => {
    const overrides = createAdminOverrides(file);
    overrides.set('b', { mode: 'enforce' }, 1);
    overrides.set('b', { limitRps: 20 }, 2);
    const b = overrides.rule('b')!;
    assert.deepEqual(
      [b.mode, b.limitRps, b.file, b.override, b.overriddenAtMs],
      ['enforce', 20, { mode: 'shadow', limitRps: 10 }, { mode: 'enforce', limitRps: 20 }, 2],
    );
    assert.equal(overrides.effective().buckets[1]!.mode, 'enforce');
    assert.equal(overrides.fileConfig.buckets[1]!.mode, 'shadow', 'the file config is untouched');
    assert.equal(overrides.rule('nope'), undefined);
  });

  it('a value equal to the file is no override', () => {
    const overrides = createAdminOverrides(file);
    overrides.set('a', { limitRps: 100 }, 1);
    assert.equal(overrides.rule('a')!.override, undefined);
    overrides.set('b', { mode: 'enforce', limitRps: 10 }, 1);
    assert.deepEqual(overrides.rule('b')!.override, { mode: 'enforce' });
  });

  it('survive a new file, except for rules it no longer has and values it now agrees with', () => {
    const overrides = createAdminOverrides(file);
    overrides.set('a', { limitRps: 50 }, 1);
    overrides.set('b', { mode: 'enforce' }, 1);
    overrides.set('c', { limitRps: 1 }, 1);
    const next = parseLimitsConfig(
      LIMITS.replace('  - key: c\n    limitRps: 5\n', '').replace('limitRps: 100', 'limitRps: 50'),
    );
    assert.deepEqual(overrides.replaceFile(next), { dropped: ['c'] });
    assert.equal(overrides.rule('a')!.override, undefined, 'the file caught up with the override');
    assert.deepEqual(overrides.rule('b')!.override, { mode: 'enforce' });
    assert.equal(overrides.rule('c'), undefined);
    assert.equal(overrides.clear('b'), true);
    assert.equal(overrides.clear('b'), false);
  });
});

describe('admin token check', () => {
  it('accepts only `Bearer <the token>`', () => {
    assert.equal(checkBearer(undefined, TOKEN), 'missing');
    assert.equal(checkBearer('', TOKEN), 'missing');
    assert.equal(checkBearer(`Bearer ${TOKEN}`, TOKEN), 'ok');
    assert.equal(checkBearer(`bearer  ${TOKEN}`, TOKEN), 'ok');
    assert.equal(checkBearer(`Basic ${TOKEN}`, TOKEN), 'invalid');
    assert.equal(checkBearer(`Bearer ${TOKEN.slice(0, -1)}`, TOKEN), 'invalid');
    assert.equal(checkBearer(`Bearer ${TOKEN}0`, TOKEN), 'invalid');
    assert.equal(checkBearer(TOKEN, TOKEN), 'invalid');
  });
});

describe('bucket history', () => {
  const view = (version: number, keys: string[]) =>
    ({
      controller: { version, nowMs: version * 1000 },
      buckets: keys.map((key) => ({
        key,
        offeredRps: version,
        admittedRps: 0,
        limitRps: 1,
        dropRatio: 0,
        wouldDropRps: 0,
      })),
    }) as unknown as DashboardView;

  it('is a ring of the last `capacity` views', () => {
    const history = createBucketHistory({ capacity: 2 });
    history.add(view(1, ['x']));
    history.add(view(2, ['x', 'y']));
    history.add(view(3, ['y', 'x']));
    const columns = history.columns();
    assert.deepEqual(columns.versions, [2, 3]);
    assert.deepEqual(columns.buckets.x!.offeredRps, [2, 3]);
    assert.deepEqual(columns.buckets.y!.offeredRps, [2, 3]);
  });

  it("answers the newest tick's buckets only: churning keys cannot grow a response", () => {
    const history = createBucketHistory({ capacity: 300 });
    // Every tick 100 new keys (a template keyed by a client value): 30,000 keys over the ring.
    for (let tick = 1; tick <= 300; tick++) {
      history.add(
        view(
          tick,
          Array.from({ length: 100 }, (_, i) => `api:caller=t${tick}-${i}`),
        ),
      );
    }
    const columns = history.columns();
    assert.equal(Object.keys(columns.buckets).length, 100);
    assert.ok(Object.keys(columns.buckets).every((key) => key.startsWith('api:caller=t300-')));
    assert.equal(columns.buckets['api:caller=t300-0']!.offeredRps.length, 300);
  });
});

/** The status of `GET <target>` sent byte for byte, with no client-side normalisation of the path. */
function rawStatus(base: string, target: string): Promise<number> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      socket.write(`GET ${target} HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`);
    });
    let head = '';
    socket.on('data', (chunk) => {
      head += String(chunk);
    });
    socket.on('end', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0)));
    socket.on('error', reject);
  });
}

/** `GET path` with the given Host header (fetch() would not send ours), status and body. */
function get(
  port: number,
  path: string,
  host: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const request = httpRequest(
      { host: '127.0.0.1', port, path, headers: { ...headers, host }, setHost: false },
      (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => {
          body += chunk;
        });
        response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
      },
    );
    request.on('error', reject);
    request.end();
  });
}

/** Sends `text` as it is and reads the whole answer (the server closes an HTTP/1.0 exchange). */
function rawResponse(base: string, text: string): Promise<string> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(text));
    let answer = '';
    socket.on('data', (chunk) => {
      answer += String(chunk);
    });
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}

/** `GET /api/stream` from `localAddress`; resolves with the response head (the body keeps coming). */
function streamFrom(port: number, localAddress: string): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const request = httpRequest({ host: '127.0.0.1', port, path: '/api/stream', localAddress }, resolve);
    request.on('error', reject);
    request.end();
  });
}

function text(response: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let body = '';
    response.setEncoding('utf8');
    response.on('data', (chunk: string) => {
      body += chunk;
    });
    response.on('end', () => resolve(body));
    response.on('error', reject);
  });
}
