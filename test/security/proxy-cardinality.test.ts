import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  type AttackBackend,
  attackOptions,
  checkAttack,
  runAttack,
  startAttackTarget,
} from './cardinality-attack.js';

// A cardinality attack through a real `spillway proxy` process: distinct x-api-key values, one
// request each, to a bucket keyed by that header, while fixed-key buckets and two keys of the
// attacked bucket are checked to keep deciding (see cardinality-attack.ts for the setup and
// `checkAttack` for what must hold). The full million: scripts/cardinality.ts,
// bench/results/cardinality.md.
//
// Local: 100,000 keys against backend.maxKeys 10,000; every attacker key stays live for a minute,
// so with the bound ignored the table would hold all 100,000 (peak ≠ bound) and the live heap would
// grow by ~20 MB (> 12). Global: 30,000 keys against the limiter's 10,000-bucket table; `late`
// (a fixed-key bucket first used once the table is full) is limited only because the proxy pins
// fixed keys, and the proxy's /metrics stays small only because per-bucket series are capped.
// The full table costs ~10 MB of live heap (23.1 → 32.7 MB, this test on an idle machine), so a
// table that ignored its bound and held all 30,000 would grow by ~29 MB (> 24).

// The global run reports every 500 ms (the script uses the default 1 s) to settle sooner.
const RUNS: {
  backend: AttackBackend;
  keys: number;
  heapGrowthBoundMb: number;
  overrides?: { intervalMs: number; settleMs: number };
}[] = [
  { backend: 'local', keys: 100_000, heapGrowthBoundMb: 12 },
  { backend: 'global', keys: 30_000, heapGrowthBoundMb: 24, overrides: { intervalMs: 500, settleMs: 5_000 } },
];

/** Largest /metrics scrape of the proxy allowed: 1,000 exported buckets are ~1.9 MB; 10,000 were ~19 MB. */
const METRICS_BOUND_BYTES = 4 * 2 ** 20;

describe('cardinality attack through spillway proxy', { timeout: 180_000 }, () => {
  for (const run of RUNS) {
    it(`${run.backend} backend: ${run.keys.toLocaleString('en-US')} distinct keys, memory bounded, buckets still limit`, async (t) => {
      const options = attackOptions(run.backend, { keys: run.keys, ...run.overrides });
      const target = await startAttackTarget(options);
      let result: Awaited<ReturnType<typeof runAttack>>;
      try {
        result = await runAttack(target, options);
      } finally {
        await target.close();
      }
      const m = result.memory;
      t.diagnostic(
        `${result.requestsPerSecond.toFixed(0)} req/s; RSS ${m.rssBeforeMb.toFixed(0)} → peak ${m.rssPeakMb.toFixed(0)} MB; ` +
          `live heap ${m.heapLiveBeforeMb.toFixed(1)} → ${m.heapLiveEndMb.toFixed(1)} → ${m.heapLiveAfterMb.toFixed(1)} MB; keys ${JSON.stringify(m.keysPeak)}; ` +
          `/metrics peak ${(m.metricsBytesPeak / 1024).toFixed(0)} KiB`,
      );
      const checks = checkAttack(result, options, { heapGrowthBoundMb: run.heapGrowthBoundMb });
      for (const check of checks)
        t.diagnostic(`${check.ok ? 'pass' : 'FAIL'}: ${check.name}: ${check.detail}`);
      const failed = checks.filter((c) => !c.ok);
      assert.deepEqual(
        failed.map((c) => `${c.name}: ${c.detail}`),
        [],
        'every check passes',
      );
      assert.ok(checks.length >= 7, 'every client was checked');
      assert.ok(
        m.metricsBytesPeak < METRICS_BOUND_BYTES,
        `largest /metrics scrape ${(m.metricsBytesPeak / 2 ** 20).toFixed(1)} MB`,
      );
    });
  }
});
