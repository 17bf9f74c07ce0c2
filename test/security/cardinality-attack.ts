import { fork } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Pool } from 'undici';
import {
  type SpillwayProcess,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import type { AttackerInput, AttackerProgress } from './cardinality-attacker.js';

/**
 * A cardinality attack through a real `spillway proxy` process (shared by
 * test/security/proxy-cardinality.test.ts and scripts/cardinality.ts): a real upstream, the proxy
 * (and for the `global` backend a real controller and zone aggregator), an attacker sending one
 * request per distinct `x-api-key` to a bucket keyed by that header, and paced clients whose
 * buckets must keep working: `victim` (a fixed key, offered twice its limit throughout), `late`
 * (a fixed key first used once the attacker has filled the tables), and two keys of the attacked
 * bucket itself, one well-behaved and one greedy. The proxy's RSS (/proc), heap and key counts
 * (its /metrics) are sampled as the attack runs.
 */
export type AttackBackend = 'local' | 'global';

export interface AttackOptions {
  backend: AttackBackend;
  /** Distinct keys the attacker sends, one request each. */
  keys: number;
  /** `backend.maxKeys` of the local backend (the global limiter's table is its default 10,000). */
  maxKeys: number;
  /** Attacker connections (keep-alive, one request in flight each). */
  connections: number;
  /** Length of each attacker key (128 is the longest a key template keeps verbatim). */
  keyLength: number;
  /** Limit of `victim` and `late` (fixed keys), offered at twice this rate. */
  victimLimitRps: number;
  /**
   * The attacked bucket's per-key limit (`limit` per `windowSec`). With the local backend an
   * attacker key stays in the table until its bucket is full again (`windowSec / limit` seconds),
   * so a slow refill keeps every attacker key live and the table at `maxKeys`.
   */
  perKeyLimit: number;
  perKeyWindowSec: number;
  /** Rate of the attacked bucket's well-behaved key (under its limit) and of its greedy key (over it). */
  wellBehavedRps: number;
  greedyRps: number;
  /** Report interval of the global backend's processes. */
  intervalMs: number;
  /** Victims run this long before the attack (directives arrive) and after it. */
  settleMs: number;
  sampleEveryMs: number;
  /** /metrics of the proxy is scraped this often (it costs the proxy CPU; the global backend's is large under attack). */
  scrapeEveryMs: number;
  /** Called with each sample (progress lines). */
  onSample?: (sample: ProxySample) => void;
}

export interface ProxySample {
  /** Since the attack started (negative: before). */
  atS: number;
  phase: 'before' | 'attack' | 'after';
  /** Attacker requests answered so far. */
  sent: number;
  rssMb: number;
  /** From the last scrape (undefined between scrapes). */
  heapUsedMb?: number;
  /** `spillway_proxy_bucket_keys` per bucket (local) or `spillway_buckets` as `(global table)`. */
  keys?: Record<string, number>;
  metricsBytes?: number;
  metricsMs?: number;
  /** RSS of the control-plane processes (global backend). */
  controlRssMb?: Record<string, number>;
}

export interface ClientOutcome {
  name: string;
  path: string;
  apiKey?: string;
  offeredRps: number;
  limitRps: number;
  /** When the client started, in s since the attack started. */
  startS: number;
  /** Over the attack, from `startS` + the convergence allowance to the attack's end. */
  during: WindowOutcome;
  /** Over the settle period after the attack. */
  after: WindowOutcome;
  statuses: Record<string, number>;
}

export interface WindowOutcome {
  seconds: number;
  offeredRps: number;
  admittedRps: number;
  admitted: number;
  rejected: number;
}

export interface AttackResult {
  backend: AttackBackend;
  keys: number;
  maxKeys: number;
  connections: number;
  keyLength: number;
  attackSeconds: number;
  requestsPerSecond: number;
  /** Attacker requests answered when `late` sent its first request. */
  lateStartedAfterKeys: number;
  attacker: AttackerProgress;
  upstreamRequests: number;
  /** Proxy process CPU over the attack (user + system, /proc/PID/stat). */
  proxyCpuSeconds: number;
  samples: ProxySample[];
  clients: ClientOutcome[];
  /** Counters from the proxy's last scrape. */
  proxyCounters: Record<string, number>;
  /** Figures derived from the samples. */
  memory: {
    rssBeforeMb: number;
    rssPeakMb: number;
    rssAfterMb: number;
    /**
     * Heap used right after two full collections: just before the attack, as it ends (tables
     * full), and after the settle period (the global limiter's idle buckets may have expired).
     */
    heapLiveBeforeMb: number;
    heapLiveEndMb: number;
    heapLiveAfterMb: number;
    /** Highest heap-used reading while sampling (garbage included: what the process must have room for). */
    heapPeakMb: number;
    /** Live heap of the control-plane processes (global backend), as for the proxy. */
    controlLiveHeapMb: Record<string, { before: number; end: number; after: number }>;
    keysPeak: Record<string, number>;
    metricsBytesPeak: number;
    controlRssPeakMb: Record<string, number>;
    /** Size and time of one /metrics scrape of each control-plane process, after the attack. */
    controlMetrics: Record<string, { bytes: number; ms: number }>;
  };
}

export interface AttackTarget {
  base: string;
  proxy: SpillwayProcess;
  /** Controller and aggregator (global backend). */
  control: SpillwayProcess[];
  upstreamRequests(): number;
  close(): Promise<void>;
}

const VICTIM = 'victim';
const LATE = 'late';
const ATTACKED = 'per-key';

function rulesFile(upstreamUrl: string, backend: string, options: AttackOptions): string {
  return `version: 1
upstream:
  url: ${upstreamUrl}
  connections: 64
${backend}
buckets:
  - name: ${VICTIM}
    limit: ${options.victimLimitRps}
    windowSec: 1
    match: { prefix: /victim }
  - name: ${LATE}
    limit: ${options.victimLimitRps}
    windowSec: 1
    match: { prefix: /late }
  - name: ${ATTACKED}
    key: "api:caller={header:x-api-key}"
    limit: ${options.perKeyLimit}
    windowSec: ${options.perKeyWindowSec}
    match: { prefix: /api }
`;
}

async function startCountingUpstream(): Promise<{ server: Server; url: string; count: () => number }> {
  let count = 0;
  const server = createServer((_req, res) => {
    count++;
    res.end('ok');
  });
  server.keepAliveTimeout = 10_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { server, url, count: () => count };
}

export async function startAttackTarget(options: AttackOptions): Promise<AttackTarget> {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-cardinality-'));
  const upstream = await startCountingUpstream();
  const started: SpillwayProcess[] = [];
  const anyPort = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--log-level', 'warn'];
  const measured = { env: { NODE_OPTIONS: `--import=${GC_HOOK}` } };
  const close = async () => {
    for (const p of started.reverse()) await stopSpillway(p, 5_000);
    upstream.server.closeAllConnections();
    await new Promise<void>((resolve) => upstream.server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    let backend: string;
    const control: SpillwayProcess[] = [];
    if (options.backend === 'global') {
      const limitsPath = join(dir, 'limits.yaml');
      writeFileSync(
        limitsPath,
        `version: 1
intervalMs: ${options.intervalMs}
buckets:
  - key: ${VICTIM}
    limitRps: ${options.victimLimitRps}
  - key: ${LATE}
    limitRps: ${options.victimLimitRps}
  - template: "api:caller=*"
    limitRps: ${options.perKeyLimit / options.perKeyWindowSec}
`,
      );
      const controller = await startSpillway(
        'controller',
        ['controller', '--config', limitsPath, ...anyPort],
        measured,
      );
      started.push(controller);
      const aggregator = await startSpillway(
        'aggregator',
        [
          'aggregator',
          '--zone',
          'z1',
          '--parent',
          controller.grpc!,
          '--interval-ms',
          String(options.intervalMs),
          ...anyPort,
        ],
        measured,
      );
      started.push(aggregator);
      control.push(controller, aggregator);
      backend = `backend:\n  kind: global\n  aggregators: [${aggregator.grpc}]\n  zone: z1\n  intervalMs: ${options.intervalMs}`;
    } else {
      backend = `backend:\n  kind: local\n  maxKeys: ${options.maxKeys}`;
    }
    const rulesPath = join(dir, 'rules.yaml');
    writeFileSync(rulesPath, rulesFile(upstream.url, backend, options));
    const proxy = await startSpillway('proxy', ['proxy', '--config', rulesPath, ...anyPort], measured);
    started.push(proxy);
    const line = proxy.output.find((l) => l.includes('"listening"'))!;
    const base = `http://${(JSON.parse(line) as { proxy: string }).proxy}`;
    return { base, proxy, control, upstreamRequests: upstream.count, close };
  } catch (error) {
    await close();
    throw error;
  }
}

const GC_HOOK = pathToFileURL(fileURLToPath(new URL('./gc-on-signal.mjs', import.meta.url))).href;

/**
 * Heap used by `p` right after two full collections (its live set), as gc-on-signal.mjs prints it.
 * Needs the process started with that file preloaded, as `startAttackTarget` does.
 */
export async function liveHeapMb(p: SpillwayProcess): Promise<number> {
  const collected = () => p.output.filter((line) => line.includes('gc-on-signal: collected'));
  const before = collected().length;
  p.child.kill('SIGUSR2');
  await waitFor(
    `${p.name} to collect garbage`,
    async () => (collected().length > before ? true : undefined),
    { timeoutMs: 10_000, everyMs: 20 },
  );
  const heapUsed = /heapUsed=(\d+)/.exec(collected().at(-1)!)?.[1];
  if (heapUsed === undefined) throw new Error(`${p.name}: gc-on-signal printed no heapUsed`);
  return Number(heapUsed) / 2 ** 20;
}

export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? Number.NaN) / 1024;
}

