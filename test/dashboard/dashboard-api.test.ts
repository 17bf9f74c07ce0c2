import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { AdminActionResult } from '../../src/dashboard/admin-actions.js';
import type { BucketHistoryColumns } from '../../src/dashboard/bucket-history.js';
import type { DashboardView } from '../../src/dashboard/dashboard-view.js';
import { Mode, type ReportResponse } from '../../src/gen/spillway/v1/control_pb.js';
import { createGlobalLimiter, type GlobalLimiter } from '../../src/global/global-limiter.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import {
  type SpillwayProcess,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { readEvents } from './sse-reader.js';

// The dashboard API of a real controller process, over real sockets, with a data-plane host (a
// GlobalLimiter in this process, over gRPC) whose received directives are recorded, so that "an
// admin change is in force from the controller's next ratio computation" is checked on what the host
// received.

const TOKEN = 'test-admin-token-0123456789';
const INTERVAL_MS = 400;
const SHADOW = 'search';
const ENFORCE = 'checkout';

function limitsYaml(checkoutLimitRps: number): string {
  return [
    'version: 1',
    `intervalMs: ${INTERVAL_MS}`,
    'buckets:',
    `  - key: ${ENFORCE}`,
    `    limitRps: ${checkoutLimitRps}`,
    '    mode: enforce',
    `  - key: ${SHADOW}`,
    '    limitRps: 50',
    '    mode: shadow',
    '  - template: "api:caller=*"',
    '    limitRps: 20',
    '',
  ].join('\n');
}

interface Received {
  bucket: string;
  version: number;
  mode: Mode;
  limitRps: number;
}

/** A client that records every directive in every reply, in arrival order. */
function recording(client: ControlClient, into: Received[]): ControlClient {
  return {
    async report(request, options) {
      const reply: ReportResponse = await client.report(request, options);
      for (const d of reply.directives) {
        into.push({ bucket: d.bucket, version: Number(d.version), mode: d.mode, limitRps: d.limitRps });
      }
      return reply;
    },
    close: () => client.close(),
    target: client.target,
  };
}

