// The control plane's memory under reports at many times the soak's rate. The soak (scripts/soak.ts)
// saw the controller and the aggregators creep about 0.5 MB/min of RSS over ten minutes with a flat
// heap, and could not tell whether it levels off. Here a controller, --zones aggregators and
// --hosts-per-zone reporter clients per aggregator all report every 100 ms (the shortest interval
// the config accepts): the controller receives zones × 10 reports/s (2/s in the soak) and each
// aggregator hosts-per-zone × 10 (2/s in the soak), so growth that comes with reports shows up tens
// of times sooner, and growth that comes with time does not.
//
// Sampled every --sample-s: RSS and anonymous RSS (/proc), V8's heap used and committed (the
// processes' own metrics). Per third of the run: the mean of each and the RSS slope, so "levels
// off" is a falling slope, and the lowest heap used (the closest a sample gets to the live heap
// after a full collection).
//
//   node --import tsx scripts/control-memory.ts                 # 600 s, 8 zones, 2 hosts each
//   node --import tsx scripts/control-memory.ts --duration-s 60
//
// Writes bench/results/control-memory.json and control-memory.md.
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { create } from '@bufbuild/protobuf';
import { reproduce, sourceCommit } from '../bench/provenance.js';
import { ReportRequestSchema } from '../src/gen/spillway/v1/control_pb.js';
import { createGrpcControlClient } from '../src/transport/grpc-control-client.js';
import { BUCKET, Fleet, sleep } from '../test/faults/fleet.js';
import { REPO_ROOT, type SpillwayProcess, scrape } from '../test/integration/spillway-process.js';
import { mean, procStatusMb, slopePerMinute } from './process-memory.js';

const { values } = parseArgs({
  options: {
    'duration-s': { type: 'string', default: '600' },
    'sample-s': { type: 'string', default: '5' },
    zones: { type: 'string', default: '8' },
    'hosts-per-zone': { type: 'string', default: '2' },
    out: { type: 'string', default: join(REPO_ROOT, 'bench/results') },
  },
});
const positiveInteger = (flag: 'duration-s' | 'sample-s' | 'zones' | 'hosts-per-zone') => {
  const value = Number(values[flag]);
  if (!Number.isSafeInteger(value) || value <= 0) throw new Error(`--${flag} must be a positive integer`);
  return value;
};
const DURATION_S = positiveInteger('duration-s');
const SAMPLE_S = positiveInteger('sample-s');
const ZONES = positiveInteger('zones');
const HOSTS_PER_ZONE = positiveInteger('hosts-per-zone');
if (DURATION_S < 3 * SAMPLE_S) throw new Error('--duration-s must allow three samples (one per third)');
/** The shortest report interval the limits file accepts (src/config). */
const INTERVAL_MS = 100;
const LIMIT_RPS = 1000;

interface Sample {
  atS: number;
  rssMb: number;
  anonMb: number;
  heapUsedMb: number;
  heapCommittedMb: number;
}

async function sample(p: SpillwayProcess, atS: number): Promise<Sample> {
  const series = await scrape(p.ops);
  return {
    atS,
    ...procStatusMb(p.child.pid!),
    heapUsedMb: (series.get('spillway_nodejs_heap_size_used_bytes') ?? Number.NaN) / 2 ** 20,
    heapCommittedMb: (series.get('spillway_nodejs_heap_size_total_bytes') ?? Number.NaN) / 2 ** 20,
  };
}

function thirds(samples: Sample[]) {
  const cut = (i: number) => Math.round((i * samples.length) / 3);
  return [0, 1, 2].map((i) => {
    const part = samples.slice(cut(i), cut(i + 1));
    return {
      rssMb: mean(part.map((s) => s.rssMb)),
      anonMb: mean(part.map((s) => s.anonMb)),
      heapCommittedMb: mean(part.map((s) => s.heapCommittedMb)),
      heapUsedLowMb: Math.min(...part.map((s) => s.heapUsedMb)),
      rssSlopeMbPerMin: slopePerMinute(part, (s) => s.rssMb),
    };
  });
}

