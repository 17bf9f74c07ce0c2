// Cardinality attack through `spillway proxy`: a million requests, each with a distinct x-api-key,
// through a real proxy process (local backend with maxKeys, then global backend with a real
// controller and aggregator), sampling the proxy's RSS, heap and key counts, while paced clients
// check that a fixed-key bucket, a fixed-key bucket first used mid-attack, and a greedy and a
// well-behaved key of the attacked bucket keep deciding as their limits say.
//
//   node --import tsx scripts/cardinality.ts                     # 1,000,000 keys, both backends
//   node --import tsx scripts/cardinality.ts --keys 100000 --backends local
//
// Writes bench/results/cardinality.json, cardinality.md (tables) and cardinality.svg (RSS, heap and
// keys held against requests sent). Exits 1 when a check fails (test/security/cardinality-attack.ts).
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { reproduce, sourceCommit } from '../bench/provenance.js';
import { REPO_ROOT } from '../test/integration/spillway-process.js';
import {
  type AttackBackend,
  type AttackCheck,
  type AttackOptions,
  type AttackResult,
  attackOptions,
  checkAttack,
  GLOBAL_MAX_BUCKETS,
  type ProxySample,
  runAttack,
  startAttackTarget,
} from '../test/security/cardinality-attack.js';

const { values } = parseArgs({
  options: {
    keys: { type: 'string', default: '1000000' },
    backends: { type: 'string', default: 'local,global' },
    'max-keys': { type: 'string', default: '10000' },
    connections: { type: 'string', default: '32' },
    out: { type: 'string', default: join(REPO_ROOT, 'bench/results') },
  },
});
const KEYS = Number(values.keys);
const MAX_KEYS = Number(values['max-keys']);
const CONNECTIONS = Number(values.connections);
const BACKENDS = values.backends!.split(',') as AttackBackend[];
for (const backend of BACKENDS) {
  if (backend !== 'local' && backend !== 'global')
    throw new Error(`--backends: unknown backend "${backend}"`);
}
if (!(Number.isInteger(KEYS) && KEYS >= 20_000)) throw new Error('--keys must be an integer ≥ 20000');

/** Live-heap growth allowed (MB): the local tables' keys, or the global limiter's 10,000 buckets, plus slack. */
const HEAP_GROWTH_BOUND_MB: Record<AttackBackend, number> = { local: 12, global: 24 };

interface Run {
  options: AttackOptions;
  result: AttackResult;
  checks: AttackCheck[];
  loadBefore: number[];
  loadAfter: number[];
}

const fmtLoad = (l: number[]) => l.map((x) => x.toFixed(2)).join(', ');
const mb = (x: number) => x.toFixed(1);

