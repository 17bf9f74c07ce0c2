import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { OpenLoop, type Shape } from './open-loop.js';
import { createRlsClient, type RlsClient } from './rls-client.js';

// Envoy's view of `spillway rls` as a fleet: a controller and a zone aggregator reading nothing but
// envoyproxy/ratelimit's own file, three `spillway rls` processes deciding in process, and an
// open-loop gRPC generator (what a fleet of Envoys is) offering 3x each limit over several
// descriptor shapes: a fixed bucket, a bucket per client address riding with a shadow rule, and a
// two-level per-minute rule. The assertion is on what the callers were answered.

const CONFIG = `
domain: edge
descriptors:
  - key: generic_key
    value: checkout
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 20 }
  - key: route
    value: search
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 1200 }
  - key: tenant
    value: beta
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 10 }
`;

const IPS = ['10.0.0.1', '10.0.0.2', '10.0.0.3'];
const SHAPES: Shape[] = [
  {
    name: 'checkout',
    rps: 300,
    request: { domain: 'edge', descriptors: [{ entries: [{ key: 'generic_key', value: 'checkout' }] }] },
  },
  ...IPS.map(
    (ip): Shape => ({
      name: `ip ${ip}`,
      rps: 60,
      request: {
        domain: 'edge',
        descriptors: [
          { entries: [{ key: 'remote_address', value: ip }] },
          { entries: [{ key: 'tenant', value: 'beta' }] },
        ],
      },
    }),
  ),
  {
    name: 'search',
    rps: 60,
    request: {
      domain: 'edge',
      descriptors: [
        {
          entries: [
            { key: 'route', value: 'search' },
            { key: 'user', value: 'u1' },
          ],
        },
      ],
    },
  },
];
/** Each shape's first descriptor's limit (the shadow rule rides second on the per-address shapes). */
const LIMIT_RPS: Record<string, number> = {
  checkout: 100,
  ...Object.fromEntries(IPS.map((ip) => [`ip ${ip}`, 20])),
  search: 20,
};
const BUCKET: Record<string, string> = {
  checkout: 'edge.generic_key=checkout',
  ...Object.fromEntries(IPS.map((ip) => [`ip ${ip}`, `edge.remote_address#${ip.replaceAll('.', '%2E')}`])),
  search: 'edge.route=search.user#u1',
};
const MEASURE_MS = 20_000;