/** User + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15, in clock ticks of 1/100 s). */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

export interface Scrape {
  series: Map<string, number>;
  bytes: number;
  ms: number;
}

export async function scrapeMetrics(ops: string): Promise<Scrape> {
  const startedMs = performance.now();
  const response = await fetch(`http://${ops}/metrics`);
  const text = await response.text();
  const ms = performance.now() - startedMs;
  if (response.status !== 200) throw new Error(`GET ${ops}/metrics: ${response.status}`);
  const series = new Map<string, number>();
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*(?:\{.*\})?) (\S+)$/.exec(line);
    if (match) series.set(match[1]!, Number(match[2]));
  }
  return { series, bytes: Buffer.byteLength(text), ms };
}

/** Key counts from a scrape: per local bucket, or the global limiter's table. */
function keysFrom(series: Map<string, number>): Record<string, number> {
  const keys: Record<string, number> = {};
  for (const [name, value] of series) {
    const match = /^spillway_proxy_bucket_keys\{bucket="([^"]+)"\}$/.exec(name);
    if (match) keys[match[1]!] = value;
  }
  const table = series.get('spillway_buckets');
  if (table !== undefined) keys['(global table)'] = table;
  return keys;
}

/**
 * One client at a steady rate (requests sent on schedule, not after the previous answer), each
 * response recorded with its time. A main thread that falls behind sends the missed requests at
 * once, so the offered count stays right; the achieved rate is measured, not assumed.
 */