function renderSvg(runs: Run[]): string {
  const width = 960;
  const panel = 180;
  const margin = { left: 70, right: 150, top: 30, gap: 50 };
  const plotWidth = width - margin.left - margin.right;
  const fields: { label: string; value: (s: ProxySample, run: Run) => number | undefined }[] = [
    { label: 'proxy RSS (MB)', value: (s) => s.rssMb },
    { label: 'proxy heap used (MB, sampled from /metrics; garbage included)', value: (s) => s.heapUsedMb },
    {
      label: 'keys held by the attacked bucket (local) / the global limiter table',
      value: (s, run) => s.keys?.[run.options.backend === 'local' ? 'per-key' : '(global table)'],
    },
  ];
  const height = margin.top + fields.length * (panel + margin.gap) + 10;
  const colors = ['#1c7ed6', '#e8590c'];
  const maxX = Math.max(...runs.map((r) => r.result.keys), 1);
  const parts: string[] = [];
  fields.forEach((field, f) => {
    const top = margin.top + f * (panel + margin.gap);
    const points = runs.map((run) =>
      run.result.samples.flatMap((s) => {
        const v = field.value(s, run);
        return v === undefined || !Number.isFinite(v) ? [] : [{ x: s.sent, y: v }];
      }),
    );
    const maxY = Math.max(1, ...points.flat().map((p) => p.y)) * 1.15;
    const x = (v: number) => margin.left + (v / maxX) * plotWidth;
    const y = (v: number) => top + panel - (v / maxY) * panel;
    parts.push(
      `<text x="${margin.left}" y="${top - 8}" font-weight="bold">${field.label}</text>`,
      `<rect x="${margin.left}" y="${top}" width="${plotWidth}" height="${panel}" fill="none" stroke="#ced4da"/>`,
      ...[0, 0.5, 1].map(
        (t) =>
          `<text x="${margin.left - 6}" y="${(y(maxY * t) + 4).toFixed(1)}" text-anchor="end">${(maxY * t).toFixed(0)}</text>`,
      ),
      ...[0, 0.5, 1].map(
        (t) =>
          `<text x="${x(maxX * t).toFixed(1)}" y="${top + panel + 14}" text-anchor="middle">${(maxX * t).toLocaleString('en-US')}</text>`,
      ),
      ...points.map(
        (list, i) =>
          `<polyline fill="none" stroke="${colors[i % colors.length]}" stroke-width="1.5" points="${list
            .map((p) => `${x(p.x).toFixed(1)},${y(p.y).toFixed(1)}`)
            .join(' ')}"/>`,
      ),
    );
  });
  parts.push(
    ...runs.map(
      (run, i) =>
        `<text x="${width - margin.right + 12}" y="${margin.top + 16 * (i + 1)}" fill="${colors[i % colors.length]}">${run.options.backend} backend</text>`,
    ),
    `<text x="${margin.left + plotWidth / 2}" y="${height - 6}" text-anchor="middle">attacker requests answered (one distinct key each)</text>`,
  );
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    '<rect width="100%" height="100%" fill="white"/>',
    ...parts,
    '</svg>',
    '',
  ].join('\n');
}