describe('spillway rls fleet: controller, aggregator, three rls processes, open-loop Envoy load', {
  timeout: 240_000,
}, () => {
  const started: SpillwayProcess[] = [];
  let dir = '';
  let controller: SpillwayProcess;
  let rls: SpillwayProcess[] = [];
  let clients: RlsClient[] = [];
  let load: OpenLoop;

  const track = async (promise: Promise<SpillwayProcess>) => {
    const p = await promise;
    started.push(p);
    return p;
  };

  /** Σ over instances of offered rate x (1 - effective ratio) for a bucket: what the fleet admits now. */
  const impliedAdmittedRps = async (bucket: string): Promise<number> => {
    let sum = 0;
    for (const instance of rls) {
      const series = await scrape(instance.ops);
      const offered = series.get(seriesKey('spillway_host_offered_rps', { bucket })) ?? 0;
      const ratio = series.get(seriesKey('spillway_effective_drop_ratio', { bucket })) ?? 0;
      sum += offered * (1 - ratio);
    }
    return sum;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-rls-'));
    const config = join(dir, 'ratelimit.yaml');
    writeFileSync(config, CONFIG);
    const quiet = ['--log-level', 'warn'];
    controller = await track(
      startSpillway('controller', [
        'controller',
        ...['--config', config, '--config-format', 'envoy-ratelimit'],
        ...['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0', '--id', 'controller'],
        ...quiet,
      ]),
    );
    const aggregator = await track(
      startSpillway('aggregator', [
        'aggregator',
        ...['--zone', 'z1', '--parent', controller.grpc!, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'],
        ...['--id', 'agg-z1'],
        ...quiet,
      ]),
    );
    rls = await Promise.all(
      [1, 2, 3].map((n) =>
        track(
          startSpillway(`rls-${n}`, [
            'rls',
            ...['--config', config, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'],
            ...['--aggregator', aggregator.grpc!, '--zone', 'z1', '--id', `rls-${n}`],
            ...quiet,
          ]),
        ),
      ),
    );
    clients = rls.map((p) => createRlsClient(p.grpc!));
    load = new OpenLoop(SHAPES, clients);
    load.start();
  });

  after(async () => {
    load?.stop();
    await waitFor('calls in flight to settle', async () => (load.inFlight === 0 ? true : undefined), {
      timeoutMs: 10_000,
    }).catch(() => {});
    for (const client of clients) client.close();
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    rmSync(dir, { recursive: true, force: true });
  });

  it('converges: fleet-wide OK answers within 5% of each limit; a shadow rule is never OVER_LIMIT', async (t) => {
    // Converged: every enforced bucket's implied admission within 5% of its limit at two scrapes in a row.
    let inBand = 0;
    await waitFor(
      'every enforced bucket to converge on its limit',
      async () => {
        let all = true;
        for (const [name, bucket] of Object.entries(BUCKET)) {
          const admitted = await impliedAdmittedRps(bucket);
          if (Math.abs(admitted - LIMIT_RPS[name]!) > 0.05 * LIMIT_RPS[name]!) all = false;
        }
        inBand = all ? inBand + 1 : 0;
        return inBand >= 2 ? true : undefined;
      },
      { timeoutMs: 60_000, everyMs: 500 },
    );
    load.mark();
    const implied: Record<string, number[]> = {};
    const measureUntil = performance.now() + MEASURE_MS;
    while (performance.now() < measureUntil) {
      for (const [name, bucket] of Object.entries(BUCKET)) {
        implied[name] ??= [];
        implied[name].push(await impliedAdmittedRps(bucket));
      }
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
    const { counts, seconds } = load.mark();
    assert.deepEqual(load.errors, [], 'every call answered');

    let fleetOk = 0;
    let fleetLimit = 0;
    for (const [name, c] of counts) {
      const limit = LIMIT_RPS[name]!;
      const okRps = c.descriptors[0]!.ok / seconds;
      const offeredRps = c.sent / seconds;
      assert.ok(
        offeredRps > 2.7 * limit,
        `${name}: offered ${offeredRps.toFixed(1)}/s, 3x its limit ${limit}/s`,
      );
      // What the instances apply, averaged over the window: free of the draws' sampling noise.
      const meanImplied = implied[name]!.reduce((a, b) => a + b, 0) / implied[name]!.length;
      assert.ok(
        Math.abs(meanImplied - limit) <= 0.05 * limit,
        `${name}: the instances admit ${meanImplied.toFixed(1)}/s by their ratios, limit ${limit}/s`,
      );
      // The answers themselves: 5%, plus three standard deviations of the random draws for the
      // small buckets (20/s over 20 s is 400 answers: one deviation is 4%).
      const deviation = Math.sqrt(c.sent * (limit / offeredRps) * (1 - limit / offeredRps)) / seconds;
      assert.ok(
        Math.abs(okRps - limit) <= 0.05 * limit + 3 * deviation,
        `${name}: ${okRps.toFixed(1)} OK answers/s, limit ${limit}/s (${c.sent} calls over ${seconds.toFixed(1)} s)`,
      );
      t.diagnostic(
        `${name}: offered ${offeredRps.toFixed(1)}/s, OK ${okRps.toFixed(1)}/s, implied ${meanImplied.toFixed(1)}/s, limit ${limit}/s`,
      );
      fleetOk += okRps;
      fleetLimit += limit;
      if (name.startsWith('ip ')) {
        assert.equal(c.descriptors[1]!.over, 0, `${name}: the shadow rule never answered OVER_LIMIT`);
        assert.equal(c.descriptors[1]!.ok, c.answered);
      }
    }
    assert.ok(
      Math.abs(fleetOk - fleetLimit) <= 0.05 * fleetLimit,
      `fleet: ${fleetOk.toFixed(1)} OK answers/s over every enforced bucket, limits sum to ${fleetLimit}/s`,
    );
    // The shadow rule was over (its would-drops are counted) and still answered OK.
    const shadow = await scrape(rls[0]!.ops);
    assert.ok(
      (shadow.get(
        seriesKey('spillway_rls_rule_hits_total', { rule: 'edge.tenant=beta', result: 'shadow_over_limit' }),
      ) ?? 0) > 0,
    );
    assert.equal(
      shadow.get(
        seriesKey('spillway_rls_rule_hits_total', { rule: 'edge.tenant=beta', result: 'over_limit' }),
      ),
      0,
    );
  });

  it('the controller killed: every call is still answered, on the ratios held', async () => {
    load.mark();
    controller.child.kill('SIGKILL');
    await controller.exited;
    const survivedFrom = performance.now();
    // The hold (3 intervals after a 4-interval TTL) outlasts this: the instances keep limiting.
    await waitFor('5 s of calls after the controller died', async () =>
      performance.now() - survivedFrom > 5_000 ? true : undefined,
    );
    const { counts } = load.mark();
    assert.deepEqual(load.errors, [], 'no call failed');
    for (const [name, c] of counts) {
      await waitFor(`${name}: answers to the calls sent`, async () =>
        c.answered + c.errors === c.sent ? true : undefined,
      );
      assert.equal(c.errors, 0, `${name}: no errors`);
      assert.equal(c.answered, c.sent, `${name}: every call answered`);
      assert.ok(c.descriptors[0]!.over > 0, `${name}: still limited on the held ratio`);
    }
  });
});