class PacedClient {
  readonly records: { atMs: number; status: number | 'error' }[] = [];
  readonly #pool: Pool;
  #timer: NodeJS.Timeout | undefined;
  #inFlight = new Set<Promise<void>>();
  startedAtMs = 0;

  constructor(
    readonly name: string,
    base: string,
    readonly path: string,
    readonly rps: number,
    readonly limitRps: number,
    readonly apiKey?: string,
  ) {
    this.#pool = new Pool(base, { connections: 8 });
  }

  start(): void {
    this.startedAtMs = performance.now();
    const periodMs = 1000 / this.rps;
    let sent = 0;
    const tick = () => {
      const due = Math.floor((performance.now() - this.startedAtMs) / periodMs) + 1;
      for (; sent < due; sent++) this.#send();
      this.#timer = setTimeout(tick, Math.max(1, this.startedAtMs + sent * periodMs - performance.now()));
    };
    tick();
  }

  #send(): void {
    const request = this.#pool
      .request({
        path: this.path,
        method: 'GET',
        headers: this.apiKey ? { 'x-api-key': this.apiKey } : {},
      })
      .then(
        async (response) => {
          await response.body.dump();
          this.records.push({ atMs: performance.now(), status: response.statusCode });
        },
        () => {
          this.records.push({ atMs: performance.now(), status: 'error' });
        },
      )
      .finally(() => this.#inFlight.delete(request));
    this.#inFlight.add(request);
  }

