// Issue #36: one zone's token holder registered 10,000 reporter ids and filled the controller's
// child table; a new aggregator of another zone was then refused, and its hosts fell back to their
// stale policy. The table's slots are now shared max-min fairly between zones (token-bound zones at
// the controller, network addresses at an aggregator): the honest party's outcome is asserted.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { createAggregator, peerAddress } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { isSpillwayError } from '../../src/core/errors.js';
import { ReportRequestSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import type { ControlClient } from '../../src/transport/control-transport.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { startGrpcControlServer } from '../../src/transport/grpc-control-server.js';

const Z1_TOKEN = 'z1-token-0123456789abcdef';
const Z2_TOKEN = 'z2-token-0123456789abcdef';
const LIMITS = 'version: 1\nbuckets:\n  - key: pay\n    limitRps: 100\n';

let sequence = 0n;
function reportOf(zone: string, reporterId: string, tier = Tier.AGGREGATOR, hostCount = 10) {
  const endMs = Date.now();
  sequence++;
  return create(ReportRequestSchema, {
    reporterId,
    tier,
    zone,
    hostCount,
    sequence,
    windowStartMs: BigInt(endMs - 1000),
    windowEndMs: BigInt(endMs),
    buckets: [{ bucket: 'pay', offered: 50, admitted: 50 }],
  });
}

async function refusal(client: ControlClient, zone: string, id: string): Promise<string | undefined> {
  try {
    await client.report(reportOf(zone, id), { timeoutMs: 5_000 });
    return undefined;
  } catch (error) {
    assert.ok(isSpillwayError(error));
    return String(error.details?.remoteMessage ?? error.message);
  }
}

describe("the child table: one zone's token holder cannot lock another zone out", () => {
  it('a z2 aggregator is counted and answered after a z1 token holder filled the table; z1 cannot take it back', async (t) => {
    const maxChildren = 40;
    const controller = createController({ id: 'ctl', config: parseLimitsConfig(LIMITS), maxChildren });
    const server = await startGrpcControlServer({
      handler: controller.handleReport,
      zoneTokens: [
        { zone: 'z1', token: Z1_TOKEN },
        { zone: 'z2', token: Z2_TOKEN },
      ],
    });
    const attacker = createGrpcControlClient(server.address, { authToken: Z1_TOKEN });
    const honest = createGrpcControlClient(server.address, { authToken: Z2_TOKEN });
    t.after(async () => {
      attacker.close();
      honest.close();
      await server.close();
    });

    for (let i = 0; i < maxChildren; i++)
      assert.equal(await refusal(attacker, 'z1', `invented-${i}`), undefined);
    assert.equal(controller.snapshot().childrenTotal, maxChildren);

    const reply = await honest.report(reportOf('z2', 'aggregator-z2'), { timeoutMs: 5_000 });
    controller.tick();
    const again = await honest.report(reportOf('z2', 'aggregator-z2'), { timeoutMs: 5_000 });
    assert.ok(reply.epoch > 0n);
    assert.equal(again.directives.length, 1, 'the z2 aggregator gets its directive');
    const children = controller.snapshot().children;
    assert.ok(children.some((c) => c.zone === 'z2' && c.id === 'aggregator-z2'));
    assert.equal(children.length, maxChildren, 'the table stays at its bound');

    // z1 now holds 39 slots against z2's 1: its next id would need one of its own.
    assert.match((await refusal(attacker, 'z1', 'invented-more')) ?? '', /tracks 40 children already/);
    // A restarted z2 aggregator (a new id while the old one has not expired) still gets in.
    assert.equal(await refusal(honest, 'z2', 'aggregator-z2-restarted'), undefined);
  });

  it('a per-zone bound refuses a zone past its slice before the table is full', () => {
    const controller = createController({
      id: 'ctl',
      config: parseLimitsConfig(LIMITS),
      maxChildren: 100,
      maxChildrenPerZone: 3,
    });
    const send = (id: string) =>
      controller.handleReport(reportOf('z1', id), { peer: 'ipv4:10.0.0.1:1', tokenZone: 'z1' });
    for (const id of ['a', 'b', 'c']) send(id);
    assert.throws(
      () => send('d'),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_CAPACITY_EXCEEDED'),
    );
    controller.handleReport(reportOf('z2', 'e'), { peer: 'ipv4:10.0.0.2:1', tokenZone: 'z2' });
    assert.equal(controller.snapshot().childrenTotal, 4);
  });
});

describe('the aggregator: host slots are shared between network addresses', () => {
  it('one address that invented ids up to the bound gives way to a host at another address', () => {
    const aggregator = createAggregator({
      id: 'agg',
      zone: 'z1',
      parents: [{ target: 'none', report: () => new Promise(() => {}), close() {} }],
      maxHosts: 20,
    });
    const send = (id: string, peer: string) =>
      aggregator.handleReport(reportOf('z1', id, Tier.HOST, 1), { peer });
    for (let i = 0; i < 20; i++) send(`invented-${i}`, 'ipv4:10.0.0.66:40000');
    send('honest-host', 'ipv4:10.0.0.7:51234');
    const hosts = aggregator.snapshot().hosts.map((h) => h.id);
    assert.equal(hosts.length, 20);
    assert.ok(hosts.includes('honest-host'));
    assert.ok(!hosts.includes('invented-0'), 'the longest-silent invented id made room');
  });

  it('reads the address of a peer without its port', () => {
    assert.equal(peerAddress('ipv4:10.0.0.7:51234'), 'ipv4:10.0.0.7');
    assert.equal(peerAddress('ipv6:[::1]:51234'), 'ipv6:[::1]');
    assert.equal(peerAddress('host-17'), 'host-17');
  });
});
