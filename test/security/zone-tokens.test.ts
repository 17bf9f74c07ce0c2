import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { isSpillwayError } from '../../src/core/errors.js';
import { ReportRequestSchema, ReportResponseSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient, ReportContext } from '../../src/transport/control-transport.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { startGrpcControlServer, validateZoneTokens } from '../../src/transport/grpc-control-server.js';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  spawnSpillwayRaw,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';

// Tokens bound to zones at the controller (`--zone-token-file zone=path`): an aggregator holding
// zone z1's token may only report zone z1; the shared token stays valid for any zone.

const SHARED = 'shared-token-0123456789abcdef';
const Z1_TOKEN = 'z1-token-0123456789abcdef';
const Z2_TOKEN = 'z2-token-0123456789abcdef';

let sequence = 0n;
/** 10 requests offered in a 1 s window. */
const reportOf = (zone: string, reporterId = `direct-${zone}`) => {
  const endMs = Date.now();
  sequence++;
  return create(ReportRequestSchema, {
    reporterId,
    tier: Tier.HOST,
    zone,
    hostCount: 1,
    sequence,
    windowStartMs: BigInt(endMs - 1000),
    windowEndMs: BigInt(endMs),
    buckets: [{ bucket: 'pay', offered: 10, admitted: 10 }],
  });
};

/** 'accepted', or the gRPC status name and the server's message of the refusal. */
async function outcome(target: string, authToken: string | undefined, zone: string): Promise<string> {
  const client = createGrpcControlClient(target, authToken === undefined ? {} : { authToken });
  try {
    await client.report(reportOf(zone), { timeoutMs: 5_000 });
    return 'accepted';
  } catch (error) {
    assert.ok(isSpillwayError(error));
    return `${String(error.details?.grpcStatus)}: ${String(error.details?.remoteMessage)}`;
  } finally {
    client.close();
  }
}

