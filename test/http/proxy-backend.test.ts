import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { createProxyBackend } from '../../src/http/proxy/proxy-backend.js';
import { type ProxyRules, parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { advance, drive, FakeAggregator } from '../global/fixtures.js';

/** Rules for a global backend (interval 500 ms) with one bucket, `api`; `backendLines` adds to the backend. */
function globalRulesWith(backendLines: string): ProxyRules {
  return globalRules(
    `  - name: api
    limit: 10
    windowSec: 1
`,
    `  intervalMs: 500
${backendLines}`,
  );
}

/** The backend of `rules`, reporting to a fake aggregator over an in-memory network, on a manual clock. */
function reportingBackend(rules: ProxyRules) {
  const clock = new ManualClock(1_000_000);
  const network = new InMemoryNetwork({ scheduler: clock });
  const aggregator = new FakeAggregator();
  network.listen('agg-1', aggregator.handler);
  const backend = createProxyBackend(rules.backend, {
    id: 'test',
    controlClients: [network.connect('agg-1', { from: 'test' })],
    global: { scheduler: clock, random: seededRandom(1), jitterRatio: 0 },
  });
  return { clock, aggregator, backend };
}

function globalRules(buckets: string, backendLines = ''): ProxyRules {
  return parseProxyRules(`version: 1
upstream:
  url: http://127.0.0.1:1
backend:
  kind: global
  aggregators: [127.0.0.1:2]
  zone: z1
${backendLines}
buckets:
${buckets}`);
}

const FIXED_AND_KEYED = `  - name: login
    limit: 10
    windowSec: 1
    match: { prefix: /login }
  - name: per-key
    key: "api:caller={header:x-api-key}"
    limit: 10
    windowSec: 1
`;

describe('proxy backend: global', () => {
  it('reserves fixed-key buckets, so a flood of distinct keys cannot push them into the overflow handle', async () => {
    const rules = globalRules(FIXED_AND_KEYED);
    const backend = createProxyBackend(rules.backend, { id: 'test', global: { maxBuckets: 4 } });
    try {
      const login = backend.limiterFor(rules.buckets[0]!);
      const perKey = backend.limiterFor(rules.buckets[1]!);
      if (login.kind !== 'sync' || perKey.kind !== 'sync') throw new Error('global limiters are sync');
      // The flood comes first: `login` sees its first request only once the table is full.
      for (let i = 0; i < 100; i++) perKey.limit(`api:caller=k${i}`);
      login.limit('login');
      const snapshot = backend.globalLimiter!.snapshot();
      const entry = snapshot.buckets.find((b) => b.key === 'login');
      assert.ok(entry, 'login holds a table entry');
      assert.equal(entry.pinned, true);
      assert.equal(entry.offered, 1, "login's request was counted by its own bucket");
      assert.equal(snapshot.bucketCount, 4);
      assert.equal(snapshot.overflowOffered, 100 - 3, 'only attacker keys past the bound overflowed');
    } finally {
      await backend.close();
    }
  });

  it('a fixed-key bucket added while the table is full is served by key and logged, not refused', async () => {
    const warnings: string[] = [];
    const logger = {
      info: () => {},
      warn: (_obj: object, msg: string) => warnings.push(msg),
      error: () => {},
      debug: () => {},
    };
    const first = globalRules(FIXED_AND_KEYED);
    const backend = createProxyBackend(first.backend, { id: 'test', logger, global: { maxBuckets: 3 } });
    try {
      const perKey = backend.limiterFor(first.buckets[1]!);
      backend.limiterFor(first.buckets[0]!);
      assert.equal(perKey.kind, 'sync');
      if (perKey.kind !== 'sync') return;
      for (let i = 0; i < 10; i++) perKey.limit(`api:caller=k${i}`);
      const reloaded = globalRules(
        `${FIXED_AND_KEYED}  - name: signup\n    limit: 5\n    windowSec: 1\n    match: { prefix: /signup }\n`,
      );
      const signup = backend.limiterFor(reloaded.buckets[2]!);
      assert.equal(signup.kind, 'sync');
      assert.match(warnings.join('\n'), /table is full; this fixed-key bucket is not reserved/);
      if (signup.kind === 'sync') assert.equal(signup.limit('signup').allowed, true);
    } finally {
      await backend.close();
    }
  });

  it('a fixed key the limiter would refuse is a config error, not a per-request failure', () => {
    assert.throws(
      () => globalRules(`  - name: wide\n    key: "${'é'.repeat(200)}"\n    limit: 1\n    windowSec: 1\n`),
      {
        code: 'ERR_SPILLWAY_INVALID_CONFIG',
        message: /buckets\[0\]\.key: .*: a key of 400 bytes; at most 200$/,
      },
    );
  });
});

describe('proxy backend: local', () => {
  it('reports each bucket table: keys held, bound and evictions', async () => {
    const rules = parseProxyRules(`version: 1
upstream:
  url: http://127.0.0.1:1
backend:
  kind: local
  maxKeys: 50
buckets:
  - name: fixed
    limit: 10
    windowSec: 1
  - name: per-key
    key: "api:caller={header:x-api-key}"
    limit: 10
    windowSec: 3600
`);
    const backend = createProxyBackend(rules.backend, { id: 'test' });
    const fixed = backend.limiterFor(rules.buckets[0]!);
    const perKey = backend.limiterFor(rules.buckets[1]!);
    if (fixed.kind !== 'sync' || perKey.kind !== 'sync') throw new Error('local limiters are sync');
    fixed.limit('fixed');
    for (let i = 0; i < 80; i++) perKey.limit(`api:caller=k${i}`);
    assert.deepEqual(backend.keyTables(), [
      { bucket: 'fixed', keys: 1, maxKeys: 50, evictions: 0 },
      { bucket: 'per-key', keys: 50, maxKeys: 50, evictions: 30 },
    ]);
    // A reload removes `per-key`: its table goes with it; brought back, it starts empty.
    backend.keepOnly(new Set(['fixed']));
    assert.deepEqual(backend.keyTables(), [{ bucket: 'fixed', keys: 1, maxKeys: 50, evictions: 0 }]);
    assert.equal(backend.limiterFor(rules.buckets[0]!), fixed, 'a kept bucket keeps its limiter and counts');
    assert.notEqual(backend.limiterFor(rules.buckets[1]!), perKey);
    assert.deepEqual(backend.keyTables()[1], { bucket: 'per-key', keys: 0, maxKeys: 50, evictions: 0 });
    await backend.close();
  });
});

describe('proxy backend: global stale policy from the rules file', () => {
  const rulesWith = globalRulesWith;

  /** The ratio the proxy applies `afterTtlMs` past the directive's TTL (3 s), with a 0.5 ratio handed out. */
  async function ratioAfterTtl(stalePolicy: string, afterTtlMs: number): Promise<number> {
    const rules = rulesWith(stalePolicy);
    const { clock, aggregator, backend } = reportingBackend(rules);
    try {
      const limiter = backend.limiterFor(rules.buckets[0]!);
      if (limiter.kind !== 'sync') throw new Error('global limiters are sync');
      limiter.limit('api');
      aggregator.set('api', { dropRatio: 0.5, limitRps: 10, ttlMs: 3_000 });
      const limits = backend.globalLimiter!;
      await drive(clock, limits.flush());
      assert.equal(limits.snapshot().buckets[0]?.effectiveRatio, 0.5);
      // The control plane goes away: every report from now on is refused.
      aggregator.refuse = new Error('down');
      limits.start();
      await advance(clock, 3_000 + afterTtlMs, 50);
      return limits.snapshot().buckets[0]!.effectiveRatio;
    } finally {
      await drive(clock, backend.close());
    }
  }

  it('default (absent): held 3 intervals past the TTL, then decays over 10 s', async () => {
    assert.equal(await ratioAfterTtl('', 1_000), 0.5);
    const decaying = await ratioAfterTtl('', 1_500 + 5_000);
    assert.ok(decaying > 0.2 && decaying < 0.3, `half-way through the decay: ${decaying}`);
  });

  it('open: the ratio drops to 0 as soon as the directive is stale', async () => {
    assert.equal(await ratioAfterTtl('  stalePolicy: { kind: open }', 600), 0);
  });

  it('hold: the ratio stays until a new directive, however long', async () => {
    assert.equal(await ratioAfterTtl('  stalePolicy: { kind: hold }', 60_000), 0.5);
  });

  it('hold-then-decay with its own hold and decay', async () => {
    const policy = '  stalePolicy: { kind: hold-then-decay, holdMs: 0, decayMs: 2000 }';
    const midway = await ratioAfterTtl(policy, 1_000);
    assert.ok(midway > 0.2 && midway < 0.3, `half-way through a 2 s decay: ${midway}`);
    assert.equal(await ratioAfterTtl(policy, 2_600), 0);
  });

  it('refuses an unknown kind or a negative hold, naming the field', () => {
    assert.throws(
      () => rulesWith('  stalePolicy: { kind: forever }'),
      (error: Error & { code?: string }) =>
        error.code === 'ERR_SPILLWAY_INVALID_CONFIG' && /stalePolicy/.test(error.message),
    );
    assert.throws(
      () => rulesWith('  stalePolicy: { kind: hold-then-decay, holdMs: -1 }'),
      (error: Error & { code?: string }) =>
        error.code === 'ERR_SPILLWAY_INVALID_CONFIG' && /stalePolicy\.holdMs/.test(error.message),
    );
  });
});

describe('proxy backend: global burst guard from the rules file', () => {
  const rulesWith = globalRulesWith;

  /** Calls a burst of 100 at one instant admits, once a directive gave this proxy a 10 rps allowance. */
  async function admittedInBurst(burstGuard: string): Promise<{ admitted: number; tripped: boolean }> {
    const rules = rulesWith(burstGuard);
    const { clock, aggregator, backend } = reportingBackend(rules);
    try {
      const limiter = backend.limiterFor(rules.buckets[0]!);
      if (limiter.kind !== 'sync') throw new Error('global limiters are sync');
      // 10 calls in 500 ms: 20 rps; told "fleet offered 20 rps, limit 10": an allowance of 10 rps.
      for (let i = 0; i < 10; i++) limiter.limit('api');
      clock.advance(500);
      aggregator.set('api', { dropRatio: 0, limitRps: 10, offeredRps: 20 });
      const limits = backend.globalLimiter!;
      await drive(clock, limits.flush());
      let admitted = 0;
      for (let i = 0; i < 100; i++) if (limiter.limit('api').allowed) admitted++;
      return { admitted, tripped: limits.snapshot().buckets[0]!.guardTripped };
    } finally {
      await drive(clock, backend.close());
    }
  }

  it('burstGuard: {} cuts a burst the ratio (0 here) would let through; absent or false, nothing cuts it', async () => {
    assert.deepEqual(await admittedInBurst('  burstGuard: {}'), { admitted: 5, tripped: true });
    assert.deepEqual(await admittedInBurst(''), { admitted: 100, tripped: false });
    assert.deepEqual(await admittedInBurst('  burstGuard: false'), { admitted: 100, tripped: false });
    const tuned = await admittedInBurst('  burstGuard: { tripUnits: 20 }');
    // Trip level 20: the detector checks every 20 / 8 units (every third call), so it sees the
    // level pass 20 at the 21st call.
    assert.deepEqual(tuned, { admitted: 20, tripped: true }, 'its options reach the limiter');
  });

  it('refuses a bad guard option, naming the field', () => {
    for (const bad of [
      '  burstGuard: true',
      '  burstGuard: { drainFactor: 1 }',
      '  burstGuard: { slack: 0.1 }',
    ]) {
      assert.throws(
        () => rulesWith(bad),
        (error: Error & { code?: string }) =>
          error.code === 'ERR_SPILLWAY_INVALID_CONFIG' && /burstGuard/.test(error.message),
        bad,
      );
    }
  });
});
