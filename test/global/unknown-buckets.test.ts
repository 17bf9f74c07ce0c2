import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LimitsConfig } from '../../src/config/limits-config.js';
import { createAggregator } from '../../src/control/aggregator.js';
import { createController } from '../../src/control/controller.js';
import { ParentEpoch } from '../../src/control/parent-epoch.js';
import { UnknownBucketLog } from '../../src/control/unknown-bucket-log.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { createGlobalLimiter } from '../../src/global/index.js';
import { UNANSWERED_REPLIES } from '../../src/global/unknown-buckets.js';
import { keyFamily } from '../../src/protocol/key-family.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { advance } from '../control/report-fixtures.js';

/**
 * Unlimited is never silent (issue #35): a bucket key no rule of the controller matches gets no
 * directive and is not limited. The host says so through its limiter's logger once per key family
 * (the controller answered several of its reports without a directive for it), and the controller
 * logs it at most once per family and interval. A dead controller is not mistaken for a missing
 * rule.
 */
const START_MS = 1_700_000_000_000;
const limits: LimitsConfig = {
  version: 1,
  intervalMs: 1000,
  ttlMs: 4000,
  buckets: [
    { key: 'payments:charge', limitRps: 500, mode: 'enforce', scope: 'global' },
    {
      template: 'api:caller=*',
      limitRps: 100,
      mode: 'enforce',
      scope: 'global',
      overrides: {},
      maxInstances: 100,
    },
  ],
};

interface Line {
  fields: Record<string, unknown>;
  message: string;
}

function tree(options: { controllerReachable?: boolean; ttlMs?: number } = {}) {
  const clock = new ManualClock(START_MS);
  const network = new InMemoryNetwork({ scheduler: clock, delayMs: 2, random: seededRandom(7) });
  const controllerLines: Line[] = [];
  const controller = createController({
    id: 'ctl',
    config: { ...limits, ttlMs: options.ttlMs ?? limits.ttlMs },
    scheduler: clock,
    logger: { info: () => {}, warn: (fields, message) => controllerLines.push({ fields, message }) },
  });
  network.listen('ctl', controller.handleReport);
  if (options.controllerReachable === false) network.partition('ctl', true);
  const aggregator = createAggregator({
    id: 'agg',
    zone: 'z1',
    parents: [network.connect('ctl', { from: 'agg' })],
    scheduler: clock,
    random: seededRandom(8),
  });
  network.listen('agg', aggregator.handleReport);
  const hostLines: Line[] = [];
  const limiter = createGlobalLimiter({
    reporterId: 'host-1',
    zone: 'z1',
    clients: [network.connect('agg', { from: 'host-1' })],
    scheduler: clock,
    random: seededRandom(9),
    logger: {
      warn: (fields, message) => hostLines.push({ fields: fields as Record<string, unknown>, message }),
    },
  });
  controller.start();
  aggregator.start();
  limiter.start();
  /** `seconds` of load on each key, a few calls every 100 ms. */
  const offer = async (keys: string[], seconds: number) => {
    for (let t = 0; t < seconds * 10; t++) {
      for (const key of keys) limiter.allow(key);
      await advance(clock, 100);
    }
  };
  const stop = async () => {
    await limiter.stop();
    await aggregator.stop();
    controller.stop();
  };
  return { clock, network, controller, controllerLines, limiter, hostLines, offer, stop };
}