describe('validateZoneTokens', () => {
  it('refuses a token bound to two zones, a zone token equal to the shared one, empty values', () => {
    const invalid = (tokens: Parameters<typeof validateZoneTokens>[0], authToken?: string) =>
      assert.throws(
        () => validateZoneTokens(tokens, authToken),
        (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_OPTION') && !error.message.includes('tok-'),
      );
    invalid([
      { zone: 'z1', token: 'tok-a' },
      { zone: 'z2', token: 'tok-a' },
    ]);
    invalid([{ zone: 'z1', token: 'tok-a' }], 'tok-a');
    invalid([{ zone: '', token: 'tok-a' }]);
    invalid([{ zone: 'z1', token: '' }]);
    // Several tokens for one zone (rotation), and one token listed twice for its zone, are fine.
    validateZoneTokens([
      { zone: 'z1', token: 'tok-a' },
      { zone: 'z1', token: 'tok-b' },
      { zone: 'z1', token: 'tok-a' },
    ]);
  });
});

describe('gRPC server: zoneTokens', () => {
  it('authenticates each token and tells the handler the zone a zone token binds', async (t) => {
    const contexts: ReportContext[] = [];
    const server = await startGrpcControlServer({
      handler: (_request, context) => {
        contexts.push(context);
        return create(ReportResponseSchema, { responderId: 's' });
      },
      authToken: SHARED,
      zoneTokens: [
        { zone: 'z1', token: Z1_TOKEN },
        { zone: 'z2', token: Z2_TOKEN },
      ],
    });
    t.after(() => server.close());
    assert.equal(await outcome(server.address, Z1_TOKEN, 'anything'), 'accepted');
    assert.equal(contexts.at(-1)?.tokenZone, 'z1');
    assert.equal(await outcome(server.address, Z2_TOKEN, 'anything'), 'accepted');
    assert.equal(contexts.at(-1)?.tokenZone, 'z2');
    assert.equal(await outcome(server.address, SHARED, 'anything'), 'accepted');
    assert.equal(contexts.at(-1)?.tokenZone, undefined, 'the shared token binds no zone');
    assert.match(await outcome(server.address, undefined, 'z1'), /^UNAUTHENTICATED/);
    assert.match(await outcome(server.address, `${Z1_TOKEN}x`, 'z1'), /^UNAUTHENTICATED/);
    assert.equal(contexts.length, 3, 'refused reports never reach the handler');
  });

  it('with zone tokens only, a report without one of them is refused', async (t) => {
    const server = await startGrpcControlServer({
      handler: () => create(ReportResponseSchema, { responderId: 's' }),
      zoneTokens: [{ zone: 'z1', token: Z1_TOKEN }],
    });
    t.after(() => server.close());
    assert.match(await outcome(server.address, undefined, 'z1'), /^UNAUTHENTICATED/);
    assert.equal(await outcome(server.address, Z1_TOKEN, 'z1'), 'accepted');
  });
});

describe('controller --zone-token-file (real processes)', { timeout: 90_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-zone-tokens-'));
  const file = (name: string) => join(dir, name);
  const started: SpillwayProcess[] = [];
  let controller: SpillwayProcess;
  let aggregatorZ1: SpillwayProcess;
  let impostor: SpillwayProcess;
  let feeding: NodeJS.Timeout | undefined;
  const hostClients: ControlClient[] = [];

  before(async () => {
    writeFileSync(file('shared'), `${SHARED}\n`);
    writeFileSync(file('z1'), `${Z1_TOKEN}\n`);
    writeFileSync(file('z2'), `${Z2_TOKEN}\n`);
    writeFileSync(
      file('limits.yaml'),
      [
        'version: 1',
        'intervalMs: 300',
        'buckets:',
        '  - key: pay',
        '    limitRps: 100',
        '    scope: zone',
        '',
      ].join('\n'),
    );
    controller = await startSpillway('controller', [
      'controller',
      '--config',
      file('limits.yaml'),
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
      '--log-level',
      'info',
      '--auth-token-file',
      file('shared'),
      '--zone-token-file',
      `z1=${file('z1')}`,
      '--zone-token-file',
      `z2=${file('z2')}`,
    ]);
    started.push(controller);
    const aggregator = (zone: string, token: string) =>
      startSpillway(`aggregator ${zone}`, [
        'aggregator',
        '--zone',
        zone,
        '--parent',
        controller.grpc!,
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        '--interval-ms',
        '300',
        '--log-level',
        'error',
        '--auth-token-file',
        file(token),
      ]);
    // z1's aggregator with z1's token, and an impostor holding z1's token that speaks for zone z2.
    [aggregatorZ1, impostor] = await Promise.all([aggregator('z1', 'z1'), aggregator('z2', 'z1')]);
    started.push(aggregatorZ1, impostor);
    // Hosts report to both (each aggregator requires its own token, z1's, from them).
    const toZ1 = createGrpcControlClient(aggregatorZ1.grpc!, { authToken: Z1_TOKEN });
    const toImpostor = createGrpcControlClient(impostor.grpc!, { authToken: Z1_TOKEN });
    hostClients.push(toZ1, toImpostor);
    const feed = () => {
      void toZ1.report(reportOf('z1', 'host-z1'), { timeoutMs: 1_000 }).catch(() => {});
      void toImpostor.report(reportOf('z2', 'host-z2'), { timeoutMs: 1_000 }).catch(() => {});
    };
    feed();
    feeding = setInterval(feed, 200);
  });

  after(async () => {
    clearInterval(feeding);
    for (const client of hostClients) client.close();
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    rmSync(dir, { recursive: true, force: true });
  });

  it('logs the zones bound to tokens (never the tokens)', () => {
    const line = controller.output.find((l) => l.includes('"listening"'))!;
    assert.deepEqual((JSON.parse(line) as { tokenZones: string[] }).tokenZones, ['z1', 'z2']);
    assert.ok(!controller.output.some((l) => l.includes(Z1_TOKEN) || l.includes(Z2_TOKEN)));
  });

  it("z1's aggregator is counted; the impostor's forwards claiming z2 are refused and counted", async () => {
    const rejectedKey = seriesKey('spillway_controller_rejected_reports_total', {
      code: 'ERR_SPILLWAY_INVALID_REPORT',
    });
    const z1Key = seriesKey('spillway_controller_zone_offered_rps', { bucket: 'pay', zone: 'z1' });
    const series = await waitFor('z1 counted and the impostor refused', async () => {
      const now = await scrape(controller.ops);
      return (now.get(z1Key) ?? 0) > 0 && (now.get(rejectedKey) ?? 0) >= 2 ? now : undefined;
    });
    const z1Rps = series.get(z1Key)!;
    assert.ok(Math.abs(z1Rps - 10) < 0.5, `z1's host rate through its aggregator: ${z1Rps} rps`);
    const zonesSeen = [...series.keys()].filter((k) => k.startsWith('spillway_controller_zone_offered_rps{'));
    assert.deepEqual(zonesSeen, [z1Key], 'zone z2 never reached the sums');
    assert.equal(series.get(seriesKey('spillway_controller_children', { tier: 'aggregator' })), 1);
    // The impostor sees its parent refuse every forward.
    const impostorSeries = await scrape(impostor.ops);
    const forwards = impostorSeries.get(seriesKey('spillway_aggregator_forwards_total')) ?? 0;
    const failures = impostorSeries.get(seriesKey('spillway_aggregator_forward_failures_total')) ?? 0;
    assert.ok(failures >= 1 && failures >= forwards - 1, `${failures} of ${forwards} forwards failed`);
    assert.equal(
      impostorSeries.get(seriesKey('spillway_aggregator_parent_healthy', { parent: controller.grpc! })),
      0,
    );
  });

  it('answers INVALID_ARGUMENT with ERR_SPILLWAY_INVALID_REPORT for a mismatched zone, accepts the right pairs', async () => {
    const target = controller.grpc!;
    assert.match(
      await outcome(target, Z1_TOKEN, 'z2'),
      /^INVALID_ARGUMENT: ERR_SPILLWAY_INVALID_REPORT: report claims zone "z2" but its token is bound to zone z1$/,
    );
    assert.match(await outcome(target, Z2_TOKEN, ''), /^INVALID_ARGUMENT: ERR_SPILLWAY_INVALID_REPORT/);
    assert.equal(await outcome(target, Z2_TOKEN, 'z2'), 'accepted');
    assert.equal(await outcome(target, SHARED, 'z7'), 'accepted', 'the shared token binds no zone');
    assert.match(await outcome(target, undefined, 'z1'), /^UNAUTHENTICATED/);
    assert.match(await outcome(target, 'guess', 'z1'), /^UNAUTHENTICATED/);
  });

  it('exits 2 on a token bound to two zones or a malformed --zone-token-file', async () => {
    const run = async (args: string[]) => {
      const child = spawnSpillwayRaw([
        'controller',
        '--config',
        file('limits.yaml'),
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        ...args,
      ]);
      let stderr = '';
      child.stderr!.on('data', (chunk: Buffer) => {
        stderr += chunk.toString();
      });
      const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
      return { code, stderr };
    };
    const [shared, malformed] = await Promise.all([
      run(['--zone-token-file', `z1=${file('z1')}`, '--zone-token-file', `z2=${file('z1')}`]),
      run(['--zone-token-file', file('z1')]),
    ]);
    assert.equal(shared.code, 2);
    assert.match(
      shared.stderr,
      /--zone-token-file: zones z1 and z2 have the same token; a token binds one zone \(ERR_SPILLWAY_INVALID_USAGE\)/,
    );
    assert.ok(!shared.stderr.includes(Z1_TOKEN), 'the token is not printed');
    assert.equal(malformed.code, 2);
    assert.match(malformed.stderr, /--zone-token-file must be zone=path/);
  });
});
