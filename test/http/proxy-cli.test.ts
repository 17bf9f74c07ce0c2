import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type ServerResponse } from 'node:http';
import { type AddressInfo, connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { until } from '../helpers/until.js';
import {
  type SpillwayProcess,
  spawnSpillwayRaw,
  startSpillway,
  stopSpillway,
} from '../integration/spillway-process.js';
import { send, startUpstream } from './proxy-harness.js';

const dir = mkdtempSync(join(tmpdir(), 'spillway-proxy-cli-'));
const started: SpillwayProcess[] = [];
after(async () => {
  for (const p of started) await stopSpillway(p, 2_000);
  rmSync(dir, { recursive: true, force: true });
});

function proxyAddress(p: SpillwayProcess): string {
  const line = p.output.find((l) => l.includes('"listening"'))!;
  return (JSON.parse(line) as { proxy: string }).proxy;
}

function rules(upstreamUrl: string, limit: number): string {
  return `version: 1
upstream:
  url: ${upstreamUrl}
backend:
  kind: local
buckets:
  - name: api
    limit: ${limit}
    windowSec: 60
`;
}

describe('spillway proxy with a dead upstream (issue #35)', { timeout: 60_000 }, () => {
  it('logs the 502s (not each one) and /healthz says degraded with the reason, until the upstream answers', async () => {
    // A port nothing listens on: every forward is refused.
    const probe = await startUpstream();
    const port = probe.port;
    await probe.close();
    const file = join(dir, 'dead-upstream.yaml');
    writeFileSync(file, rules(`http://127.0.0.1:${port}`, 1000));
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const base = `http://${proxyAddress(p)}`;
    for (let i = 0; i < 5; i++) assert.equal((await send(`${base}/`)).status, 502);
    await until(
      'the failure is logged',
      () => p.output.some((l) => l.includes('the upstream is failing')),
      10_000,
    );
    const lines = p.output.filter((l) => l.includes('the upstream is failing'));
    assert.equal(lines.length, 1, 'one line for the streak, not one per request');
    assert.match(lines[0]!, /upstream refused the connection \(ECONNREFUSED\); answered 502/);
    const health = (await (await fetch(`http://${p.ops}/healthz`)).json()) as {
      ok: boolean;
      status: string;
      upstream: { state: string; reason: string; consecutiveFailures: number };
    };
    assert.equal(health.ok, true, 'the proxy itself serves: 200, not 503');
    assert.equal(health.status, 'degraded');
    assert.equal(health.upstream.state, 'failing');
    assert.equal(health.upstream.reason, 'upstream refused the connection (ECONNREFUSED)');
    assert.equal(health.upstream.consecutiveFailures, 5);

    // The upstream comes back on its port.
    const revived = createHttpServer((_req, res) => res.end('ok'));
    await new Promise<void>((resolve) => revived.listen(port, '127.0.0.1', resolve));
    try {
      await until('a forward succeeds', async () => (await send(`${base}/`)).status === 200, 10_000);
      const healed = (await (await fetch(`http://${p.ops}/healthz`)).json()) as {
        status: string;
        upstream: { state: string; reason: string | null };
      };
      assert.equal(healed.status, 'ok');
      assert.deepEqual([healed.upstream.state, healed.upstream.reason], ['ok', null]);
      await until(
        'the recovery is logged',
        () => p.output.some((l) => l.includes('the upstream answers again')),
        10_000,
      );
    } finally {
      revived.closeAllConnections();
      await new Promise((resolve) => revived.close(resolve));
    }
  });
});

describe('spillway proxy (process)', { timeout: 60_000 }, () => {
  it('reloads the rules file on change and on SIGHUP, keeping the old rules when the new file is invalid', async (t) => {
    const upstream = await startUpstream();
    t.after(upstream.close);
    const file = join(dir, 'reload.yaml');
    writeFileSync(file, rules(upstream.url, 1));
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const base = `http://${proxyAddress(p)}`;
    assert.equal((await send(`${base}/`)).status, 200);
    assert.equal((await send(`${base}/`)).status, 429);

    writeFileSync(file, rules(upstream.url, 1000));
    await until('the file change is applied', async () => (await send(`${base}/`)).status === 200, 15_000);
    assert.equal((await send(`${base}/`)).headers['ratelimit-policy'], '"api";q=1000;w=60');

    writeFileSync(file, `${rules(upstream.url, 5)}    mode: loud\n`);
    p.child.kill('SIGHUP');
    await until(
      'the failed reload is logged',
      () => p.output.some((l) => l.includes('rules reload failed')),
      15_000,
    );
    const failure = p.output.find((l) => l.includes('rules reload failed'))!;
    assert.match(
      failure,
      /reload\.yaml:10:11: buckets\[0\]\.mode: must be one of \\"enforce\\", \\"shadow\\", got \\"loud\\"/,
    );
    assert.equal(
      (await send(`${base}/`)).headers['ratelimit-policy'],
      '"api";q=1000;w=60',
      'old rules in force',
    );
    const health = (await (await fetch(`http://${p.ops}/healthz`)).json()) as {
      ok: boolean;
      lastReloadError: string;
    };
    assert.equal(health.ok, true);
    assert.match(health.lastReloadError, /must be one of/);
    // The proxy names itself in spillway_info: dashboards tell sidecars from `spillway host` processes.
    const metricsText = await (await fetch(`http://${p.ops}/metrics`)).text();
    assert.match(metricsText, /^spillway_info\{component="proxy",id="[^"]+"\} 1$/m);
  });

  it('a rules file put back as it was after a failed reload clears the reload error', async (t) => {
    const upstream = await startUpstream();
    t.after(upstream.close);
    const file = join(dir, 'revert.yaml');
    const good = rules(upstream.url, 100);
    writeFileSync(file, good);
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const health = async () =>
      (await (await fetch(`http://${p.ops}/healthz`)).json()) as { lastReloadError: string | null };
    const metric = async (series: string) => {
      const text = await (await fetch(`http://${p.ops}/metrics`)).text();
      const line = new RegExp(`^${series.replace(/[{}]/g, '\\$&')} (\\d+)$`, 'm');
      return Number(line.exec(text)?.[1] ?? Number.NaN);
    };
    const reloads = (result: string) => metric(`spillway_proxy_rules_reloads_total{result="${result}"}`);
    const lastReloadSuccessful = () => metric('spillway_proxy_rules_last_reload_successful');
    assert.equal(await lastReloadSuccessful(), 1);

    writeFileSync(file, `${good}garbage: [\n`);
    await until('the broken file is reported', async () => (await health()).lastReloadError !== null, 15_000);
    assert.match((await health()).lastReloadError!, /revert\.yaml:11:1: YAML syntax error/);
    assert.equal(await lastReloadSuccessful(), 0);

    writeFileSync(file, good);
    await until('the error is cleared', async () => (await health()).lastReloadError === null, 15_000);
    // The file loaded again: an ok reload, as SIGHUP with the same file would be.
    assert.equal(await reloads('ok'), 1);
    assert.equal(await reloads('error'), 1);
    assert.equal(await lastReloadSuccessful(), 1);
    assert.equal((await send(`http://${proxyAddress(p)}/`)).headers['ratelimit-policy'], '"api";q=100;w=60');
  });

  it('on SIGTERM stops accepting, finishes an in-flight slow request, then exits 0', async (t) => {
    const held: ServerResponse[] = [];
    const upstream = await startUpstream((_req, res) => {
      held.push(res);
    });
    t.after(upstream.close);
    const file = join(dir, 'drain.yaml');
    writeFileSync(file, rules(upstream.url, 100));
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const base = `http://${proxyAddress(p)}`;
    const inFlight = send(`${base}/slow`);
    await until('the upstream holds the request', () => held.length === 1);
    p.child.kill('SIGTERM');
    await until('draining is reported', async () => {
      const response = await fetch(`http://${p.ops}/healthz`).catch(() => undefined);
      return response?.status === 503;
    });
    await assert.rejects(send(`${base}/new`), /ECONNREFUSED|ECONNRESET|socket hang up/, 'no new connections');
    assert.equal(p.running, true, 'still running while a request is in flight');
    // A reload asked for during the drain is ignored: it would otherwise get Node's default
    // action for SIGHUP and end the process, cutting the request.
    p.child.kill('SIGHUP');
    await until('the SIGHUP is logged', () => p.output.some((l) => l.includes('SIGHUP while shutting down')));
    assert.equal(p.running, true, 'a SIGHUP during the drain does not end the process');
    held[0]!.end('finally');
    const response = await inFlight;
    assert.equal(response.status, 200);
    assert.equal(response.body, 'finally');
    assert.equal(await p.exited, 0);
  });

  it('with --shutdown-delay-ms keeps accepting new connections after SIGTERM, reporting 503 on /healthz, then drains and exits 0', async (t) => {
    const upstream = await startUpstream((_req, res) => res.end('served'));
    t.after(upstream.close);
    const file = join(dir, 'delay.yaml');
    writeFileSync(file, rules(upstream.url, 100));
    const delayMs = 4_000;
    const p = await startSpillway('proxy', [
      'proxy',
      '--config',
      file,
      '--listen',
      ':0',
      '--ops',
      ':0',
      '--shutdown-delay-ms',
      String(delayMs),
    ]);
    started.push(p);
    const base = `http://${proxyAddress(p)}`;
    const signalledMs = performance.now();
    p.child.kill('SIGTERM');
    await until('not ready is reported', async () => {
      const response = await fetch(`http://${p.ops}/healthz`).catch(() => undefined);
      return response?.status === 503 && ((await response.json()) as { stopping: boolean }).stopping;
    });
    // A new connection (send uses no keep-alive agent), as from a peer whose endpoints are not yet updated.
    const late = await send(`${base}/late`);
    const answeredMs = performance.now() - signalledMs;
    assert.ok(
      answeredMs < delayMs,
      `answered ${answeredMs} ms after SIGTERM: inside the delay, not after it`,
    );
    assert.equal(late.status, 200);
    assert.equal(late.body, 'served');
    assert.equal(await p.exited, 0);
    assert.ok(performance.now() - signalledMs >= delayMs, 'the drain waits for the delay');
  });

  it('reloads a rules file mounted as Kubernetes mounts a ConfigMap: the ..data symlink swapped', async (t) => {
    const upstream = await startUpstream();
    t.after(upstream.close);
    // What the kubelet's atomic writer makes: a timestamped directory, `..data` pointing at it,
    // and the file a symlink through `..data`. An update writes a new directory and renames a
    // new `..data` over the old one: no event ever names the file itself.
    const mount = mkdtempSync(join(dir, 'configmap-'));
    mkdirSync(join(mount, '..v1'));
    writeFileSync(join(mount, '..v1', 'rules.yaml'), rules(upstream.url, 1));
    symlinkSync('..v1', join(mount, '..data'));
    symlinkSync(join('..data', 'rules.yaml'), join(mount, 'rules.yaml'));
    const file = join(mount, 'rules.yaml');
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const base = `http://${proxyAddress(p)}`;
    assert.equal((await send(`${base}/`)).headers['ratelimit-policy'], '"api";q=1;w=60');
    mkdirSync(join(mount, '..v2'));
    writeFileSync(join(mount, '..v2', 'rules.yaml'), rules(upstream.url, 1000));
    symlinkSync('..v2', join(mount, '..data_tmp'));
    renameSync(join(mount, '..data_tmp'), join(mount, '..data'));
    await until(
      'the new rules apply',
      async () => (await send(`${base}/`)).headers['ratelimit-policy'] === '"api";q=1000;w=60',
      15_000,
    );
  });

  it('exits 1 when the ops port is taken, instead of running on without it', async (t) => {
    const upstream = await startUpstream();
    t.after(upstream.close);
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    t.after(() => new Promise<void>((resolve) => taken.close(() => resolve())));
    const file = join(dir, 'ops-taken.yaml');
    writeFileSync(file, rules(upstream.url, 100));
    const { port } = taken.address() as AddressInfo;
    const child = spawnSpillwayRaw([
      'proxy',
      '--config',
      file,
      '--listen',
      ':0',
      '--ops',
      `127.0.0.1:${port}`,
    ]);
    let stderr = '';
    child.stderr!.on('data', (data: Buffer) => {
      stderr += data.toString();
    });
    child.stdout!.resume();
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    assert.equal(code, 1);
    assert.match(stderr, /EADDRINUSE/);
  });

  it('refuses a --drain-timeout-ms past what a timer can hold, with exit 2', async () => {
    const child = spawnSpillwayRaw(['proxy', '--config', 'unused.yaml', '--drain-timeout-ms', '3000000000']);
    let stderr = '';
    child.stderr!.on('data', (data: Buffer) => {
      stderr += data.toString();
    });
    child.stdout!.resume();
    assert.equal(await new Promise<number | null>((resolve) => child.once('exit', resolve)), 2);
    assert.match(stderr, /--drain-timeout-ms must be a number from 0 to 86400000, got '3000000000'/);
  });

  it('an invalid rules file exits 2 with file:line:column', async () => {
    const file = join(dir, 'invalid.yaml');
    writeFileSync(
      file,
      'version: 1\nupstream:\n  url: http://127.0.0.1:1\nbackend:\n  kind: local\nbuckets:\n  - name: api\n    limit: 10\n    windowSec: 60\n    match:\n      path: /v1/*/x\n',
    );
    const child = spawnSpillwayRaw(['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    let stderr = '';
    child.stderr!.on('data', (data: Buffer) => {
      stderr += data.toString();
    });
    child.stdout!.resume();
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    assert.equal(code, 2);
    assert.equal(
      stderr.trim(),
      `spillway proxy: ${file}:11:13: buckets[0].match.path: "/v1/*/x": "*" is only allowed as the last segment (ERR_SPILLWAY_INVALID_CONFIG)`,
    );
  });

  it('counts a WebSocket upgrade the dead upstream refused like a request: logged, /healthz degraded', async () => {
    const probe = await startUpstream();
    const port = probe.port;
    await probe.close();
    const file = join(dir, 'dead-upstream-upgrade.yaml');
    writeFileSync(file, rules(`http://127.0.0.1:${port}`, 1000));
    const p = await startSpillway('proxy', ['proxy', '--config', file, '--listen', ':0', '--ops', ':0']);
    started.push(p);
    const [host, proxyPort] = proxyAddress(p).split(':') as [string, string];
    const head = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(proxyPort), host, () => {
        socket.write(
          'GET /ws HTTP/1.1\r\nHost: example.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n' +
            'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
        );
      });
      let answer = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => {
        answer += chunk;
      });
      socket.on('close', () => resolve(answer));
      socket.on('error', reject);
    });
    assert.match(head, /^HTTP\/1\.1 502 /);
    const health = (await (await fetch(`http://${p.ops}/healthz`)).json()) as {
      status: string;
      upstream: { state: string; consecutiveFailures: number };
    };
    assert.equal(health.status, 'degraded');
    assert.equal(health.upstream.state, 'failing');
    assert.equal(health.upstream.consecutiveFailures, 1);
    await until(
      'the failure is logged',
      () => p.output.some((l) => l.includes('the upstream is failing')),
      10_000,
    );
  });
});
