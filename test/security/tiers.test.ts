import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { isSpillwayError } from '../../src/core/errors.js';
import { ReportRequestSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import {
  createGrpcControlClient,
  type GrpcClientTlsOptions,
} from '../../src/transport/grpc-control-client.js';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';

// Tiers authenticate each other: the controller requires mutual TLS and the shared token, the
// aggregator requires TLS and the token from hosts and binds reports to its zone, and the
// dashboard's admin actions need the admin token. A full loop runs over all of it; then every
// way in without the right credentials is tried and refused.

const TOKEN = 'tier-token-0123456789abcdef';
/** What the aggregator requires from its hosts (--child-token-file): not the controller's token. */
const HOST_TOKEN = 'host-token-0123456789abcdef';
const ADMIN_TOKEN = 'admin-token-0123456789abcdef';

function haveOpenssl(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** A throwaway CA and two leaf certificates (P-256, valid for 127.0.0.1 and localhost). */
function makeCertificates(dir: string) {
  const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  ssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '2',
    '-subj',
    '/CN=spillway-test-ca',
  );
  writeFileSync(join(dir, 'san.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  for (const name of ['server', 'client']) {
    ssl('req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=spillway-${name}`);
    ssl(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      `${name}.pem`,
      '-days',
      '2',
      '-extfile',
      'san.ext',
    );
  }
  return (name: string) => join(dir, name);
}

describe('tier authentication', {
  timeout: 120_000,
  skip: haveOpenssl() ? false : 'openssl not installed',
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-security-'));
  const started: SpillwayProcess[] = [];
  let file: (name: string) => string;
  let controller: SpillwayProcess;
  let aggregator: SpillwayProcess;
  let host: SpillwayProcess;
  let dashboard = '';

  const report = (zone: string, tier: Tier) =>
    create(ReportRequestSchema, {
      reporterId: 'intruder',
      tier,
      hostCount: tier === Tier.AGGREGATOR ? 1_000_000 : 1,
      zone,
      sequence: 1n,
      windowStartMs: BigInt(Date.now() - 1000),
      windowEndMs: BigInt(Date.now()),
      buckets: [{ bucket: 'pay', offered: 1e6, admitted: 1e6 }],
    });
  const refusal = async (
    target: string,
    options: Parameters<typeof createGrpcControlClient>[1],
    zone = 'z1',
    tier = Tier.HOST,
  ) => {
    const client = createGrpcControlClient(target, options);
    try {
      await client.report(report(zone, tier), { timeoutMs: 3_000 });
      return 'accepted';
    } catch (error) {
      assert.ok(isSpillwayError(error));
      return String(error.details?.grpcStatus);
    } finally {
      client.close();
    }
  };

  before(async () => {
    file = makeCertificates(dir);
    writeFileSync(file('token'), `${TOKEN}\n`);
    writeFileSync(file('host-token'), `${HOST_TOKEN}\n`);
    writeFileSync(
      file('limits.yaml'),
      [
        'version: 1',
        'intervalMs: 500',
        'buckets:',
        '  - key: pay',
        '    limitRps: 100',
        '    mode: enforce',
        '',
      ].join('\n'),
    );
    const common = ['--ops', '127.0.0.1:0', '--log-level', 'warn', '--auth-token-file', file('token')];
    controller = await startSpillway(
      'controller',
      [
        'controller',
        '--config',
        file('limits.yaml'),
        '--listen',
        '127.0.0.1:0',
        '--dashboard',
        '127.0.0.1:0',
        '--tls-cert',
        file('server.pem'),
        '--tls-key',
        file('server.key'),
        '--tls-ca',
        file('ca.pem'),
        '--tls-require-client-cert',
        ...common,
      ],
      { env: { SPILLWAY_ADMIN_TOKEN: ADMIN_TOKEN } },
    );
    started.push(controller);
    const line = controller.output.find((l) => l.includes('"listening"'))!;
    dashboard = (JSON.parse(line) as { dashboard: string }).dashboard;
    aggregator = await startSpillway('aggregator', [
      'aggregator',
      '--zone',
      'z1',
      '--parent',
      controller.grpc!,
      '--listen',
      '127.0.0.1:0',
      '--interval-ms',
      '500',
      '--tls-cert',
      file('server.pem'),
      '--tls-key',
      file('server.key'),
      '--tls-ca',
      file('ca.pem'),
      '--tls-client-cert',
      file('client.pem'),
      '--tls-client-key',
      file('client.key'),
      '--child-token-file',
      file('host-token'),
      ...common,
    ]);
    started.push(aggregator);
    host = await startSpillway('host', [
      'host',
      '--aggregator',
      aggregator.grpc!,
      '--zone',
      'z1',
      '--bucket',
      'pay=200',
      '--interval-ms',
      '500',
      '--tls-ca',
      file('ca.pem'),
      '--ops',
      '127.0.0.1:0',
      '--log-level',
      'warn',
      '--auth-token-file',
      file('host-token'),
    ]);
    started.push(host);
  });

  after(async () => {
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    rmSync(dir, { recursive: true, force: true });
  });

  it('the loop closes over mutual TLS and the shared token', async () => {
    await waitFor('a directive at the host', async () => {
      const ratio = (await scrape(host.ops)).get(seriesKey('spillway_drop_ratio', { bucket: 'pay' }));
      return ratio !== undefined && ratio > 0.2 ? true : undefined;
    });
  });

  it('refuses reports without the token, without TLS, or without a client certificate', async () => {
    const caPem = readFileSync(file('ca.pem'));
    const mtls: GrpcClientTlsOptions = {
      caPem,
      certPem: readFileSync(file('client.pem')),
      keyPem: readFileSync(file('client.key')),
    };
    assert.equal(await refusal(controller.grpc!, { tls: mtls }), 'UNAUTHENTICATED', 'no token');
    assert.equal(await refusal(controller.grpc!, { tls: mtls, authToken: 'wrong' }), 'UNAUTHENTICATED');
    assert.notEqual(await refusal(controller.grpc!, { authToken: TOKEN }), 'accepted', 'plaintext');
    assert.notEqual(
      await refusal(controller.grpc!, { tls: { caPem }, authToken: TOKEN }),
      'accepted',
      'no client cert',
    );
    assert.equal(
      await refusal(aggregator.grpc!, { tls: { caPem } }),
      'UNAUTHENTICATED',
      'no token at the aggregator',
    );
    assert.equal(
      await refusal(controller.grpc!, { tls: mtls, authToken: TOKEN }),
      'accepted',
      'the control case',
    );
  });

  it("hosts hold the aggregator's token, not the controller's, and cannot pass for an aggregator", async () => {
    const caPem = readFileSync(file('ca.pem'));
    const mtls: GrpcClientTlsOptions = {
      caPem,
      certPem: readFileSync(file('client.pem')),
      keyPem: readFileSync(file('client.key')),
    };
    // The hosts' token opens the aggregator only: straight to the controller it is refused.
    assert.equal(await refusal(controller.grpc!, { tls: mtls, authToken: HOST_TOKEN }), 'UNAUTHENTICATED');
    assert.equal(await refusal(aggregator.grpc!, { tls: { caPem }, authToken: TOKEN }), 'UNAUTHENTICATED');
    // At the zone aggregator, claiming the aggregator tier (and a million hosts) is refused.
    assert.equal(
      await refusal(aggregator.grpc!, { tls: { caPem }, authToken: HOST_TOKEN }, 'z1', Tier.AGGREGATOR),
      'INVALID_ARGUMENT',
    );
    assert.equal(await refusal(aggregator.grpc!, { tls: { caPem }, authToken: HOST_TOKEN }), 'accepted');
  });

  it('an aggregator refuses reports claiming another zone', async () => {
    const caPem = readFileSync(file('ca.pem'));
    assert.equal(
      await refusal(aggregator.grpc!, { tls: { caPem }, authToken: HOST_TOKEN }, 'z2'),
      'INVALID_ARGUMENT',
    );
    const rejected = (await scrape(aggregator.ops)).get(
      seriesKey('spillway_aggregator_rejected_reports_total', { code: 'ERR_SPILLWAY_INVALID_REPORT' }),
    );
    assert.ok((rejected ?? 0) >= 1, 'counted as rejected');
  });

  it("admin actions need the admin token; the tiers' token is not it", async () => {
    const post = (authorization?: string) =>
      fetch(`${dashboard}api/admin/limit`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
        body: JSON.stringify({ rule: 'pay', limitRps: 1e9 }),
      });
    assert.equal((await post()).status, 401);
    assert.equal((await post(`Bearer ${TOKEN}`)).status, 401);
    const snapshot = (await (await fetch(`${dashboard}api/snapshot`)).json()) as unknown;
    assert.ok(!JSON.stringify(snapshot).includes('1000000000'), 'the limit did not change');
    assert.equal((await post(`Bearer ${ADMIN_TOKEN}`)).status, 200, 'the control case');
  });
});