function renderMarkdown(runs: Run[], header: Record<string, string>, passed: boolean): string {
  const lines = [
    '# Cardinality attack through `spillway proxy`',
    '',
    `${header.date}, Node ${header.node}, ${header.cpus}. Reproduce: \`${reproduce(header.command ?? '')}\`.`,
    `Load average (1, 5, 15 min) at the start: ${header.loadStart}; at the end: ${header.loadEnd} (the machine is shared: rates are what this run got, not a ceiling).`,
    '',
    `Each run: a real upstream (node:http), a real \`spillway proxy\` process (for the global backend also a controller and a zone aggregator process, 1 s interval), and ${KEYS.toLocaleString('en-US')} requests from a separate attacker process over ${CONNECTIONS} keep-alive connections, each request with a distinct ${runs[0]?.options.keyLength}-character \`x-api-key\` (the longest a key template keeps verbatim) to a bucket keyed \`api:caller={header:x-api-key}\`. ` +
      'Meanwhile paced clients: `victim`, a fixed-key bucket (limit 50 rps) offered 100 rps throughout; `late`, a second fixed-key bucket (same limit, same offer) first used only once the attacker has filled the tables; and two keys of the attacked bucket, one well-behaved (under its limit) and one greedy (over it, its allowance spent before the attack). ' +
      "The proxy's RSS is read from /proc every second, its /metrics every 2 s; the live heap is read after two forced full collections (test/security/gc-on-signal.mjs) just before the attack, as it ends (tables full) and after the settle period (by then the global limiter may have expired the attacker's idle buckets).",
    '',
    '## Memory and throughput',
    '',
    `| | ${runs.map((r) => `${r.options.backend} backend`).join(' | ')} |`,
    `|---|${runs.map(() => '---|').join('')}`,
  ];
  const row = (label: string, cell: (run: Run) => string) =>
    lines.push(`| ${label} | ${runs.map(cell).join(' | ')} |`);
  row('key bound', (r) =>
    r.options.backend === 'local'
      ? `backend.maxKeys ${r.options.maxKeys.toLocaleString('en-US')} per bucket`
      : `global limiter maxBuckets ${GLOBAL_MAX_BUCKETS.toLocaleString('en-US')} (one table)`,
  );
  row('attacked bucket', (r) => `${r.options.perKeyLimit} per ${r.options.perKeyWindowSec} s per key`);
  row('requests answered', (r) => r.result.attacker.sent.toLocaleString('en-US'));
  row('attack duration', (r) => `${r.result.attackSeconds.toFixed(1)} s`);
  row('requests/s achieved', (r) => r.result.requestsPerSecond.toFixed(0));
  row(
    'proxy CPU',
    (r) =>
      `${r.result.proxyCpuSeconds.toFixed(1)} s (${((1e6 * r.result.proxyCpuSeconds) / r.result.attacker.sent).toFixed(0)} µs per request)`,
  );
  row('proxy RSS before → peak → after', (r) => {
    const m = r.result.memory;
    return `${mb(m.rssBeforeMb)} → ${mb(m.rssPeakMb)} → ${mb(m.rssAfterMb)} MB`;
  });
  row('proxy live heap before → end of attack → settled', (r) => {
    const m = r.result.memory;
    const growth = m.heapLiveEndMb - m.heapLiveBeforeMb;
    return `${mb(m.heapLiveBeforeMb)} → ${mb(m.heapLiveEndMb)} (${growth >= 0 ? '+' : ''}${mb(growth)}) → ${mb(m.heapLiveAfterMb)} MB`;
  });
  row('proxy heap used, peak sample', (r) => `${mb(r.result.memory.heapPeakMb)} MB`);
  row('keys held, peak', (r) =>
    Object.entries(r.result.memory.keysPeak)
      .map(([bucket, n]) => `${bucket}: ${n.toLocaleString('en-US')}`)
      .join(', '),
  );
  row('keys held after settling', (r) => {
    const last = r.result.samples.findLast((s) => s.keys !== undefined)?.keys ?? {};
    return Object.entries(last)
      .map(([bucket, n]) => `${bucket}: ${n.toLocaleString('en-US')}`)
      .join(', ');
  });
  row('keys evicted / decided by overflow', (r) => {
    const c = r.result.proxyCounters;
    return r.options.backend === 'local'
      ? `${(c['spillway_proxy_bucket_key_evictions_total{bucket="per-key"}'] ?? 0).toLocaleString('en-US')} evicted`
      : `${(c.spillway_overflow_offered_total ?? 0).toLocaleString('en-US')} requests by the overflow handle`;
  });
  row('proxy /metrics, largest scrape', (r) => `${(r.result.memory.metricsBytesPeak / 1024).toFixed(0)} KiB`);
  row('control plane: RSS peak; live heap before → end → settled; /metrics', (r) =>
    r.options.backend === 'local'
      ? '—'
      : Object.entries(r.result.memory.controlLiveHeapMb)
          .map(
            ([name, h]) =>
              `${name}: ${mb(r.result.memory.controlRssPeakMb[name] ?? Number.NaN)} MB; ${mb(h.before)} → ${mb(h.end)} → ${mb(h.after)} MB; ${((r.result.memory.controlMetrics[name]?.bytes ?? 0) / 1024).toFixed(0)} KiB`,
          )
          .join('; '),
  );
  row('upstream requests', (r) => r.result.upstreamRequests.toLocaleString('en-US'));
  lines.push('', '## Buckets that must keep working', '');
  for (const run of runs) {
    lines.push(
      `**${run.options.backend} backend** (\`late\` first used after ${run.result.lateStartedAfterKeys.toLocaleString('en-US')} attacker requests)`,
      '',
      '| client | offered rps | limit | admitted rps during the attack | admitted rps after it | statuses |',
      '|---|---|---|---|---|---|',
    );
    const perKeyLimit = `${run.options.perKeyLimit} per ${run.options.perKeyWindowSec} s`;
    for (const c of run.result.clients) {
      const w = (x: { admittedRps: number; seconds: number }) =>
        x.seconds >= 2 ? `${x.admittedRps.toFixed(2)} (${x.seconds.toFixed(0)} s)` : '—';
      lines.push(
        `| ${c.name} | ${c.offeredRps} | ${c.apiKey ? perKeyLimit : `${run.options.victimLimitRps} per 1 s`} | ${w(c.during)} | ${w(c.after)} | ${Object.entries(
          c.statuses,
        )
          .map(([s, n]) => `${s}: ${n}`)
          .join(', ')} |`,
      );
    }
    lines.push('', '| check | result | detail |', '|---|---|---|');
    for (const check of run.checks) {
      lines.push(`| ${check.name} | ${check.ok ? 'pass' : '**FAIL**'} | ${check.detail} |`);
    }
    lines.push('');
  }
  lines.push(
    `Verdict: **${passed ? 'all checks pass' : 'a check FAILED'}**. Plot: [cardinality.svg](cardinality.svg). Raw samples: cardinality.json.`,
    '',
  );
  return lines.join('\n');
}