describe('dashboard API on a real controller', { timeout: 120_000 }, () => {
  let dir = '';
  let limitsPath = '';
  let controller: SpillwayProcess;
  let readOnly: SpillwayProcess;
  let base = '';
  let limiter: GlobalLimiter;
  let load: NodeJS.Timeout | undefined;
  const received: Received[] = [];

  const admin = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${base}${path}`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${TOKEN}`,
        'content-type': 'application/json',
        'x-spillway-actor': 'test suite',
        ...headers,
      },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  const snapshot = async () => (await (await fetch(`${base}api/snapshot`)).json()) as DashboardView;
  const hostBucket = (key: string) => limiter.snapshot().buckets.find((b) => b.key === key);

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-dashboard-'));
    limitsPath = join(dir, 'limits.yaml');
    writeFileSync(limitsPath, limitsYaml(100));
    const common = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--dashboard', '127.0.0.1:0'];
    [controller, readOnly] = await Promise.all([
      startSpillway('controller', [
        'controller',
        '--config',
        limitsPath,
        ...common,
        '--admin-token',
        TOKEN,
        '--dashboard-allowed-host',
        'dash.example.com',
      ]),
      startSpillway('read-only controller', [
        'controller',
        '--config',
        limitsPath,
        ...common,
        '--dashboard-max-streams-per-address',
        '1',
      ]),
    ]);
    const listening = controller.output.find((line) => line.includes('"listening"'))!;
    base = (JSON.parse(listening) as { dashboard: string }).dashboard;
    assert.match(base, /^http:\/\/127\.0\.0\.1:\d+\/$/);

    limiter = createGlobalLimiter({
      reporterId: 'test-host',
      zone: 'z1',
      clients: [recording(createGrpcControlClient(controller.grpc!), received)],
      intervalMs: INTERVAL_MS,
      burstGuard: false,
    });
    const search = limiter.bucket(SHADOW);
    const checkout = limiter.bucket(ENFORCE);
    const caller = limiter.bucket('api:caller=acme');
    limiter.start();
    // About 200/s on each bucket: over the shadow limit (50) and over checkout's (100).
    load = setInterval(() => {
      for (let i = 0; i < 4; i++) {
        search.allow();
        checkout.allow();
        caller.allow();
      }
    }, 20);
  });

  after(async () => {
    clearInterval(load);
    await limiter?.stop({ finalReport: false });
    await Promise.all([controller, readOnly].filter(Boolean).map((p) => stopSpillway(p, 3_000)));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('GET /api/snapshot shows buckets, rules, children and whether admin actions are on', async () => {
    const view = await waitFor('the host in the snapshot', async () => {
      const v = await snapshot();
      return v.buckets.some((b) => b.key === SHADOW && b.offeredRps > 0) ? v : undefined;
    });
    assert.equal(view.admin.enabled, true);
    const search = view.buckets.find((b) => b.key === SHADOW)!;
    assert.equal(search.mode, 'shadow');
    assert.equal(search.limitRps, 50);
    assert.equal(search.overridden, false);
    // About 200/s is offered; a starved timer in this process offers less, never more.
    assert.ok(search.offeredRps > 0 && search.offeredRps < 400, `offered ${search.offeredRps}`);
    const acme = view.buckets.find((b) => b.key === 'api:caller=acme')!;
    assert.equal(acme.rule, 'api:caller=*');
    assert.deepEqual(
      view.rules.map((r) => [r.rule, r.kind, r.mode, r.limitRps, r.override]),
      [
        [ENFORCE, 'key', 'enforce', 100, undefined],
        [SHADOW, 'key', 'shadow', 50, undefined],
        ['api:caller=*', 'template', 'enforce', 20, undefined],
      ],
    );
    const child = view.children.find((c) => c.id === 'test-host')!;
    assert.equal(child.tier, 'host');
    assert.equal(child.zone, 'z1');
    assert.equal(child.freshness, 'fresh');
    assert.ok(child.ageMs >= 0 && child.ageMs < 5_000);
    assert.equal(view.controller.intervalMs, INTERVAL_MS);

    const readOnlyView = (await (
      await fetch(
        `${JSON.parse(readOnly.output.find((l) => l.includes('"listening"'))!).dashboard}api/snapshot`,
      )
    ).json()) as DashboardView;
    assert.equal(readOnlyView.admin.enabled, false);
  });

  it('--dashboard-allowed-host: that name is served, a rebound name is refused with 403', async () => {
    const { port } = new URL(base);
    const statusFor = (host: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const request = httpRequest(
          { host: '127.0.0.1', port, path: '/api/snapshot', headers: { host }, setHost: false },
          (response) => {
            let body = '';
            response.on('data', (chunk) => {
              body += String(chunk);
            });
            response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
          },
        );
        request.on('error', reject);
        request.end();
      });
    assert.equal((await statusFor('dash.example.com')).status, 200);
    assert.equal((await statusFor(`localhost:${port}`)).status, 200);
    const refused = await statusFor(`evil.example:${port}`);
    assert.equal(refused.status, 403);
    assert.equal(
      (JSON.parse(refused.body) as { error: { code: string } }).error.code,
      'ERR_SPILLWAY_HOST_NOT_ALLOWED',
    );
  });

  it('--dashboard-max-streams-per-address: a second live page from one address gets 429 until the first closes', async () => {
    const readOnlyBase = JSON.parse(readOnly.output.find((l) => l.includes('"listening"'))!).dashboard;
    const first = new AbortController();
    const open = await fetch(`${readOnlyBase}api/stream`, { signal: first.signal });
    assert.equal(open.status, 200);
    const second = await fetch(`${readOnlyBase}api/stream`);
    assert.equal(second.status, 429);
    assert.equal(second.headers.get('retry-after'), '5');
    assert.equal(
      ((await second.json()) as { error: { code: string } }).error.code,
      'ERR_SPILLWAY_TOO_MANY_STREAMS',
    );
    first.abort();
    await open.body?.cancel().catch(() => {});
    await waitFor('the slot to be freed', async () => {
      const again = new AbortController();
      const response = await fetch(`${readOnlyBase}api/stream`, { signal: again.signal });
      again.abort();
      await response.body?.cancel().catch(() => {});
      return response.status === 200 ? true : undefined;
    });
  });

  it('GET /api/history has one column entry per tick, in order', async () => {
    const history = await waitFor('three ticks of history', async () => {
      const h = (await (await fetch(`${base}api/history`)).json()) as BucketHistoryColumns;
      return h.versions.length >= 3 && h.buckets[SHADOW] ? h : undefined;
    });
    for (let i = 1; i < history.versions.length; i++) {
      assert.ok(history.versions[i]! > history.versions[i - 1]!, 'versions increase');
      assert.ok(history.atMs[i]! > history.atMs[i - 1]!, 'time increases');
    }
    assert.equal(history.buckets[SHADOW]!.offeredRps.length, history.atMs.length);
  });

  it('GET /api/stream sends the current view at once, then one event per controller tick', async () => {
    const events = await readEvents(`${base}api/stream`, 3, 15_000);
    assert.deepEqual(
      events.map((e) => e.event),
      ['snapshot', 'tick', 'tick'],
    );
    const ticks = events.map((e) => (JSON.parse(e.data) as DashboardView).controller.ticks);
    assert.equal(ticks[1], ticks[0]! + 1, `consecutive ticks: ${ticks}`);
    assert.equal(ticks[2], ticks[1]! + 1, `consecutive ticks: ${ticks}`);
    const first = JSON.parse(events[0]!.data) as DashboardView;
    assert.ok(first.buckets.some((b) => b.key === SHADOW));
  });

  it('GET /api/tuning says honestly that no engine is connected', async () => {
    const response = await fetch(`${base}api/tuning`);
    assert.equal(response.status, 200);
    assert.deepEqual(await response.json(), { engine: null, suggestions: [] });
  });

  it('admin actions: no token 401, wrong token 401, admin off 403, right token 200', async () => {
    const body = { rule: ENFORCE, limitRps: 100 };
    const missing = await admin('api/admin/limit', body, { authorization: '' });
    assert.equal(missing.status, 401);
    assert.equal(missing.headers.get('www-authenticate'), 'Bearer realm="spillway-admin"');
    assert.equal(
      ((await missing.json()) as { error: { code: string } }).error.code,
      'ERR_SPILLWAY_UNAUTHENTICATED',
    );

    const wrong = await admin('api/admin/limit', body, { authorization: `Bearer ${TOKEN}x` });
    assert.equal(wrong.status, 401);
    assert.match(((await wrong.json()) as { error: { message: string } }).error.message, /wrong admin token/);

    const readOnlyBase = JSON.parse(readOnly.output.find((l) => l.includes('"listening"'))!).dashboard;
    const disabled = await fetch(`${readOnlyBase}api/admin/limit`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    assert.equal(disabled.status, 403);
    const disabledBody = (await disabled.json()) as { error: { code: string; message: string } };
    assert.equal(disabledBody.error.code, 'ERR_SPILLWAY_ADMIN_DISABLED');
    assert.match(disabledBody.error.message, /--admin-token or SPILLWAY_ADMIN_TOKEN/);

    const check = await fetch(`${base}api/admin/check`, {
      headers: { authorization: `Bearer ${TOKEN}`, 'x-spillway-actor': 'test suite' },
    });
    assert.equal(check.status, 200);
    assert.deepEqual(await check.json(), { ok: true, actor: 'test suite' });
  });

  it('bad input: 400/404/405/413/415 with stable codes, nothing applied', async () => {
    const cases: [Promise<Response>, number, string, RegExp?][] = [
      [admin('api/admin/mode', '{"rule":'), 400, 'ERR_SPILLWAY_INVALID_REQUEST', /not JSON/],
      [
        admin('api/admin/mode', { rule: SHADOW, mode: 'off' }),
        400,
        'ERR_SPILLWAY_INVALID_REQUEST',
        /^mode: /,
      ],
      [
        admin('api/admin/limit', { rule: ENFORCE, limitRps: -1 }),
        400,
        'ERR_SPILLWAY_INVALID_REQUEST',
        /^limitRps: /,
      ],
      [
        admin('api/admin/limit', { rule: ENFORCE, limitRps: '5' }),
        400,
        'ERR_SPILLWAY_INVALID_REQUEST',
        /^limitRps: /,
      ],
      [
        admin('api/admin/limit', { rule: ENFORCE, limitRps: 5, extra: 1 }),
        400,
        'ERR_SPILLWAY_INVALID_REQUEST',
        /unknown field "extra"/,
      ],
      [admin('api/admin/limit', [1, 2]), 400, 'ERR_SPILLWAY_INVALID_REQUEST'],
      [
        admin('api/admin/mode', { rule: 'nope', mode: 'enforce' }),
        404,
        'ERR_SPILLWAY_UNKNOWN_RULE',
        /'nope'/,
      ],
      [admin('api/admin/tuning/accept', { id: 'x' }), 404, 'ERR_SPILLWAY_UNKNOWN_SUGGESTION'],
      [
        admin('api/admin/mode', { rule: SHADOW, mode: 'enforce' }, { 'content-type': 'text/plain' }),
        415,
        'ERR_SPILLWAY_UNSUPPORTED_MEDIA_TYPE',
      ],
      [
        admin('api/admin/mode', { rule: 'x'.repeat(20_000), mode: 'enforce' }),
        413,
        'ERR_SPILLWAY_PAYLOAD_TOO_LARGE',
      ],
      [
        admin(
          'api/admin/mode',
          { rule: SHADOW, mode: 'enforce' },
          { 'x-spillway-actor': 'name"with"quotes' },
        ),
        400,
        'ERR_SPILLWAY_INVALID_REQUEST',
        /x-spillway-actor/,
      ],
      [fetch(`${base}api/admin/mode`), 405, 'ERR_SPILLWAY_METHOD_NOT_ALLOWED'],
      [fetch(`${base}api/nothing`), 404, 'ERR_SPILLWAY_NOT_FOUND'],
    ];
    for (const [pending, status, code, message] of cases) {
      const response = await pending;
      const body = (await response.json()) as { error: { code: string; message: string } };
      assert.equal(response.status, status, `${code}: ${JSON.stringify(body)}`);
      assert.equal(body.error.code, code);
      if (message) assert.match(body.error.message, message);
    }
    const view = await snapshot();
    assert.equal(view.rules.find((r) => r.rule === SHADOW)!.mode, 'shadow', 'nothing applied');
    assert.ok(view.rules.every((r) => r.override === undefined));
  });

  it('flip shadow -> enforce: directives from the next computation on carry it, the host starts dropping, audited', async () => {
    // The host holds shadow directives and drops nothing on the shadow bucket.
    await waitFor('a shadow directive at the host', async () =>
      hostBucket(SHADOW)?.mode === 'shadow' && hostBucket(SHADOW)!.wouldDrop > 0 ? true : undefined,
    );
    assert.equal(hostBucket(SHADOW)!.dropped, 0);

    const response = await admin('api/admin/mode', { rule: SHADOW, mode: 'enforce' });
    assert.equal(response.status, 200);
    const result = (await response.json()) as AdminActionResult;
    assert.equal(result.action, 'set-mode');
    assert.deepEqual(result.before, { mode: 'shadow', limitRps: 50 });
    assert.deepEqual(result.after, { mode: 'enforce', limitRps: 50 });
    const startedAt = performance.now();

    await waitFor('an enforce directive at the host', async () =>
      hostBucket(SHADOW)?.mode === 'enforce' ? true : undefined,
    );
    const elapsedMs = performance.now() - startedAt;
    // What the host received, by the controller version that computed it: every directive before
    // the change's version was shadow, every one from it on is enforce.
    const search = received.filter((d) => d.bucket === SHADOW);
    for (const d of search) {
      const expected = d.version >= result.appliesFromVersion ? Mode.ENFORCE : Mode.SHADOW;
      assert.equal(
        d.mode,
        expected,
        `directive of version ${d.version} (change at ${result.appliesFromVersion})`,
      );
    }
    assert.ok(search.some((d) => d.mode === Mode.SHADOW) && search.some((d) => d.mode === Mode.ENFORCE));
    // Wall time: the next computation, then the host's next report (two intervals), with room for a
    // slow box.
    assert.ok(elapsedMs < 2 * INTERVAL_MS + 3_000, `took ${elapsedMs.toFixed(0)} ms`);

    const droppedAtFlip = hostBucket(SHADOW)!.dropped;
    await waitFor('the host dropping on the flipped bucket', async () =>
      hostBucket(SHADOW)!.dropped > droppedAtFlip + 20 ? true : undefined,
    );

    const auditLine = await waitFor('the audit line', async () =>
      controller.output.find((line) => line.includes('"audit":true') && line.includes('"set-mode"')),
    );
    const audit = JSON.parse(auditLine) as Record<string, unknown>;
    assert.equal(audit.msg, 'admin action');
    assert.equal(audit.actor, 'test suite');
    assert.equal(audit.remote, '127.0.0.1');
    assert.equal(audit.rule, SHADOW);
    assert.deepEqual(audit.before, { mode: 'shadow', limitRps: 50 });
    assert.deepEqual(audit.after, { mode: 'enforce', limitRps: 50 });
    assert.ok(!auditLine.includes(TOKEN), 'the token is never logged');

    const view = await snapshot();
    const rule = view.rules.find((r) => r.rule === SHADOW)!;
    assert.deepEqual(rule.override, { mode: 'enforce' });
    assert.deepEqual(rule.file, { mode: 'shadow', limitRps: 50 });
  });

  it('limit change: directives from the next computation on carry the new limit', async () => {
    const response = await admin('api/admin/limit', { rule: ENFORCE, limitRps: 40 });
    assert.equal(response.status, 200);
    const result = (await response.json()) as AdminActionResult;
    assert.deepEqual([result.before.limitRps, result.after.limitRps], [100, 40]);
    await waitFor('the new limit at the host', async () =>
      hostBucket(ENFORCE)?.limitRps === 40 ? true : undefined,
    );
    for (const d of received.filter((r) => r.bucket === ENFORCE)) {
      assert.equal(d.limitRps, d.version >= result.appliesFromVersion ? 40 : 100, `version ${d.version}`);
    }
    assert.ok(controller.output.some((l) => l.includes('"audit":true') && l.includes('"set-limit"')));
  });

  it('overrides survive a reload of the limits file, and clearing one restores the file', async () => {
    writeFileSync(limitsPath, limitsYaml(120));
    const reloaded = await waitFor('the reloaded file', async () => {
      const v = await snapshot();
      const rule = v.rules.find((r) => r.rule === ENFORCE)!;
      return rule.file.limitRps === 120 ? v : undefined;
    });
    const checkout = reloaded.rules.find((r) => r.rule === ENFORCE)!;
    assert.equal(checkout.limitRps, 40, 'the override stays on top of the new file');
    assert.equal(reloaded.rules.find((r) => r.rule === SHADOW)!.mode, 'enforce');

    const cleared = await admin('api/admin/clear-override', { rule: SHADOW });
    assert.equal(cleared.status, 200);
    const result = (await cleared.json()) as AdminActionResult;
    assert.deepEqual([result.before.mode, result.after.mode], ['enforce', 'shadow']);
    await waitFor('shadow again at the host', async () =>
      hostBucket(SHADOW)?.mode === 'shadow' ? true : undefined,
    );
    const view = await snapshot();
    assert.equal(view.rules.find((r) => r.rule === SHADOW)!.override, undefined);
  });
});
