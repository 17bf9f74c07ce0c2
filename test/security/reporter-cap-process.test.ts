import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { create } from '@bufbuild/protobuf';
import { ReportRequestSchema, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';

// A real `spillway controller --reporter-cap-median 4` and hosts reporting to it over gRPC: the
// clipping of a lying host is visible on its /metrics, by tier, and bounds the offered sum.

const HONEST_RPS = [100, 120, 80, 100];
const LIE_RPS = 1e9;
const CLIPPED = seriesKey('spillway_controller_reporter_cap_clipped_total', { tier: 'host' });

describe('reporter cap metric (real controller process)', { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-reporter-cap-'));
  const started: SpillwayProcess[] = [];
  after(async () => {
    for (const p of started) await stopSpillway(p, 2_000);
    rmSync(dir, { recursive: true, force: true });
  });

  it('spillway_controller_reporter_cap_clipped_total{tier="host"} stays 0 for honest hosts and rises with a liar', async (t) => {
    const limits = join(dir, 'limits.yaml');
    writeFileSync(
      limits,
      ['version: 1', 'intervalMs: 300', 'buckets:', '  - key: pay', '    limitRps: 300', ''].join('\n'),
    );
    const controller = await startSpillway('controller', [
      'controller',
      '--config',
      limits,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
      '--log-level',
      'warn',
      '--reporter-cap-median',
      '4',
    ]);
    started.push(controller);
    const client = createGrpcControlClient(controller.grpc!);
    t.after(() => client.close());

    let sequence = 0n;
    const round = async (liar: boolean) => {
      sequence++;
      const endMs = Date.now();
      const hosts: [string, number][] = HONEST_RPS.map((rps, i) => [`h${i}`, rps]);
      if (liar) hosts.push(['liar', LIE_RPS]);
      for (const [reporterId, rps] of hosts) {
        await client.report(
          create(ReportRequestSchema, {
            reporterId,
            tier: Tier.HOST,
            zone: 'z1',
            hostCount: 1,
            sequence,
            windowStartMs: BigInt(endMs - 1000),
            windowEndMs: BigInt(endMs),
            buckets: [{ bucket: 'pay', offered: rps, admitted: rps }],
          }),
          { timeoutMs: 3_000 },
        );
      }
    };
    /** Keeps reporting (children expire after 3 intervals) until the scrape satisfies `check`. */
    const reportUntil = (what: string, liar: boolean, check: (series: Map<string, number>) => boolean) =>
      waitFor(
        what,
        async () => {
          await round(liar);
          const series = await scrape(controller.ops);
          return check(series) ? series : undefined;
        },
        { everyMs: 100 },
      );

    const ticksKey = seriesKey('spillway_controller_ticks_total');
    const offeredKey = seriesKey('spillway_controller_offered_rps', { bucket: 'pay' });
    const honest = await reportUntil(
      'honest hosts summed',
      false,
      (series) => series.get(offeredKey) === 400,
    );
    const ticksAtHonest = honest.get(ticksKey)!;
    const afterTicks = await reportUntil(
      'two more ticks with honest hosts only',
      false,
      (series) => series.get(ticksKey)! >= ticksAtHonest + 2,
    );
    assert.equal(afterTicks.get(CLIPPED), 0, 'honest hosts are never clipped');

    const lied = await reportUntil('the liar clipped', true, (series) => (series.get(CLIPPED) ?? 0) > 0);
    // The liar counts at most 4 x the lower median host (100 rps): at most 400 + 400 rps offered.
    assert.ok(lied.get(offeredKey)! <= 800 + 1e-6, `offered ${lied.get(offeredKey)} rps`);
    assert.equal(
      lied.get(seriesKey('spillway_controller_reporter_cap_clipped_total', { tier: 'aggregator' })),
      0,
    );
  });
});
