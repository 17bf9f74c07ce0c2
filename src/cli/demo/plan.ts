/**
 * What `spillway demo` runs: the limits file it writes and the load it offers over time. The plan
 * is one value shared by the coordinator (which prints the phase) and the load processes (which
 * offer the load), so every process agrees on the shape from one start time.
 *
 * The load crosses every limit at some point in each 60-second cycle (about 250 requests a second
 * on average, so that a laptop runs the HTTP version with room to spare):
 * - `checkout` (enforce, 100/s): a slow wave around 85/s plus a 10-second spike to about 2x.
 * - `search` (shadow, 75/s): a wave from 20 to 100/s; above 75 the data plane counts would-drops only.
 * - `api:caller=*` (enforce, 20/s per caller, acme 50/s): 60-160/s shared by six callers with a
 *   Zipf(1.2) skew, so the biggest callers go over their own limits while the small ones never do.
 */
export const DEMO_CYCLE_S = 60;

export const DEMO_CALLERS = ['acme', 'globex', 'initech', 'umbrella', 'hooli', 'stark'] as const;
const ZIPF_EXPONENT = 1.2;

export interface DemoStream {
  /** The bucket key the data plane offers load to. */
  bucket: string;
  /** Through the proxies: the request that lands in this bucket (see demoProxyRulesYaml). */
  path: string;
  caller?: string;
  /** Offered rate over the whole fleet at `tS` seconds after the demo started, before scaling. */
  rateAt(tS: number): number;
}

const wave = (tS: number, periodS: number, phase = 0) => Math.sin((2 * Math.PI * tS) / periodS + phase);
const inSpike = (tS: number) => {
  const t = tS % DEMO_CYCLE_S;
  return t >= 20 && t < 30;
};

/** Zipf weights over the callers, summing to 1. */
export function zipfWeights(count: number, exponent: number): number[] {
  const raw = Array.from({ length: count }, (_, i) => 1 / (i + 1) ** exponent);
  const total = raw.reduce((a, b) => a + b, 0);
  return raw.map((w) => w / total);
}

const callerWeights = zipfWeights(DEMO_CALLERS.length, ZIPF_EXPONENT);
const callersTotalAt = (tS: number) => 110 + 50 * wave(tS, 50);

export const DEMO_STREAMS: readonly DemoStream[] = [
  {
    bucket: 'checkout',
    path: '/checkout',
    rateAt: (tS) => 85 + 30 * wave(tS, 40) + (inSpike(tS) ? 100 : 0),
  },
  { bucket: 'search', path: '/search', rateAt: (tS) => 60 + 40 * wave(tS, 30, 1) },
  ...DEMO_CALLERS.map((caller, i) => ({
    bucket: `api:caller=${caller}`,
    path: '/api/orders',
    caller,
    rateAt: (tS: number) => callersTotalAt(tS) * callerWeights[i]!,
  })),
];

/** A name for what the load is doing now, for the terminal summary. */
export function demoPhase(tS: number): string {
  if (inSpike(tS)) return 'checkout spike (about 2x its limit)';
  const search = DEMO_STREAMS[1]!.rateAt(tS);
  if (search > 75) return 'search above its shadow limit (would-drop only)';
  return callersTotalAt(tS) > 125 ? 'busy callers: acme and globex over their limits' : 'steady';
}

/** The limits file the demo's controller loads; `scale` multiplies every limit (and the load). */
export function demoLimitsYaml(scale: number): string {
  const n = (value: number) => Number((value * scale).toFixed(3));
  return [
    '# Written by `spillway demo`: edit it while the demo runs and the controller reloads it.',
    'version: 1',
    'intervalMs: 1000',
    'buckets:',
    '  - key: checkout',
    `    limitRps: ${n(100)}`,
    '    mode: enforce',
    '  - key: search',
    `    limitRps: ${n(75)}`,
    '    mode: shadow',
    '  - template: "api:caller=*"',
    `    limitRps: ${n(20)}`,
    '    mode: enforce',
    '    maxInstances: 100',
    '    overrides:',
    `      acme: ${n(50)}`,
    '',
  ].join('\n');
}

/**
 * The rules file of the demo's sidecar proxies (docs/proxy.md): global backend, one bucket per
 * route, keyed so that the rendered keys are the controller's bucket keys. The controller decides
 * limits and modes; the `limit`s here only feed the RateLimit headers clients see.
 */
export function demoProxyRulesYaml(options: {
  upstreamUrl: string;
  aggregator: string;
  zone: string;
  scale: number;
}): string {
  const n = (value: number) => Math.max(1, Math.round(value * options.scale));
  return [
    '# Written by `spillway demo` for its sidecar proxies.',
    'version: 1',
    'upstream:',
    `  url: ${options.upstreamUrl}`,
    '  connections: 16',
    'backend:',
    '  kind: global',
    `  aggregators: ["${options.aggregator}"]`,
    `  zone: ${options.zone}`,
    'buckets:',
    '  - name: checkout',
    '    key: checkout',
    `    limit: ${n(100)}`,
    '    windowSec: 1',
    '    match:',
    '      path: /checkout',
    '  - name: search',
    '    key: search',
    `    limit: ${n(75)}`,
    '    windowSec: 1',
    '    match:',
    '      path: /search',
    '  - name: per-caller',
    '    key: "api:caller={header:x-caller}"',
    `    limit: ${n(20)}`,
    '    windowSec: 1',
    '    match:',
    '      prefix: /api',
    '',
  ].join('\n');
}
