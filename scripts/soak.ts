// Soak: a real fleet under steady HTTP load for a long time, every part its own process on
// loopback: a controller, two zone aggregators, four `spillway proxy` sidecars (global backend, two
// per zone, reporting to their zone's aggregator) in front of one upstream, and an HTTP load
// generator offering a fixed rate above the global limit (so the proxies answer both 2xx and 429)
// for the whole run. Every process is sampled for memory, open file handles and CPU; the proxies,
// the upstream and the load generator for their counters (outcomes, errors, timeouts).
//
// Flat means no leak: for every process the last third's average RSS, heap used and fds are within
// 10% of the middle third's (the first third is warm-up: JIT, caches, connection pools). V8's
// committed heap (reserved for new and old space, used or not) is sampled too because RSS follows
// it: in every run so far each HTTP process (proxies, upstream, load generator) shrank it by 10–30
// MB at about 100–120 s and again at about 220 s, and grew it back over the following minutes,
// with heap used flat throughout; an RSS step that matches a committed-heap step is V8 sizing, not
// a leak. No error growth means every error counter rose no more in the last third than in the
// middle third (within the same 10%, plus 2). The admitted rate (requests the upstream received)
// must stay within 10% of the limit, and both 2xx and 429 must keep coming.
//
//   npm run soak                         # 600 s (the default)
//   node --import tsx scripts/soak.ts --duration-s 60 --sample-s 5
//
// Writes bench/results/soak.json, soak.md (tables) and soak.svg (memory, fds, rates and errors over
// time). Exits 1 when a check fails or a process died.
import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { reproduce, sourceCommit } from '../bench/provenance.js';
import { BUCKET, Fleet, sleep } from '../test/faults/fleet.js';
import {
  REPO_ROOT,
  type SpillwayProcess,
  scrape,
  startSpillway,
  stopSpillway,
} from '../test/integration/spillway-process.js';
import { mean, procStatusMb, slopePerMinute } from './process-memory.js';
import type { SoakLoadSpec } from './soak-worker.js';

const { values } = parseArgs({
  options: {
    'duration-s': { type: 'string', default: '600' },
    // Every 5 s: the proxies' heap is a sawtooth with a period of tens of seconds (allocation per
    // request, then a full GC), so a third's mean needs many samples to be steady.
    'sample-s': { type: 'string', default: '5' },
    'offered-rps': { type: 'string', default: '1800' },
    'limit-rps': { type: 'string', default: '1200' },
    out: { type: 'string', default: join(REPO_ROOT, 'bench/results') },
  },
});
const positive = (flag: string) => {
  const value = Number(values[flag as keyof typeof values]);
  if (!Number.isFinite(value) || value <= 0) throw new Error(`--${flag} must be a positive number`);
  return value;
};
const DURATION_S = positive('duration-s');
const SAMPLE_S = positive('sample-s');
const OFFERED_RPS = positive('offered-rps');
const LIMIT_RPS = positive('limit-rps');
const INTERVAL_MS = 1000;
const FLAT_RATIO = 1.1;
const ADMITTED_TOLERANCE = 0.1;
/** The load generator's bound on requests in flight per proxy; past it a request is skipped (an error). */
const MAX_IN_FLIGHT = 1_024;
const PATH = `/${BUCKET}/items`;
/** The sidecars: zone and share of the offered load (uneven on purpose, like real traffic). */
const PROXIES = [
  { id: 'proxy-1', zone: 'z1', share: 0.4 },
  { id: 'proxy-2', zone: 'z1', share: 0.2 },
  { id: 'proxy-3', zone: 'z2', share: 0.27 },
  { id: 'proxy-4', zone: 'z2', share: 0.13 },
];
/** Counters that must not grow: proxy outcomes and decisions, report failures, load-side failures. */
const ERROR_SERIES: { name: string; from: 'proxies' | 'load'; metric: RegExp }[] = [
  {
    name: 'proxy upstream_error (502)',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="upstream_error"\}$/,
  },
  {
    name: 'proxy upstream_timeout (504)',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="upstream_timeout"\}$/,
  },
  {
    name: 'proxy upstream_queue_timeout (504)',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="upstream_queue_timeout"\}$/,
  },
  {
    name: 'proxy client_abort',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="client_abort"\}$/,
  },
  {
    name: 'proxy client_timeout (408)',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="client_timeout"\}$/,
  },
  {
    name: 'proxy bad_request',
    from: 'proxies',
    metric: /^spillway_proxy_requests_total\{outcome="bad_request"\}$/,
  },
  {
    name: 'proxy decision error/fail_open/fail_closed',
    from: 'proxies',
    metric: /^spillway_proxy_decisions_total\{.*result="(error|fail_open|fail_closed)"\}$/,
  },
  {
    name: 'proxy reports not ok',
    from: 'proxies',
    metric: /^spillway_reports_total\{.*result="(?!ok")[^"]*"\}$/,
  },
  { name: 'load 5xx', from: 'load', metric: /^spillway_soak_load_responses_total\{.*outcome="http_5xx"\}$/ },
  {
    name: 'load other 4xx',
    from: 'load',
    metric: /^spillway_soak_load_responses_total\{.*outcome="http_4xx"\}$/,
  },
  {
    name: 'load timeouts',
    from: 'load',
    metric: /^spillway_soak_load_responses_total\{.*outcome="timeout"\}$/,
  },
  {
    name: 'load connection errors',
    from: 'load',
    metric: /^spillway_soak_load_responses_total\{.*outcome="error"\}$/,
  },
  {
    name: 'load skipped (in-flight cap)',
    from: 'load',
    metric: /^spillway_soak_load_responses_total\{.*outcome="skipped"\}$/,
  },
];
const CLOCK_TICKS_PER_S = 100;