  async stop(): Promise<void> {
    clearTimeout(this.#timer);
    await Promise.all(this.#inFlight);
    await this.#pool.close();
  }

  window(fromMs: number, toMs: number): WindowOutcome {
    const inWindow = this.records.filter((r) => r.atMs >= fromMs && r.atMs < toMs);
    const seconds = Math.max(0.001, (toMs - fromMs) / 1000);
    const admitted = inWindow.filter((r) => r.status === 200).length;
    return {
      seconds,
      offeredRps: inWindow.length / seconds,
      admittedRps: admitted / seconds,
      admitted,
      rejected: inWindow.filter((r) => r.status === 429).length,
    };
  }

  statuses(): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const { status } of this.records) counts[status] = (counts[status] ?? 0) + 1;
    return counts;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export async function runAttack(target: AttackTarget, options: AttackOptions): Promise<AttackResult> {
  const pid = target.proxy.child.pid!;
  const victim = new PacedClient(
    VICTIM,
    target.base,
    '/victim/report',
    2 * options.victimLimitRps,
    options.victimLimitRps,
  );
  const late = new PacedClient(
    LATE,
    target.base,
    '/late/report',
    2 * options.victimLimitRps,
    options.victimLimitRps,
  );
  // Two keys of the attacked bucket: one under its limit (always admitted), one over it.
  const perKeyRps = options.perKeyLimit / options.perKeyWindowSec;
  const wellBehaved = new PacedClient(
    'well-behaved key',
    target.base,
    '/api/items',
    options.wellBehavedRps,
    perKeyRps,
    'well-behaved',
  );
  const greedy = new PacedClient(
    'greedy key',
    target.base,
    '/api/items',
    options.greedyRps,
    perKeyRps,
    'greedy',
  );
  const clients = [victim, wellBehaved, greedy, late];
  const samples: ProxySample[] = [];
  let attackStartMs = performance.now();
  let attackEndMs: number | undefined;
  let progress: AttackerProgress = { sent: 0, statuses: {}, elapsedMs: 0, done: false };
  let phase: ProxySample['phase'] = 'before';
  let lastScrape: Scrape | undefined;
  let lastScrapeMs = Number.NEGATIVE_INFINITY;
  let scraping: Promise<void> | undefined;

  const takeSample = () => {
    const sample: ProxySample = {
      atS: (performance.now() - attackStartMs) / 1000,
      phase,
      sent: progress.sent,
      rssMb: rssMb(pid),
    };
    if (target.control.length > 0) {
      sample.controlRssMb = Object.fromEntries(target.control.map((p) => [p.name, rssMb(p.child.pid!)]));
    }
    // Scrapes run beside the sampling timer so a slow /metrics does not delay RSS readings.
    if (!scraping && performance.now() - lastScrapeMs >= options.scrapeEveryMs) {
      lastScrapeMs = performance.now();
      scraping = scrapeMetrics(target.proxy.ops)
        .then((scrape) => {
          lastScrape = scrape;
          sample.heapUsedMb =
            (scrape.series.get('spillway_nodejs_heap_size_used_bytes') ?? Number.NaN) / 2 ** 20;
          sample.keys = keysFrom(scrape.series);
          sample.metricsBytes = scrape.bytes;
          sample.metricsMs = scrape.ms;
          options.onSample?.(sample);
        })
        .finally(() => {
          scraping = undefined;
        });
    }
    samples.push(sample);
  };
  let sampler: NodeJS.Timeout | undefined;
  const cpuBefore = cpuSeconds(pid);
  let cpuAfter = cpuBefore;
  let lateStartedAtSent = 0;
  const liveBefore: Record<string, number> = {};
  const liveEnd: Record<string, number> = {};
  const liveAfter: Record<string, number> = {};
  const controlMetrics: Record<string, { bytes: number; ms: number }> = {};
  try {
    for (const client of [victim, wellBehaved, greedy]) client.start();
    attackStartMs = performance.now() + options.settleMs;
    sampler = setInterval(takeSample, options.sampleEveryMs);
    await sleep(options.settleMs);
    // Just before the attack: the live heaps, then a sample (baseline RSS, heap and keys).
    for (const p of [target.proxy, ...target.control]) liveBefore[p.name] = await liveHeapMb(p);
    lastScrapeMs = Number.NEGATIVE_INFINITY;
    await scraping;
    takeSample();
    await scraping;

    phase = 'attack';
    attackStartMs = performance.now();
    const input: AttackerInput = {
      base: target.base,
      path: '/api/items',
      keys: options.keys,
      connections: options.connections,
      progressMs: 200,
      keyLength: options.keyLength,
    };
    const attacker = fork(fileURLToPath(new URL('./cardinality-attacker.ts', import.meta.url)), [], {
      execArgv: ['--import', 'tsx'],
      env: { ...process.env, NODE_OPTIONS: '' },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    // `late` starts once the attacker has sent twice the table bound: its key is new to a full table.
    const lateAfter = Math.min(options.keys / 2, 2 * Math.max(options.maxKeys, 10_000));
    try {
      progress = await new Promise<AttackerProgress>((resolve, reject) => {
        attacker.on('message', (message: AttackerProgress) => {
          progress = message;
          if (!late.startedAtMs && message.sent >= lateAfter) {
            lateStartedAtSent = message.sent;
            late.start();
          }
          if (message.done) resolve(message);
        });
        attacker.on('error', reject);
        attacker.on('exit', (code, signal) =>
          reject(new Error(`attacker exited (${code ?? signal}) before finishing`)),
        );
        attacker.send(input);
      });
    } finally {
      if (attacker.exitCode === null && attacker.signalCode === null) attacker.kill('SIGKILL');
    }
    attackEndMs = performance.now();
    cpuAfter = cpuSeconds(pid);
    if (!late.startedAtMs) late.start();
    for (const p of [target.proxy, ...target.control]) liveEnd[p.name] = await liveHeapMb(p);
    phase = 'after';
    await sleep(options.settleMs);
    lastScrapeMs = Number.NEGATIVE_INFINITY;
    await scraping;
    takeSample();
    await scraping;
    for (const p of [target.proxy, ...target.control]) liveAfter[p.name] = await liveHeapMb(p);
    for (const p of target.control) {
      const { bytes, ms } = await scrapeMetrics(p.ops);
      controlMetrics[p.name] = { bytes, ms };
    }
  } finally {
    clearInterval(sampler);
    await Promise.all(clients.map((c) => c.stop()));
  }
  const endMs = performance.now();
  const attackSeconds = (attackEndMs - attackStartMs) / 1000;
  // The global backend's loop needs a few intervals to converge on a new bucket.
  const convergeMs = options.backend === 'global' ? 4 * options.intervalMs : 1_000;
  const outcomes: ClientOutcome[] = clients.map((client) => ({
    name: client.name,
    path: client.path,
    apiKey: client.apiKey,
    offeredRps: client.rps,
    limitRps: client.limitRps,
    startS: (client.startedAtMs - attackStartMs) / 1000,
    during: client.window(Math.max(client.startedAtMs + convergeMs, attackStartMs), attackEndMs),
    after: client.window(attackEndMs + convergeMs, endMs),
    statuses: client.statuses(),
  }));
  const proxyCounters: Record<string, number> = {};
  for (const [name, value] of lastScrape?.series ?? []) {
    if (
      /^spillway_(proxy_requests_total|proxy_decisions_total|overflow_offered_total|proxy_bucket_key_evictions_total)/.test(
        name,
      )
    ) {
      proxyCounters[name] = value;
    }
  }
  const before = samples.filter((s) => s.phase === 'before');
  const afterSamples = samples.filter((s) => s.phase === 'after');
  const heap = (list: ProxySample[]) =>
    list.flatMap((s) => (s.heapUsedMb === undefined ? [] : [s.heapUsedMb]));
  const keysPeak: Record<string, number> = {};
  for (const s of samples) {
    for (const [bucket, n] of Object.entries(s.keys ?? {}))
      keysPeak[bucket] = Math.max(keysPeak[bucket] ?? 0, n);
  }
  const controlRssPeakMb: Record<string, number> = {};
  for (const s of samples) {
    for (const [name, mb] of Object.entries(s.controlRssMb ?? {})) {
      controlRssPeakMb[name] = Math.max(controlRssPeakMb[name] ?? 0, mb);
    }
  }
  return {
    backend: options.backend,
    keys: options.keys,
    maxKeys: options.maxKeys,
    connections: options.connections,
    keyLength: options.keyLength,
    attackSeconds,
    requestsPerSecond: progress.sent / attackSeconds,
    lateStartedAfterKeys: lateStartedAtSent,
    attacker: progress,
    upstreamRequests: target.upstreamRequests(),
    proxyCpuSeconds: cpuAfter - cpuBefore,
    samples,
    clients: outcomes,
    proxyCounters,
    memory: {
      rssBeforeMb: before.at(-1)?.rssMb ?? Number.NaN,
      rssPeakMb: Math.max(...samples.map((s) => s.rssMb)),
      rssAfterMb: afterSamples.at(-1)?.rssMb ?? Number.NaN,
      heapLiveBeforeMb: liveBefore[target.proxy.name] ?? Number.NaN,
      heapLiveEndMb: liveEnd[target.proxy.name] ?? Number.NaN,
      heapLiveAfterMb: liveAfter[target.proxy.name] ?? Number.NaN,
      heapPeakMb: Math.max(...heap(samples)),
      controlLiveHeapMb: Object.fromEntries(
        target.control.map((p) => [
          p.name,
          {
            before: liveBefore[p.name] ?? Number.NaN,
            end: liveEnd[p.name] ?? Number.NaN,
            after: liveAfter[p.name] ?? Number.NaN,
          },
        ]),
      ),
      keysPeak,
      metricsBytesPeak: Math.max(0, ...samples.map((s) => s.metricsBytes ?? 0)),
      controlRssPeakMb,
      controlMetrics,
    },
  };
}

/** The global limiter's default table bound (the proxy's rules do not change it). */
export const GLOBAL_MAX_BUCKETS = 10_000;

export interface AttackCheck {
  name: string;
  ok: boolean;
  detail: string;
}

/**
 * What a run must show, shared by the CI test and scripts/cardinality.ts: nothing failed, the key
 * table filled to its bound and no further, the live heap grew by at most `heapGrowthBoundMb`, and
 * every bucket that matters kept deciding as its limit says.
 */
export function checkAttack(
  result: AttackResult,
  options: AttackOptions,
  { heapGrowthBoundMb }: { heapGrowthBoundMb: number },
): AttackCheck[] {
  const checks: AttackCheck[] = [];
  const check = (name: string, ok: boolean, detail: string) => checks.push({ name, ok, detail });
  const failures = (statuses: Record<string, number>) =>
    Object.entries(statuses)
      .filter(([status]) => status === 'error' || Number(status) >= 500)
      .reduce((n, [, count]) => n + count, 0);
  const attackerFailed = failures(result.attacker.statuses);
  const clientsFailed = result.clients.reduce((n, c) => n + failures(c.statuses), 0);
  check(
    'no request failed (5xx or connection error)',
    attackerFailed === 0 && clientsFailed === 0 && result.attacker.sent === result.keys,
    `attacker ${result.attacker.sent} answered, ${JSON.stringify(result.attacker.statuses)}; paced clients ${clientsFailed} failed` +
      (result.attacker.firstError ? `; first error: ${result.attacker.firstError}` : ''),
  );

  const [tableName, bound] =
    options.backend === 'local' ? ['per-key', options.maxKeys] : ['(global table)', GLOBAL_MAX_BUCKETS];
  const peak = result.memory.keysPeak[tableName] ?? Number.NaN;
  check(
    'keys held reached the bound and never passed it',
    peak === bound,
    `${tableName}: peak ${peak} keys, bound ${bound}`,
  );
  const m = result.memory;
  const growth = Math.max(m.heapLiveEndMb, m.heapLiveAfterMb) - m.heapLiveBeforeMb;
  check(
    `live heap grew by at most ${heapGrowthBoundMb} MB`,
    growth <= heapGrowthBoundMb,
    `${m.heapLiveBeforeMb.toFixed(1)} before → ${m.heapLiveEndMb.toFixed(1)} at the end of the attack → ${m.heapLiveAfterMb.toFixed(1)} MB settled (at most ${growth >= 0 ? '+' : ''}${growth.toFixed(1)})`,
  );

  // The local token bucket is exact; the global loop converges within a few intervals and then
  // holds the admitted rate near the limit (test/http/proxy-global.test.ts allows 0.4–1.6; the
  // pin and series-cap regressions measured 2.0 and 1.8 times the limit).
  const [low, high] = options.backend === 'local' ? [0.9, 1.1] : [0.5, 1.5];
  const perKeyRps = options.perKeyLimit / options.perKeyWindowSec;
  for (const client of result.clients) {
    const windows = (
      [
        ['during the attack', client.during],
        ['after it', client.after],
      ] as const
    ).filter(([, w]) => w.seconds >= 2);
    const fmt = (w: WindowOutcome) =>
      `${w.admittedRps.toFixed(1)} of ${w.offeredRps.toFixed(1)} rps over ${w.seconds.toFixed(1)} s`;
    const rates = windows.map(([label, w]) => `${label} ${fmt(w)}`).join('; ');
    if (client.name === VICTIM || client.name === LATE) {
      check(
        `${client.name} (fixed key, limit ${client.limitRps} rps) admits ${low}–${high} × its limit`,
        windows.length > 0 &&
          windows.every(
            ([, w]) =>
              w.offeredRps >= 1.5 * client.limitRps &&
              w.admittedRps >= low * client.limitRps &&
              w.admittedRps <= high * client.limitRps,
          ),
        rates,
      );
    } else if (client.apiKey === 'well-behaved') {
      const sent = Object.values(client.statuses).reduce((a, b) => a + b, 0);
      check(
        'the well-behaved key of the attacked bucket is always admitted',
        sent > 0 && client.statuses['200'] === sent,
        `${JSON.stringify(client.statuses)}`,
      );
    } else if (client.apiKey === 'greedy') {
      // Its allowance was spent before the attack; a flood that evicted its entry would refill it.
      const w = client.during;
      const allowed =
        options.backend === 'local' ? 1 + perKeyRps * w.seconds : Math.max(2 * perKeyRps * w.seconds, 3);
      check(
        'the greedy key of the attacked bucket stays limited through the attack',
        w.seconds >= 2 && w.admitted <= allowed,
        `admitted ${w.admitted} in ${w.seconds.toFixed(1)} s (at most ${allowed.toFixed(1)} allowed), offered ${w.offeredRps.toFixed(1)} rps`,
      );
    }
  }
  return checks;
}

/**
 * The configuration both the CI test and scripts/cardinality.ts run. Local: the attacked bucket
 * allows 60 requests per hour per key, so an attacker key stays live (not yet refilled) for a
 * minute and the table sits at `maxKeys` for the whole attack. Global: 300 per minute (5 rps) per
 * key: the limiter is rate-based and its table keeps any key for its 60 s idle expiry anyway; the
 * well-behaved key offers a tenth of that, so one-request windows never read as over the limit.
 */
export function attackOptions(
  backend: AttackBackend,
  overrides: Partial<AttackOptions> & Pick<AttackOptions, 'keys'>,
): AttackOptions {
  const local = backend === 'local';
  return {
    backend,
    maxKeys: 10_000,
    connections: 32,
    keyLength: 120,
    victimLimitRps: 50,
    perKeyLimit: local ? 60 : 300,
    perKeyWindowSec: local ? 3_600 : 60,
    wellBehavedRps: local ? 0.1 : 0.5,
    greedyRps: local ? 40 : 50,
    intervalMs: 1_000,
    settleMs: local ? 4_000 : 8_000,
    sampleEveryMs: 1_000,
    scrapeEveryMs: 2_000,
    ...overrides,
  };
}