async function main(): Promise<void> {
  const loadAtStart = loadavg();
  const fleet = new Fleet(INTERVAL_MS, LIMIT_RPS);
  let stopped = false;
  let reportsOk = 0;
  let reportsFailed = 0;
  try {
    const controller = await fleet.controller('controller');
    const aggregators = await Promise.all(
      Array.from({ length: ZONES }, (_, z) =>
        fleet.aggregator(`aggregator-z${z}`, `z${z}`, [controller.grpc!]),
      ),
    );
    // Each host reports one bucket every interval, as a data-plane host does (sequence numbers
    // rising, a window of one interval).
    const hosts = aggregators.flatMap((aggregator, z) =>
      Array.from({ length: HOSTS_PER_ZONE }, (_, h) => ({
        id: `host-z${z}-${h}`,
        zone: `z${z}`,
        client: createGrpcControlClient(aggregator.grpc!),
      })),
    );
    const reporting = hosts.map(async (host) => {
      for (let sequence = 1n; !stopped; sequence++) {
        const nowMs = BigInt(Date.now());
        try {
          await host.client.report(
            create(ReportRequestSchema, {
              reporterId: host.id,
              zone: host.zone,
              sequence,
              windowStartMs: nowMs - BigInt(INTERVAL_MS),
              windowEndMs: nowMs,
              hostCount: 1,
              buckets: [{ bucket: BUCKET, offered: 100, admitted: 90, wouldDrop: 0 }],
            }),
            { timeoutMs: 2_000 },
          );
          reportsOk++;
        } catch {
          reportsFailed++;
        }
        await sleep(INTERVAL_MS);
      }
    });

    const watched = [controller, aggregators[0]!];
    const samples = new Map<string, Sample[]>(watched.map((p) => [p.name, []]));
    const startedMs = performance.now();
    for (let next = SAMPLE_S; next <= DURATION_S; next += SAMPLE_S) {
      await sleep(Math.max(0, startedMs + next * 1000 - performance.now()));
      const atS = (performance.now() - startedMs) / 1000;
      for (const p of watched) samples.get(p.name)!.push(await sample(p, atS));
      const c = samples.get('controller')!.at(-1)!;
      process.stderr.write(
        `${atS.toFixed(0)} s: controller RSS ${c.rssMb.toFixed(1)} MB, heap ${c.heapUsedMb.toFixed(1)} / ${c.heapCommittedMb.toFixed(1)} MB; ${reportsOk} reports\n`,
      );
    }
    stopped = true;
    await Promise.all(reporting);
    for (const host of hosts) host.client.close();
    const dead = fleet.started.filter((p) => !p.running).map((p) => p.name);

    const results = watched.map((p) => ({
      name: p.name,
      thirds: thirds(samples.get(p.name)!),
      samples: samples.get(p.name)!,
    }));
    const meta = {
      date: new Date().toISOString(),
      node: process.version,
      cpus: `${cpus().length} x ${cpus()[0]?.model ?? 'unknown'}`,
      loadAverage: { atStart: loadAtStart, atEnd: loadavg() },
      command: `node --import tsx scripts/control-memory.ts --duration-s ${DURATION_S} --sample-s ${SAMPLE_S} --zones ${ZONES} --hosts-per-zone ${HOSTS_PER_ZONE}`,
      commit: sourceCommit(),
      intervalMs: INTERVAL_MS,
      reportsPerSecondToController: (ZONES * 1000) / INTERVAL_MS,
      reportsPerSecondToAggregator: (HOSTS_PER_ZONE * 1000) / INTERVAL_MS,
      reportsOk,
      reportsFailed,
      dead,
    };
    writeFileSync(
      join(values.out!, 'control-memory.json'),
      `${JSON.stringify({ meta, results }, null, 2)}\n`,
    );
    const f = (v: number) => v.toFixed(1);
    const slope = (v: number) => `${v >= 0 ? '+' : ''}${v.toFixed(2)}`;
    const md = [
      '# Control-plane memory under many reports',
      '',
      `${meta.date}, Node ${meta.node}, ${meta.cpus}. Reproduce: \`${reproduce(meta.command)}\`.`,
      '',
      `A controller and ${ZONES} zone aggregators (\`spillway controller\`, \`spillway aggregator\`, each its own process),`,
      `${HOSTS_PER_ZONE} reporter clients per aggregator, everything reporting every ${INTERVAL_MS} ms for ${DURATION_S} s:`,
      `${meta.reportsPerSecondToController} reports/s reach the controller and ${meta.reportsPerSecondToAggregator} each aggregator (the soak: 2 and 2).`,
      `Reports answered: ${reportsOk.toLocaleString('en-US')}; failed: ${reportsFailed}. Processes that died: ${dead.length === 0 ? 'none' : dead.join(', ')}.`,
      `Load average ${loadAtStart.map(f).join(' / ')} at the start, ${meta.loadAverage.atEnd.map(f).join(' / ')} at the end.`,
      '',
      'Per third of the run: mean RSS, mean anonymous RSS and mean V8 committed heap (MB), the lowest heap',
      'used of any sample (MB: the nearest a sample gets to the live heap after a full collection), and',
      "the RSS slope within the third (MB/min). RSS that follows the committed heap while the heap's low",
      'point stays put is V8 sizing its heap; a slope that falls third by third is levelling off.',
      '',
      '| process | third | RSS | anon RSS | heap committed | heap used, lowest | RSS slope MB/min |',
      '|---|---|---:|---:|---:|---:|---:|',
      ...results.flatMap((r) =>
        r.thirds.map(
          (t, i) =>
            `| ${r.name} | ${['first', 'middle', 'last'][i]} | ${f(t.rssMb)} | ${f(t.anonMb)} | ${f(t.heapCommittedMb)} | ${f(t.heapUsedLowMb)} | ${slope(t.rssSlopeMbPerMin)} |`,
        ),
      ),
      '',
    ].join('\n');
    writeFileSync(join(values.out!, 'control-memory.md'), md);
    process.stdout.write(md);
    if (dead.length > 0 || reportsOk === 0) process.exitCode = 1;
  } finally {
    stopped = true;
    await fleet.close();
  }
}

await main();