interface Sample {
  atS: number;
  /** Resident memory: all of it (VmRSS) and its anonymous part (RssAnon). */
  rssMb: number;
  anonMb: number;
  /** V8 heap: used, and committed (reserved for new and old space, used or not). */
  heapMb: number;
  heapCommittedMb: number;
  /** Memory of Buffers and other objects outside the V8 heap. */
  externalMb: number;
  fds: number;
  cpuS: number;
}

/** Cumulative counters read at one sampling instant (the whole fleet). */
interface Tally {
  atS: number;
  load1: number;
  /** Requests the load generator issued (answered, failed or skipped). */
  offered: number;
  /** Load generator: 2xx and 429 answers. */
  ok: number;
  limited: number;
  /** Requests the upstream answered. */
  upstream: number;
  /** Proxies: forwarded to the upstream, answered 429. */
  forwarded: number;
  proxyLimited: number;
  /** Gauges: requests in flight in the proxies and in the load generator. */
  proxyInFlight: number;
  loadInFlight: number;
  /** Load generator response time: sum and count (mean per interval). */
  latencySumS: number;
  latencyCount: number;
  errors: Record<string, number>;
  /** Load-side failures (every outcome but 2xx and 429) by proxy. */
  loadFailuresByProxy: Record<string, number>;
}

function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** User + system CPU seconds of a process so far (/proc/<pid>/stat fields 14 and 15). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_S;
}

async function sampleProcess(p: SpillwayProcess, atS: number) {
  const pid = p.child.pid!;
  const series = await scrape(p.ops);
  const sample: Sample = {
    atS,
    ...procStatusMb(pid),
    heapMb: (series.get('spillway_nodejs_heap_size_used_bytes') ?? Number.NaN) / 2 ** 20,
    heapCommittedMb: (series.get('spillway_nodejs_heap_size_total_bytes') ?? Number.NaN) / 2 ** 20,
    externalMb: (series.get('spillway_nodejs_external_memory_bytes') ?? Number.NaN) / 2 ** 20,
    fds: openFds(pid),
    cpuS: cpuSeconds(pid),
  };
  return { sample, series };
}

const sumMatching = (series: Map<string, number>, metric: RegExp) => {
  let total = 0;
  for (const [key, value] of series) if (metric.test(key)) total += value;
  return total;
};

/**
 * Starts `scripts/soak-worker.ts <role> <spec>` and waits for its `listening` line, like
 * startSpillway does for `spillway` commands (same shape, so sampling and stopping treat it alike).
 */
