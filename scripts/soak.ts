// Soak: a real fleet (controller, two zone aggregators, four hosts, each its own process on
// loopback) under steady load for a long time, sampling every process's memory and open file
// handles. Flat means no leak: the last third's average is within 10% of the middle third's (the
// first third is warm-up: JIT, caches, connection pools).
//
//   npm run soak                         # 600 s (the default)
//   node --import tsx scripts/soak.ts --duration-s 120 --sample-s 10
//
// Writes bench/results/soak.json, soak.md (table) and soak.svg (memory and fds over time). Exits 1
// when a series is not flat or a process died.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Fleet, type HostSpec, impliedAdmittedRps, readHost, sleep } from '../test/faults/fleet.js';
import { REPO_ROOT, type SpillwayProcess, scrape } from '../test/integration/spillway-process.js';

const { values } = parseArgs({
  options: {
    'duration-s': { type: 'string', default: '600' },
    'sample-s': { type: 'string', default: '10' },
    out: { type: 'string', default: join(REPO_ROOT, 'bench/results') },
  },
});
const DURATION_S = Number(values['duration-s']);
const SAMPLE_S = Number(values['sample-s']);
const INTERVAL_MS = 1000;
const LIMIT_RPS = 2_000;
const FLAT_RATIO = 1.1;

interface Sample {
  atS: number;
  rssMb: number;
  heapMb: number;
  fds: number;
}

function procStatusRssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? Number.NaN);
  return kb / 1024;
}

function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

async function sampleProcess(p: SpillwayProcess, atS: number): Promise<Sample> {
  const pid = p.child.pid!;
  const series = await scrape(p.ops);
  return {
    atS,
    rssMb: procStatusRssMb(pid),
    heapMb: (series.get('spillway_nodejs_heap_size_used_bytes') ?? Number.NaN) / 2 ** 20,
    fds: openFds(pid),
  };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

function thirds(samples: Sample[], field: keyof Omit<Sample, 'atS'>) {
  const n = samples.length;
  const third = Math.max(1, Math.floor(n / 3));
  const middle = mean(samples.slice(third, n - third).map((s) => s[field]));
  const last = mean(samples.slice(n - third).map((s) => s[field]));
  // A small absolute slack: a fd count of 20 -> 22 or a heap of 9 -> 10 MB is noise, not a leak.
  const slack = field === 'fds' ? 2 : 1;
  return { middle, last, flat: last <= middle * FLAT_RATIO + slack };
}

function renderSvg(results: { name: string; samples: Sample[] }[]): string {
  const width = 960;
  const panel = 220;
  const margin = { left: 64, right: 180, top: 30, gap: 50 };
  const plotWidth = width - margin.left - margin.right;
  const height = margin.top + 2 * panel + margin.gap + 40;
  const colors = ['#1c7ed6', '#e8590c', '#2b8a3e', '#ae3ec9', '#f08c00', '#0ca678', '#c2255c', '#495057'];
  const maxS = Math.max(...results.flatMap((r) => r.samples.map((s) => s.atS)), 1);
  const draw = (field: 'rssMb' | 'fds', top: number, label: string) => {
    const maxY = Math.max(...results.flatMap((r) => r.samples.map((s) => s[field])), 1) * 1.15;
    const x = (s: number) => margin.left + (s / maxS) * plotWidth;
    const y = (v: number) => top + panel - (v / maxY) * panel;
    const lines = results.map((r, i) => {
      const points = r.samples.map((s) => `${x(s.atS).toFixed(1)},${y(s[field]).toFixed(1)}`).join(' ');
      return `<polyline fill="none" stroke="${colors[i % colors.length]}" stroke-width="1.5" points="${points}"/>`;
    });
    const ticks = [0, 0.5, 1].map(
      (f) =>
        `<text x="${margin.left - 6}" y="${(y(maxY * f) + 4).toFixed(1)}" text-anchor="end">${(maxY * f).toFixed(0)}</text>`,
    );
    return [
      `<text x="${margin.left}" y="${top - 8}" font-weight="bold">${label}</text>`,
      `<rect x="${margin.left}" y="${top}" width="${plotWidth}" height="${panel}" fill="none" stroke="#ced4da"/>`,
      ...ticks,
      ...lines,
    ].join('\n');
  };
  const legend = results.map(
    (r, i) =>
      `<text x="${width - margin.right + 12}" y="${margin.top + 16 * (i + 1)}" fill="${colors[i % colors.length]}">${r.name}</text>`,
  );
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    '<rect width="100%" height="100%" fill="white"/>',
    draw('rssMb', margin.top, 'RSS (MB) per process'),
    draw('fds', margin.top + panel + margin.gap, 'open file descriptors per process'),
    `<text x="${margin.left + plotWidth / 2}" y="${height - 8}" text-anchor="middle">seconds</text>`,
    ...legend,
    '</svg>',
    '',
  ].join('\n');
}