async function main(): Promise<number> {
  const runs: Run[] = [];
  const loadStart = loadavg();
  for (const backend of BACKENDS) {
    const options = attackOptions(backend, {
      keys: KEYS,
      maxKeys: MAX_KEYS,
      connections: CONNECTIONS,
      onSample: (s) =>
        process.stdout.write(
          `  ${backend} ${s.phase} ${s.atS.toFixed(0)} s: ${s.sent} sent, RSS ${s.rssMb.toFixed(0)} MB, heap ${s.heapUsedMb?.toFixed(0)} MB, keys ${JSON.stringify(s.keys)}\n`,
        ),
    });
    process.stdout.write(`cardinality: ${backend} backend, ${KEYS} distinct keys\n`);
    const loadBefore = loadavg();
    const target = await startAttackTarget(options);
    let result: AttackResult;
    try {
      result = await runAttack(target, options);
    } finally {
      await target.close();
    }
    const checks = checkAttack(result, options, { heapGrowthBoundMb: HEAP_GROWTH_BOUND_MB[backend] });
    for (const c of checks) process.stdout.write(`  ${c.ok ? 'pass' : 'FAIL'}: ${c.name}: ${c.detail}\n`);
    runs.push({ options, result, checks, loadBefore, loadAfter: loadavg() });
  }
  const passed = runs.every((r) => r.checks.every((c) => c.ok));
  const header = {
    date: new Date().toISOString(),
    node: process.version,
    cpus: `${cpus().length} x ${cpus()[0]?.model ?? 'unknown'}`,
    command: `node --import tsx scripts/cardinality.ts --keys ${KEYS} --backends ${BACKENDS.join(',')} --max-keys ${MAX_KEYS} --connections ${CONNECTIONS}`,
    commit: sourceCommit(),
    loadStart: fmtLoad(loadStart),
    loadEnd: fmtLoad(loadavg()),
  };
  const json = {
    ...header,
    passed,
    heapGrowthBoundMb: HEAP_GROWTH_BOUND_MB,
    runs: runs.map(({ options, result, checks, loadBefore, loadAfter }) => {
      const { onSample: _onSample, ...rest } = options;
      return { options: rest, loadBefore, loadAfter, checks, result };
    }),
  };
  writeFileSync(join(values.out!, 'cardinality.json'), `${JSON.stringify(json, null, 2)}\n`);
  const md = renderMarkdown(runs, header, passed);
  writeFileSync(join(values.out!, 'cardinality.md'), md);
  writeFileSync(join(values.out!, 'cardinality.svg'), renderSvg(runs));
  process.stdout.write(md);
  return passed ? 0 : 1;
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
