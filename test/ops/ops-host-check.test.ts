import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { createMetrics } from '../../src/ops/metrics.js';
import { type OpsServerOptions, startOpsServer } from '../../src/ops/ops-server.js';
import { type RawAnswer, rawExchange } from '../helpers/raw-http.js';

// The ops endpoint's DNS-rebinding guard: a page on evil.example that re-points its name at
// 127.0.0.1 gets the browser to send `Host: evil.example`; /metrics names buckets (tenants),
// limits and hosts, so it must not be read that way. The requests go to 127.0.0.1 with the Host
// under test, as a rebound browser sends them.

const ROUTES = ['/metrics', '/healthz', '/nope'];

async function withOps(
  options: Partial<OpsServerOptions>,
  use: (get: (path: string, host: string) => Promise<RawAnswer>, port: number) => Promise<void>,
): Promise<void> {
  const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
  const ops = await startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }), ...options });
  const get = async (path: string, host: string) => {
    const { answers } = await rawExchange(
      ops.port,
      `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(answers.length, 1, `${host} ${path}`);
    return answers[0]!;
  };
  try {
    await use(get, ops.port);
  } finally {
    await ops.close();
  }
}

function assertRefused(answer: RawAnswer, what: string): void {
  assert.equal(answer.status, 403, what);
  assert.equal(answer.headers['content-type'], 'text/plain; charset=utf-8', what);
  assert.equal(
    answer.body,
    'forbidden: this Host is not one the ops endpoint serves (DNS-rebinding guard); allow a name with --ops-allowed-host\n',
    what,
  );
  assert.doesNotMatch(answer.body, /spillway_/, what);
}

describe('ops server: Host check (DNS rebinding)', () => {
  it('on loopback (the default) serves loopback names and refuses every other Host on every route', async () => {
    await withOps({}, async (get, port) => {
      for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, 'LOCALHOST', `[::1]:${port}`]) {
        const scrape = await get('/metrics', host);
        assert.equal(scrape.status, 200, host);
        assert.match(scrape.body, /spillway_info\{component="host",id="h1"\} 1/, host);
        assert.equal((await get('/healthz', host)).status, 200, host);
      }
      for (const host of [
        `evil.example:${port}`,
        'evil.example',
        `127.0.0.1.nip.io:${port}`,
        `localhost.:${port}`,
        `10.0.0.5:${port}`,
        `[::2]:${port}`,
        'localhost:80:80',
        '',
      ]) {
        // Before routing: an unknown path is refused too, not told it is unknown.
        for (const path of ROUTES) assertRefused(await get(path, host), `${host} ${path}`);
      }
    });
  });

  it('bound to every address, serves any IP address and loopback names, never an unlisted name', async () => {
    await withOps({ host: '0.0.0.0' }, async (get, port) => {
      // What Prometheus's kubernetes_sd (pod role) and a kubelet httpGet probe send: the pod IP.
      for (const host of [`10.244.1.17:${port}`, '192.168.1.20', '[fe80::1]:9091', `localhost:${port}`]) {
        assert.equal((await get('/metrics', host)).status, 200, host);
        assert.equal((await get('/healthz', host)).status, 200, host);
      }
      for (const host of [
        `evil.example:${port}`,
        'spillway-controller.spillway.svc',
        'localhost.evil.example',
      ]) {
        for (const path of ROUTES) assertRefused(await get(path, host), `${host} ${path}`);
      }
    });
  });

  it('serves each allowedHosts name, case-insensitively and on any port', async () => {
    await withOps(
      { host: '0.0.0.0', allowedHosts: ['metrics.internal.example', '[fd00::7]'] },
      async (get) => {
        for (const host of ['metrics.internal.example', 'METRICS.Internal.example:9090', '[FD00::7]:9090']) {
          assert.equal((await get('/metrics', host)).status, 200, host);
          assert.equal((await get('/healthz', host)).status, 200, host);
        }
        for (const host of ['sub.metrics.internal.example', 'metrics.internal.example.evil.example']) {
          for (const path of ROUTES) assertRefused(await get(path, host), `${host} ${path}`);
        }
      },
    );
  });

  it('the 400s of a malformed head still come first: two Host lines, one of them served', async () => {
    await withOps({}, async (_get, port) => {
      const { answers } = await rawExchange(
        port,
        'GET /metrics HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n',
      );
      assert.equal(answers[0]?.status, 400);
    });
  });

  it('refuses an allowedHosts entry no Host header could carry, with ERR_SPILLWAY_INVALID_OPTION', async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    for (const entry of ['https://metrics.example', 'metrics.example:9090', 'metrics.example/metrics', '']) {
      await assert.rejects(
        startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }), allowedHosts: [entry] }),
        (e) => isSpillwayError(e, 'ERR_SPILLWAY_INVALID_OPTION'),
        entry,
      );
    }
  });
});