async function startWorker(name: string, role: 'upstream' | 'load', spec: object): Promise<SpillwayProcess> {
  const child: ChildProcess = spawn(
    process.execPath,
    ['--import', 'tsx', 'scripts/soak-worker.ts', role, JSON.stringify(spec)],
    { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } },
  );
  const output: string[] = [];
  let running = true;
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => {
      running = false;
      resolve(code ?? signal ?? 'unknown');
    });
  });
  createInterface({ input: child.stderr! }).on('line', (line) => output.push(`[stderr] ${line}`));
  const listening = new Promise<Record<string, string>>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      output.push(line);
      if (line.includes('"listening"')) resolve(JSON.parse(line) as Record<string, string>);
    });
    void exited.then((code) => reject(new Error(`${name} exited (${code}):\n${output.join('\n')}`)));
  });
  let timer: NodeJS.Timeout | undefined;
  try {
    const fields = await Promise.race([
      listening,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${name} did not listen within 30 s`)), 30_000);
      }),
    ]);
    return {
      name,
      child,
      grpc: undefined,
      ops: fields.ops!,
      output,
      exited,
      get running() {
        return running;
      },
    };
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/** A field of a process's `listening` line (the proxy's client address). */
function listeningField(p: SpillwayProcess, field: string): string {
  for (const line of p.output) {
    if (!line.includes('"listening"')) continue;
    const value = (JSON.parse(line) as Record<string, unknown>)[field];
    if (typeof value === 'string') return value;
  }
  throw new Error(`${p.name}: no '${field}' in its listening line`);
}

type SampleField = Exclude<keyof Sample, 'atS' | 'cpuS'>;

function thirds(samples: Sample[], field: SampleField) {
  const n = samples.length;
  const third = Math.max(1, Math.floor(n / 3));
  const middle = mean(samples.slice(third, n - third).map((s) => s[field]));
  const last = mean(samples.slice(n - third).map((s) => s[field]));
  // A small absolute slack: a fd count of 20 -> 22 or a heap of 9 -> 10 MB is noise, not a leak.
  const slack = field === 'fds' ? 2 : 1;
  return { middle, last, flat: last <= middle * FLAT_RATIO + slack };
}

/** Least-squares slope of a series over its middle and last thirds, per minute (a diagnostic). */
function tailSlopePerMinute(samples: Sample[], field: SampleField) {
  return slopePerMinute(samples.slice(Math.max(1, Math.floor(samples.length / 3))), (s) => s[field]);
}

/** Sample indices closest to 1/3 and 2/3 of the run: counters are compared over equal spans. */
function boundaries(tallies: Tally[]): [number, number, number, number] {
  const end = tallies.length - 1;
  return [0, Math.round(end / 3), Math.round((2 * end) / 3), end];
}

function perThird(tallies: Tally[], read: (t: Tally) => number) {
  const [a, b, c, d] = boundaries(tallies);
  const span = (i: number, j: number) => read(tallies[j]!) - read(tallies[i]!);
  return { first: span(a, b), middle: span(b, c), last: span(c, d) };
}

function ratePerThird(tallies: Tally[], read: (t: Tally) => number) {
  const [a, b, c, d] = boundaries(tallies);
  const rate = (i: number, j: number) =>
    (read(tallies[j]!) - read(tallies[i]!)) / Math.max(1e-9, tallies[j]!.atS - tallies[i]!.atS);
  return { first: rate(a, b), middle: rate(b, c), last: rate(c, d) };
}

interface Line {
  label: string;
  color: string;
  points: { x: number; y: number }[];
  dashed?: boolean;
}

const PALETTE = [
  '#1c7ed6',
  '#e8590c',
  '#2b8a3e',
  '#ae3ec9',
  '#f08c00',
  '#0ca678',
  '#c2255c',
  '#495057',
  '#5c940d',
  '#862e9c',
];

function renderSvg(panels: { title: string; lines: Line[]; note?: string }[], maxS: number): string {
  const width = 980;
  const panel = 180;
  const margin = { left: 64, right: 250, top: 30, gap: 56 };
  const plotWidth = width - margin.left - margin.right;
  const height = margin.top + panels.length * (panel + margin.gap) + 10;
  const x = (s: number) => margin.left + (s / Math.max(1, maxS)) * plotWidth;
  const parts: string[] = [];
  panels.forEach((p, k) => {
    const top = margin.top + k * (panel + margin.gap);
    const maxY = Math.max(1, ...p.lines.flatMap((l) => l.points.map((pt) => pt.y))) * 1.15;
    const y = (v: number) => top + panel - (v / maxY) * panel;
    parts.push(
      `<text x="${margin.left}" y="${top - 8}" font-weight="bold">${p.title}</text>`,
      `<rect x="${margin.left}" y="${top}" width="${plotWidth}" height="${panel}" fill="none" stroke="#ced4da"/>`,
      ...[0, 0.5, 1].map(
        (f) =>
          `<text x="${margin.left - 6}" y="${(y(maxY * f) + 4).toFixed(1)}" text-anchor="end">${(maxY * f).toFixed(maxY < 10 ? 1 : 0)}</text>`,
      ),
      ...[0, 1 / 3, 2 / 3, 1].map(
        (f) =>
          `<text x="${x(maxS * f).toFixed(1)}" y="${top + panel + 14}" text-anchor="middle">${(maxS * f).toFixed(0)}</text>`,
      ),
      ...[1 / 3, 2 / 3].map(
        (f) =>
          `<line x1="${x(maxS * f).toFixed(1)}" y1="${top}" x2="${x(maxS * f).toFixed(1)}" y2="${top + panel}" stroke="#e9ecef"/>`,
      ),
      ...p.lines.map((l) => {
        const points = l.points.map((pt) => `${x(pt.x).toFixed(1)},${y(pt.y).toFixed(1)}`).join(' ');
        const dash = l.dashed ? ' stroke-dasharray="6 4"' : '';
        return `<polyline fill="none" stroke="${l.color}" stroke-width="1.5"${dash} points="${points}"/>`;
      }),
      ...p.lines.map(
        (l, i) =>
          `<text x="${width - margin.right + 12}" y="${top + 14 * (i + 1)}" fill="${l.color}">${l.label}</text>`,
      ),
    );
    if (p.note) {
      parts.push(`<text x="${margin.left + 8}" y="${top + 18}" fill="#495057">${p.note}</text>`);
    }
  });
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    '<rect width="100%" height="100%" fill="white"/>',
    ...parts,
    `<text x="${margin.left + plotWidth / 2}" y="${height - 8}" text-anchor="middle">seconds since the load started (thirds marked)</text>`,
    '</svg>',
    '',
  ].join('\n');
}

async function main(): Promise<number> {
  const fleet = new Fleet(INTERVAL_MS, LIMIT_RPS);
  try {
    const controller = await fleet.controller('controller');
    const aggregators = await Promise.all(
      ['z1', 'z2'].map((zone) => fleet.aggregator(`aggregator-${zone}`, zone, [controller.grpc!])),
    );
    const upstream = await fleet.track(startWorker('upstream', 'upstream', {}));
    const upstreamUrl = `http://${listeningField(upstream, 'http')}`;
    const proxies = await Promise.all(
      PROXIES.map((spec) => {
        const aggregator = aggregators[spec.zone === 'z1' ? 0 : 1]!;
        const rulesPath = join(fleet.dir, `${spec.id}.yaml`);
        writeFileSync(
          rulesPath,
          [
            'version: 1',
            'upstream:',
            `  url: ${upstreamUrl}`,
            '  connections: 16',
            'backend:',
            '  kind: global',
            `  aggregators: ["${aggregator.grpc}"]`,
            `  zone: ${spec.zone}`,
            `  intervalMs: ${INTERVAL_MS}`,
            'buckets:',
            `  - name: ${BUCKET}`,
            `    key: ${BUCKET}`,
            `    limit: ${LIMIT_RPS}`,
            '    windowSec: 1',
            '',
          ].join('\n'),
        );
        return fleet.track(
          startSpillway(spec.id, [
            'proxy',
            '--config',
            rulesPath,
            '--listen',
            '127.0.0.1:0',
            '--ops',
            '127.0.0.1:0',
            '--id',
            spec.id,
            '--log-level',
            'warn',
          ]),
        );
      }),
    );
    const loadSpec: SoakLoadSpec = {
      targets: proxies.map((p, i) => ({
        name: p.name,
        address: listeningField(p, 'proxy'),
        rps: OFFERED_RPS * PROXIES[i]!.share,
      })),
      path: PATH,
      maxInFlight: MAX_IN_FLIGHT,
    };
    const load = await fleet.track(startWorker('load', 'load', loadSpec));
    const processes = [controller, ...aggregators, ...proxies, upstream, load];

    const samples = new Map<string, Sample[]>(processes.map((p) => [p.name, []]));
    const tallies: Tally[] = [];
    const startedMs = performance.now();
    process.stdout.write(
      `soak: ${processes.length} processes, ${OFFERED_RPS} rps offered through ${proxies.length} proxies ` +
        `against a ${LIMIT_RPS} rps limit, for ${DURATION_S} s, sampling every ${SAMPLE_S} s\n`,
    );
    for (let k = 0; ; k++) {
      const atS = (performance.now() - startedMs) / 1000;
      const scraped = new Map<string, Map<string, number>>();
      for (const p of processes) {
        if (!p.running) throw new Error(`${p.name} died:\n${p.output.slice(-10).join('\n')}`);
        const { sample, series } = await sampleProcess(p, atS);
        samples.get(p.name)!.push(sample);
        scraped.set(p.name, series);
      }
      const fromProxies = (metric: RegExp) =>
        proxies.reduce((n, p) => n + sumMatching(scraped.get(p.name)!, metric), 0);
      const fromLoad = (metric: RegExp) => sumMatching(scraped.get(load.name)!, metric);
      const loadOutcome = (outcome: string) =>
        fromLoad(new RegExp(`^spillway_soak_load_responses_total\\{.*outcome="${outcome}"\\}$`));
      const tally: Tally = {
        atS,
        load1: loadavg()[0]!,
        offered: fromLoad(/^spillway_soak_load_responses_total\{/),
        ok: loadOutcome('ok'),
        limited: loadOutcome('limited'),
        upstream: sumMatching(scraped.get(upstream.name)!, /^spillway_soak_upstream_requests_total$/),
        forwarded: fromProxies(/^spillway_proxy_requests_total\{outcome="forwarded"\}$/),
        proxyLimited: fromProxies(/^spillway_proxy_requests_total\{outcome="limited"\}$/),
        proxyInFlight: fromProxies(/^spillway_proxy_in_flight_requests$/),
        loadInFlight: fromLoad(/^spillway_soak_load_in_flight_requests$/),
        latencySumS: fromLoad(/^spillway_soak_load_response_seconds_sum$/),
        latencyCount: fromLoad(/^spillway_soak_load_response_seconds_count$/),
        errors: Object.fromEntries(
          ERROR_SERIES.map((e) => [
            e.name,
            e.from === 'proxies' ? fromProxies(e.metric) : fromLoad(e.metric),
          ]),
        ),
        loadFailuresByProxy: Object.fromEntries(
          proxies.map((p) => [
            p.name,
            fromLoad(
              new RegExp(
                `^spillway_soak_load_responses_total\\{target="${p.name}",outcome="(?!ok"|limited")[^"]*"\\}$`,
              ),
            ),
          ]),
        ),
      };
      const previous = tallies.at(-1);
      tallies.push(tally);
      const rss = processes.map((p) => samples.get(p.name)!.at(-1)!.rssMb.toFixed(0)).join(' ');
      const errorsNow = Object.values(tally.errors).reduce((a, b) => a + b, 0);
      const rate = (read: (t: Tally) => number) =>
        previous ? ((read(tally) - read(previous)) / (tally.atS - previous.atS)).toFixed(0) : '-';
      process.stdout.write(
        `  ${atS.toFixed(0)} s: RSS MB ${rss}; offered ${rate((t) => t.offered)} rps, upstream ${rate((t) => t.upstream)} rps, ` +
          `429 ${rate((t) => t.limited)} rps, errors ${errorsNow}, load ${tally.load1.toFixed(2)}\n`,
      );
      if (atS >= DURATION_S) break;
      await sleep(Math.max(0, startedMs + (k + 1) * SAMPLE_S * 1000 - performance.now()));
    }

    const results = processes.map((p) => {
      const list = samples.get(p.name)!;
      const [, , c, d] = boundaries(tallies);
      return {
        name: p.name,
        rss: thirds(list, 'rssMb'),
        heapCommitted: thirds(list, 'heapCommittedMb'),
        heap: thirds(list, 'heapMb'),
        rssSlopeMbPerMin: tailSlopePerMinute(list, 'rssMb'),
        fds: thirds(list, 'fds'),
        /** Mean CPU use over the last third, % of one core. */
        cpuPercentLastThird: (100 * (list[d]!.cpuS - list[c]!.cpuS)) / (list[d]!.atS - list[c]!.atS),
        samples: list,
      };
    });
    const errors = ERROR_SERIES.map((e) => {
      const counts = perThird(tallies, (t) => t.errors[e.name]!);
      return {
        name: e.name,
        total: tallies.at(-1)!.errors[e.name]!,
        ...counts,
        noGrowth: counts.last <= counts.middle * FLAT_RATIO + 2,
      };
    });
    const rates = {
      offered: ratePerThird(tallies, (t) => t.offered),
      ok: ratePerThird(tallies, (t) => t.ok),
      limited: ratePerThird(tallies, (t) => t.limited),
      upstream: ratePerThird(tallies, (t) => t.upstream),
      forwarded: ratePerThird(tallies, (t) => t.forwarded),
      proxyLimited: ratePerThird(tallies, (t) => t.proxyLimited),
    };
    const latency = perThird(tallies, (t) => t.latencySumS);
    const latencyCount = perThird(tallies, (t) => t.latencyCount);
    const meanLatencyMs = {
      first: (1000 * latency.first) / Math.max(1, latencyCount.first),
      middle: (1000 * latency.middle) / Math.max(1, latencyCount.middle),
      last: (1000 * latency.last) / Math.max(1, latencyCount.last),
    };
    const load1 = tallies.map((t) => t.load1);
    const admittedOk = ['middle', 'last'].every(
      (third) => Math.abs(rates.upstream[third as 'middle' | 'last'] / LIMIT_RPS - 1) <= ADMITTED_TOLERANCE,
    );
    const bothOutcomes = rates.ok.last > 0 && rates.limited.last > 0;
    const flat = results.every((r) => r.rss.flat && r.heap.flat && r.fds.flat);
    const noErrorGrowth = errors.every((e) => e.noGrowth);
    const pass = flat && noErrorGrowth && admittedOk && bothOutcomes;
    const header = {
      date: new Date().toISOString(),
      node: process.version,
      cpus: `${cpus().length} x ${cpus()[0]?.model ?? 'unknown'}`,
      command: `node --import tsx scripts/soak.ts --duration-s ${DURATION_S} --sample-s ${SAMPLE_S} --offered-rps ${OFFERED_RPS} --limit-rps ${LIMIT_RPS}`,
      commit: sourceCommit(),
      durationS: DURATION_S,
      sampleS: SAMPLE_S,
      limitRps: LIMIT_RPS,
      offeredRps: OFFERED_RPS,
      proxies: PROXIES.map((p, i) => ({ ...p, rps: loadSpec.targets[i]!.rps })),
      flatRatio: FLAT_RATIO,
      loadAverage1m: { mean: mean(load1), max: Math.max(...load1), atEnd: loadavg() },
    };
    writeFileSync(
      join(values.out!, 'soak.json'),
      `${JSON.stringify(
        {
          ...header,
          pass,
          flat,
          noErrorGrowth,
          admittedOk,
          bothOutcomes,
          rates,
          meanLatencyMs,
          errors,
          results,
          tallies,
        },
        null,
        2,
      )}\n`,
    );
    const fmt = (t: { middle: number; last: number; flat: boolean }, digits = 1) =>
      `${t.middle.toFixed(digits)} → ${t.last.toFixed(digits)}${t.flat ? '' : ' **not flat**'}`;
    const r0 = (x: number) => x.toFixed(0);
    const rateRow = (name: string, r: { first: number; middle: number; last: number }) =>
      `| ${name} | ${r0(r.first)} | ${r0(r.middle)} | ${r0(r.last)} |`;
    const md = [
      '# Soak',
      '',
      `${header.date}, Node ${header.node}, ${header.cpus}. Reproduce: \`${reproduce(header.command)}\` (\`npm run soak\` runs 600 s with these defaults).`,
      '',
      `A controller, two zone aggregators, four \`spillway proxy\` sidecars (global backend, two per zone, each reporting to its zone's aggregator every ${INTERVAL_MS} ms) in front of one upstream, ` +
        `and an HTTP load generator (undici, keep-alive, open loop) offering ${OFFERED_RPS} rps of \`GET ${PATH}\` split ${PROXIES.map((p) => `${(p.share * 100).toFixed(0)}%`).join(' / ')} over the proxies, ` +
        `against a global limit of ${LIMIT_RPS} rps on bucket \`${BUCKET}\`, for ${DURATION_S} s, every part its own process on loopback, sampled every ${SAMPLE_S} s. ` +
        `1-minute load average during the run: mean ${header.loadAverage1m.mean.toFixed(2)}, max ${header.loadAverage1m.max.toFixed(2)} on ${cpus().length} cores shared with other work.`,
      '',
      '## Memory and handles',
      '',
      `Each cell: mean of the middle third → mean of the last third; flat means last ≤ ${FLAT_RATIO} × middle (+1 MB, +2 fds), judged on RSS, heap used and fds. ` +
        "Not part of the verdict: the RSS slope, a least-squares fit over the middle and last thirds; V8's committed heap (reserved for new and old space, used or not: when V8 resizes it, RSS follows); CPU, mean over the last third in % of one core.",
      '',
      '| process | RSS MB | RSS slope MB/min | heap used MB | heap committed MB | open fds | CPU % |',
      '|---|---|---|---|---|---|---|',
      ...results.map(
        (r) =>
          `| ${r.name} | ${fmt(r.rss)} | ${r.rssSlopeMbPerMin >= 0 ? '+' : ''}${r.rssSlopeMbPerMin.toFixed(2)} | ${fmt(r.heap)} | ${r.heapCommitted.middle.toFixed(1)} → ${r.heapCommitted.last.toFixed(1)} | ${fmt(r.fds, 0)} | ${r.cpuPercentLastThird.toFixed(0)} |`,
      ),
      '',
      '## Throughput (rps, per third of the run)',
      '',
      '| | first | middle | last |',
      '|---|---|---|---|',
      rateRow('offered by the load generator', rates.offered),
      rateRow('2xx at the load generator', rates.ok),
      rateRow('429 at the load generator', rates.limited),
      rateRow('forwarded by the proxies', rates.forwarded),
      rateRow('received by the upstream (admitted)', rates.upstream),
      `| mean response time at the load generator (ms) | ${meanLatencyMs.first.toFixed(2)} | ${meanLatencyMs.middle.toFixed(2)} | ${meanLatencyMs.last.toFixed(2)} |`,
      '',
      `Admitted rate vs the ${LIMIT_RPS} rps limit: middle third ${((100 * rates.upstream.middle) / LIMIT_RPS).toFixed(1)}%, last third ${((100 * rates.upstream.last) / LIMIT_RPS).toFixed(1)}% (must be within ±${ADMITTED_TOLERANCE * 100}%: ${admittedOk ? 'yes' : '**no**'}). The first third includes the seconds before the first directive, when every request is admitted.`,
      '',
      '## Errors (counts per third of the run)',
      '',
      `No growth means last ≤ ${FLAT_RATIO} × middle + 2 for every counter.`,
      '',
      '| counter | first | middle | last | total (from the load start) |',
      '|---|---|---|---|---|',
      ...errors.map(
        (e) =>
          `| ${e.name} | ${e.first} | ${e.middle} | ${e.last}${e.noGrowth ? '' : ' **grew**'} | ${e.total} |`,
      ),
      '',
      `Load-side failures (every outcome but 2xx and 429) by proxy, from the load start: ${Object.entries(
        tallies.at(-1)!.loadFailuresByProxy,
      )
        .map(([name, n]) => `${name} ${n}`)
        .join(
          ', ',
        )}. A request is skipped when ${MAX_IN_FLIGHT} are already in flight to its proxy: that proxy answered nothing for about ${(MAX_IN_FLIGHT / (OFFERED_RPS * PROXIES[0]!.share)).toFixed(1)}–${(MAX_IN_FLIGHT / (OFFERED_RPS * PROXIES[3]!.share)).toFixed(1)} s (busiest–quietest proxy).`,
      '',
      `Verdict: memory and handles **${flat ? 'flat' : 'NOT flat'}**, errors **${noErrorGrowth ? 'not growing' : 'GROWING'}**, admitted rate **${admittedOk ? 'at the limit' : 'OFF the limit'}**, 2xx and 429 **${bothOutcomes ? 'both present' : 'NOT both present'}**: **${pass ? 'pass' : 'FAIL'}**. Plot: [soak.svg](soak.svg).`,
      '',
    ].join('\n');
    writeFileSync(join(values.out!, 'soak.md'), md);

    const maxS = tallies.at(-1)!.atS;
    const perProcess = (field: SampleField): Line[] =>
      results.map((r, i) => ({
        label: r.name,
        color: PALETTE[i % PALETTE.length]!,
        points: r.samples.map((s) => ({ x: s.atS, y: s[field] })),
      }));
    const rateLine = (label: string, color: string, read: (t: Tally) => number): Line => ({
      label,
      color,
      points: tallies.slice(1).map((t, i) => ({
        x: t.atS,
        y: (read(t) - read(tallies[i]!)) / (t.atS - tallies[i]!.atS),
      })),
    });
    const totalErrors = (t: Tally) => Object.values(t.errors).reduce((a, b) => a + b, 0);
    const errorLines: Line[] = [
      {
        label: 'all errors',
        color: '#c92a2a',
        points: tallies.map((t) => ({ x: t.atS, y: totalErrors(t) })),
      },
      ...errors
        .filter((e) => e.total > 0)
        .map((e, i) => ({
          label: e.name,
          color: PALETTE[i % PALETTE.length]!,
          points: tallies.map((t) => ({ x: t.atS, y: t.errors[e.name]! })),
        })),
    ];
    writeFileSync(
      join(values.out!, 'soak.svg'),
      renderSvg(
        [
          { title: 'RSS (MB) per process', lines: perProcess('rssMb') },
          { title: 'V8 heap used (MB) per process', lines: perProcess('heapMb') },
          { title: 'V8 heap committed (MB) per process', lines: perProcess('heapCommittedMb') },
          { title: 'open file descriptors per process', lines: perProcess('fds') },
          {
            title: 'requests per second (between samples)',
            lines: [
              rateLine('offered', '#495057', (t) => t.offered),
              rateLine('2xx at the client', '#2b8a3e', (t) => t.ok),
              rateLine('429 at the client', '#e8590c', (t) => t.limited),
              rateLine('received by upstream', '#1c7ed6', (t) => t.upstream),
              {
                label: `limit (${LIMIT_RPS})`,
                color: '#c92a2a',
                dashed: true,
                points: [
                  { x: 0, y: LIMIT_RPS },
                  { x: maxS, y: LIMIT_RPS },
                ],
              },
            ],
          },
          {
            title: 'errors so far (cumulative, every error counter)',
            lines: errorLines,
            note: totalErrors(tallies.at(-1)!) === 0 ? 'no errors in the whole run' : undefined,
          },
        ],
        maxS,
      ),
    );
    process.stdout.write(md);
    return pass ? 0 : 1;
  } finally {
    // The load first, so the proxies and the upstream are not stopped under it.
    const load = fleet.started.find((p) => p.name === 'load');
    if (load) await stopSpillway(load, 5_000);
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