async function main(): Promise<number> {
  const fleet = new Fleet(INTERVAL_MS, LIMIT_RPS);
  const processes: SpillwayProcess[] = [];
  try {
    const controller = await fleet.controller('controller');
    const aggregators = await Promise.all(
      ['z1', 'z2'].map((zone) => fleet.aggregator(`aggregator-${zone}`, zone, [controller.grpc!])),
    );
    const specs: HostSpec[] = [
      { id: 'host-1', zone: 'z1', rps: 1200, aggregators: [aggregators[0]!.grpc!] },
      { id: 'host-2', zone: 'z1', rps: 600, aggregators: [aggregators[0]!.grpc!] },
      { id: 'host-3', zone: 'z2', rps: 800, aggregators: [aggregators[1]!.grpc!] },
      { id: 'host-4', zone: 'z2', rps: 400, aggregators: [aggregators[1]!.grpc!] },
    ];
    const hosts = await Promise.all(specs.map((s) => fleet.host(s)));
    processes.push(controller, ...aggregators, ...hosts);

    const samples = new Map<string, Sample[]>(processes.map((p) => [p.name, []]));
    const admitted: { atS: number; impliedAdmittedRps: number }[] = [];
    const startedMs = performance.now();
    process.stdout.write(
      `soak: ${processes.length} processes for ${DURATION_S} s, sampling every ${SAMPLE_S} s\n`,
    );
    for (let k = 0; ; k++) {
      const atS = (performance.now() - startedMs) / 1000;
      for (const p of processes) {
        if (!p.running) throw new Error(`${p.name} died:\n${p.output.slice(-10).join('\n')}`);
        samples.get(p.name)!.push(await sampleProcess(p, atS));
      }
      const readings = await Promise.all(hosts.map((h, i) => readHost(specs[i]!.id, h)));
      admitted.push({ atS, impliedAdmittedRps: impliedAdmittedRps(specs, readings) });
      const rss = processes.map((p) => samples.get(p.name)!.at(-1)!.rssMb.toFixed(0)).join(' ');
      process.stdout.write(
        `  ${atS.toFixed(0)} s: RSS MB ${rss}; implied admitted ${admitted.at(-1)!.impliedAdmittedRps.toFixed(0)} rps\n`,
      );
      if (atS >= DURATION_S) break;
      await sleep(Math.max(0, startedMs + (k + 1) * SAMPLE_S * 1000 - performance.now()));
    }

    const results = processes.map((p) => {
      const list = samples.get(p.name)!;
      return {
        name: p.name,
        samples: list,
        rss: thirds(list, 'rssMb'),
        heap: thirds(list, 'heapMb'),
        fds: thirds(list, 'fds'),
      };
    });
    const flat = results.every((r) => r.rss.flat && r.heap.flat && r.fds.flat);
    const header = {
      date: new Date().toISOString(),
      node: process.version,
      cpus: `${cpus().length} x ${cpus()[0]?.model ?? 'unknown'}`,
      command: `node --import tsx scripts/soak.ts --duration-s ${DURATION_S} --sample-s ${SAMPLE_S}`,
      durationS: DURATION_S,
      sampleS: SAMPLE_S,
      limitRps: LIMIT_RPS,
      offeredRps: specs.reduce((n, s) => n + s.rps, 0),
      flatRatio: FLAT_RATIO,
    };
    writeFileSync(
      join(values.out!, 'soak.json'),
      `${JSON.stringify({ ...header, flat, results, admitted }, null, 2)}\n`,
    );
    const fmt = (t: { middle: number; last: number; flat: boolean }, digits = 1) =>
      `${t.middle.toFixed(digits)} → ${t.last.toFixed(digits)}${t.flat ? '' : ' **not flat**'}`;
    const md = [
      '# Soak',
      '',
      `${header.date}, Node ${header.node}, ${header.cpus}. Reproduce: \`${header.command}\` (\`npm run soak\` runs 600 s).`,
      '',
      `A controller, two zone aggregators and four hosts (one process each, gRPC on loopback) under ${header.offeredRps} rps offered against a ${LIMIT_RPS} rps limit, sampled every ${SAMPLE_S} s for ${DURATION_S} s. ` +
        `Each cell: mean of the middle third → mean of the last third; flat means last ≤ ${FLAT_RATIO} × middle (+1 MB, +2 fds).`,
      '',
      '| process | RSS MB | heap used MB | open fds |',
      '|---|---|---|---|',
      ...results.map((r) => `| ${r.name} | ${fmt(r.rss)} | ${fmt(r.heap)} | ${fmt(r.fds, 0)} |`),
      '',
      `Implied fleet admission (Σ host rps × (1 − effective ratio)) over the last third: ${mean(admitted.slice(Math.floor((2 * admitted.length) / 3)).map((a) => a.impliedAdmittedRps)).toFixed(0)} rps for a ${LIMIT_RPS} rps limit.`,
      '',
      `Verdict: **${flat ? 'flat' : 'NOT flat'}**. Plot: [soak.svg](soak.svg).`,
      '',
    ].join('\n');
    writeFileSync(join(values.out!, 'soak.md'), md);
    writeFileSync(join(values.out!, 'soak.svg'), renderSvg(results));
    process.stdout.write(md);
    return flat ? 0 : 1;
  } finally {
    await fleet.close();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  },
);