describe('buckets no rule matches', () => {
  it('the host warns once per key family through its logger; known buckets never', async () => {
    const t = tree();
    const keys = [
      'payments:charge',
      'api:caller=acme',
      'payments:caller=acme',
      'payments:caller=zed',
      'orphan',
    ];
    await t.offer(keys, UNANSWERED_REPLIES + 5);
    const warned = t.hostLines.map((l) => l.fields.family).sort();
    assert.deepEqual(warned, ['orphan', 'payments:caller=*']);
    const line = t.hostLines.find((l) => l.fields.family === 'payments:caller=*')!;
    assert.match(
      line.message,
      /^global limiter: bucket "payments:caller=(acme|zed)" got no directive in 5 replies/,
    );
    assert.match(line.message, /NOT limited; add a rule \(e\.g\. template "payments:caller=\*"\)/);
    const snapshot = t.limiter.snapshot();
    assert.equal(snapshot.reporter.bucketsWithoutRule, 3, 'every unknown bucket is counted');
    assert.ok(snapshot.buckets.find((b) => b.key === 'payments:charge')!.directiveAgeMs !== undefined);
    await t.stop();
  });

  it('the controller logs each family at most once per minute, with an example key', async () => {
    const t = tree();
    await t.offer(['payments:caller=acme', 'payments:caller=zed', 'api:caller=acme'], 10);
    const unknown = t.controllerLines.filter((l) => /matches no rule of the limits file/.test(l.message));
    assert.equal(unknown.length, 1, JSON.stringify(unknown));
    assert.equal(unknown[0]!.fields.family, 'payments:caller=*');
    assert.match(String(unknown[0]!.fields.example), /^payments:caller=(acme|zed)$/);
    await t.offer(['payments:caller=acme'], 55);
    assert.equal(
      t.controllerLines.filter((l) => /matches no rule/.test(l.message)).length,
      2,
      'again after a minute',
    );
    assert.ok(t.controller.snapshot().unknownBucketKeys.includes('payments:caller=acme'));
    await t.stop();
  });

  it("a host whose every bucket is unknown is told too: the aggregator passes on its parent's epoch", async () => {
    const t = tree();
    await t.offer(['payments:caller=acme'], UNANSWERED_REPLIES + 5);
    assert.deepEqual(
      t.hostLines.map((l) => l.fields.family),
      ['payments:caller=*'],
    );
    await t.stop();
  });

  it('a controller cut off while the aggregator still relays fresh directives is not a missing rule', async () => {
    // Directives live 20 intervals: the aggregator relays the cached one for payments:charge all
    // through the outage, but its parent is silent, so its replies prove nothing about new keys.
    const t = tree({ ttlMs: 20_000 });
    await t.offer(['payments:charge'], 3);
    t.network.partition('ctl', true);
    await t.offer(['payments:charge', 'payments:caller=acme'], UNANSWERED_REPLIES + 8);
    assert.equal(t.hostLines.length, 0, JSON.stringify(t.hostLines));
    t.network.partition('ctl', false);
    await t.offer(['payments:charge', 'payments:caller=acme'], UNANSWERED_REPLIES + 5);
    assert.deepEqual(
      t.hostLines.map((l) => l.fields.family),
      ['payments:caller=*'],
      'once the controller answers again, it is told',
    );
    await t.stop();
  });

  it('a controller that does not answer is not a missing rule: no warning', async () => {
    const t = tree({ controllerReachable: false });
    await t.offer(['payments:caller=acme'], UNANSWERED_REPLIES + 10);
    assert.deepEqual(t.hostLines, []);
    assert.equal(t.limiter.snapshot().reporter.bucketsWithoutRule, 0);
    await t.stop();
  });

  it('without a logger the warning is a process warning', async () => {
    const clock = new ManualClock(START_MS);
    const network = new InMemoryNetwork({ scheduler: clock, delayMs: 2, random: seededRandom(7) });
    const controller = createController({ id: 'ctl', config: limits, scheduler: clock });
    network.listen('ctl', controller.handleReport);
    const limiter = createGlobalLimiter({
      reporterId: 'host-1',
      clients: [network.connect('ctl', { from: 'host-1' })],
      scheduler: clock,
      random: seededRandom(9),
    });
    const warnings: Error[] = [];
    const onWarning = (warning: Error) => warnings.push(warning);
    process.on('warning', onWarning);
    try {
      controller.start();
      limiter.start();
      for (let i = 0; i < (UNANSWERED_REPLIES + 3) * 10; i++) {
        limiter.allow('orphan:1');
        await advance(clock, 100);
      }
      await new Promise((resolve) => setImmediate(resolve));
      const ours = warnings.filter((w) => (w as { code?: string }).code === 'SPILLWAY_UNKNOWN_BUCKET');
      assert.equal(ours.length, 1);
      assert.match(ours[0]!.message, /bucket "orphan:1" got no directive/);
    } finally {
      process.off('warning', onWarning);
      await limiter.stop();
      controller.stop();
    }
  });
});

describe('key families', () => {
  it('read like the template rule that would cover the keys', () => {
    assert.equal(keyFamily('api:caller=acme'), 'api:caller=*');
    assert.equal(keyFamily('payments:caller=a:b=c'), 'payments:caller=*');
    assert.equal(keyFamily('payments:charge'), 'payments:*');
    assert.equal(keyFamily('anon:2001:db8::/64'), 'anon:*');
    assert.equal(keyFamily('orphan'), 'orphan');
  });
});

describe('UnknownBucketLog', () => {
  it('bounds its memory: past maxFamilies, families not logged for an interval make room', () => {
    const clock = new ManualClock(0);
    const lines: Record<string, unknown>[] = [];
    const log = new UnknownBucketLog({
      logger: { info: () => {}, warn: (fields) => lines.push(fields) },
      clock,
      controllerId: 'ctl',
      maxFamilies: 2,
      logIntervalMs: 1000,
    });
    log.note('a=1');
    log.note('b=1');
    log.note('c=1');
    assert.deepEqual(
      lines.map((l) => l.family),
      ['a=*', 'b=*'],
    );
    assert.equal(log.unlogged, 1);
    clock.advance(1000);
    log.note('c=1');
    log.note('a=2');
    assert.deepEqual(
      lines.map((l) => l.family),
      ['a=*', 'b=*', 'c=*', 'a=*'],
    );
    assert.equal(lines[3]!.reports, 1);
  });
});

describe('ParentEpoch (an aggregator reply says whether a controller answers)', () => {
  it("is the directives' epoch, else the parent's while it answers, else 0", () => {
    const epoch = new ParentEpoch();
    assert.equal(epoch.replyEpoch(0n, 0, 1000), 0n, 'never heard from a parent');
    epoch.heard(42n, 1000);
    assert.equal(epoch.replyEpoch(0n, 2000, 1000), 42n);
    assert.equal(epoch.replyEpoch(7n, 2000, 1000), 7n);
    assert.equal(epoch.replyEpoch(7n, 5000, 1000), 0n, 'a parent silent for 3 intervals: no proof');
  });
});
