import assert from 'node:assert/strict';
import { describe, it, mock } from 'node:test';
import { createVaryingLoad } from '../../../src/cli/demo/load.js';
import {
  DEMO_CYCLE_S,
  DEMO_STREAMS,
  demoLimitsYaml,
  demoPhase,
  demoProxyRulesYaml,
  zipfWeights,
} from '../../../src/cli/demo/plan.js';
import { compileLimits, matchBucket } from '../../../src/config/compile-limits.js';
import { parseLimitsConfig } from '../../../src/config/limits-config.js';
import { parseProxyRules } from '../../../src/http/rules/proxy-rules.js';

// What `spillway demo` promises about its load: every limit is crossed at some point of the cycle
// (and the small callers never are), its files load, and the load generator keeps its rates.

const limits = compileLimits(parseLimitsConfig(demoLimitsYaml(1), 'demo-limits.yaml'));
const limitOf = (bucket: string) => matchBucket(limits, bucket)!.limitRps;
const samples = Array.from({ length: DEMO_CYCLE_S * 10 }, (_, i) => i / 10);

describe('demo plan', () => {
  it('every stream has a rule in the limits file', () => {
    for (const stream of DEMO_STREAMS) assert.ok(matchBucket(limits, stream.bucket), stream.bucket);
    assert.equal(matchBucket(limits, 'search')!.mode, 'shadow');
    assert.equal(matchBucket(limits, 'checkout')!.mode, 'enforce');
    assert.equal(matchBucket(limits, 'api:caller=acme')!.rule, 'api:caller=*');
  });

  it('crosses the limits of checkout, search, acme and globex in every cycle; small callers stay under', () => {
    for (const bucket of ['checkout', 'search', 'api:caller=acme', 'api:caller=globex']) {
      const stream = DEMO_STREAMS.find((s) => s.bucket === bucket)!;
      const rates = samples.map((t) => stream.rateAt(t));
      assert.ok(Math.max(...rates) > 1.2 * limitOf(bucket), `${bucket} goes over`);
      assert.ok(Math.min(...rates) < limitOf(bucket), `${bucket} goes under`);
    }
    for (const bucket of ['api:caller=umbrella', 'api:caller=hooli', 'api:caller=stark']) {
      const stream = DEMO_STREAMS.find((s) => s.bucket === bucket)!;
      assert.ok(Math.max(...samples.map((t) => stream.rateAt(t))) < limitOf(bucket), `${bucket} stays under`);
    }
    assert.ok(new Set(samples.map(demoPhase)).size >= 3, 'several phases per cycle');
  });

  it('skews callers by Zipf', () => {
    const weights = zipfWeights(6, 1.2);
    assert.ok(Math.abs(weights.reduce((a, b) => a + b, 0) - 1) < 1e-12);
    for (let i = 1; i < weights.length; i++) assert.ok(weights[i]! < weights[i - 1]!);
  });

  it("scales the proxies' rules file, which loads with a global backend", () => {
    const rules = parseProxyRules(
      demoProxyRulesYaml({
        upstreamUrl: 'http://127.0.0.1:3000',
        aggregator: '127.0.0.1:7071',
        zone: 'z1',
        scale: 2,
      }),
      'demo-proxy.yaml',
    );
    assert.equal(rules.backend.kind, 'global');
    assert.deepEqual(
      rules.buckets.map((b) => [b.config.name, b.config.limit]),
      [
        ['checkout', 200],
        ['search', 150],
        ['per-caller', 40],
      ],
    );
  });
});

describe('varying load', () => {
  it('issues the integral of the rate, interleaving streams', (t) => {
    mock.timers.enable({ apis: ['setInterval', 'Date'], now: 1_000_000 });
    t.after(() => mock.timers.reset());
    const order: number[] = [];
    const load = createVaryingLoad(
      [
        { rateAt: () => 1000, offer: () => order.push(0) },
        { rateAt: (tS) => (tS < 1 ? 0 : 500), offer: () => order.push(1) },
      ],
      { startedAtMs: 1_000_000, tickMs: 10 },
    );
    load.start();
    for (let i = 0; i < 200; i++) mock.timers.tick(10);
    load.stop();
    // A tick accrues the rate at its own time: the ticks at 1.00 s ... 2.00 s are 101 of 5 calls.
    assert.deepEqual(load.issued, [2000, 505]);
    // One tick's calls (10 and 5) alternate while both streams have some left.
    assert.deepEqual(order.slice(-15), [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0]);
  });
});
