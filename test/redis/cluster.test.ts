import assert from 'node:assert/strict';
import { once } from 'node:events';
import { test } from 'node:test';
import { Cluster, type Redis } from 'ioredis';
import type { Decision } from '../../src/core/decision.js';
import {
  createRedisFixedWindow,
  createRedisSlidingCounter,
  createRedisSlidingLog,
  createRedisTokenBucket,
  ioredisAdapter,
  type RedisLimiter,
  type RedisScriptClient,
} from '../../src/redis/index.js';
import { type RedisCluster, requireRedisCluster, startRedisCluster } from '../helpers/redis-cluster.js';

/**
 * The four Redis limiters on a real 3-primary Redis Cluster, through an ioredis `Cluster`.
 *
 * What this proves beyond the single-node tests: each limiter's keys share one hash slot (the
 * sliding log touches two keys, so a wrong hash tag would be a CROSSSLOT error), the client routes
 * every script to the node that owns its slot, buckets are really spread over every node, scripts
 * are (re)loaded on each node independently, and exact counting holds under concurrency.
 *
 * Windows are one day long (and the token bucket refills one limit per day) so no window boundary
 * or refill can fall inside a test and blur an exact count. The per-call timeout is generous: these
 * tests are about correctness, not latency; a timeout would show up as a `reason` and fail them.
 */

const DAY_MS = 86_400_000;
const TIMEOUT_MS = 5_000;

interface LimiterKind {
  name: string;
  create(redis: RedisScriptClient, prefix: string, limit: number): RedisLimiter;
}

const kinds: LimiterKind[] = [
  {
    name: 'fixed window',
    create: (redis, prefix, limit) =>
      createRedisFixedWindow({ redis, prefix, limit, windowMs: DAY_MS, timeoutMs: TIMEOUT_MS }),
  },
  {
    name: 'sliding log',
    create: (redis, prefix, limit) =>
      createRedisSlidingLog({ redis, prefix, limit, windowMs: DAY_MS, timeoutMs: TIMEOUT_MS }),
  },
  {
    name: 'sliding counter',
    create: (redis, prefix, limit) =>
      createRedisSlidingCounter({ redis, prefix, limit, windowMs: DAY_MS, timeoutMs: TIMEOUT_MS }),
  },
  {
    name: 'token bucket',
    create: (redis, prefix, limit) =>
      createRedisTokenBucket({
        redis,
        prefix,
        capacity: limit,
        refillPerSec: limit / (DAY_MS / 1000),
        timeoutMs: TIMEOUT_MS,
      }),
  },
];

/** Every decision must be a normal count: a CROSSSLOT, MOVED loop or timeout would set `reason`. */
function assertCounted(decision: Decision, context: string): void {
  assert.equal(decision.reason, undefined, `${context}: expected a counted decision, got ${decision.reason}`);
  assert.equal(decision.storeFault, undefined, context);
}

function assertNoFaults(limiter: RedisLimiter, context: string): void {
  const { timeouts, errors, failOpen, failClosed, insurance } = limiter.stats;
  assert.deepEqual(
    { timeouts, errors, failOpen, failClosed, insurance },
    {
      timeouts: 0,
      errors: 0,
      failOpen: 0,
      failClosed: 0,
      insurance: 0,
    },
    context,
  );
}

/** Every key under `prefix` on every primary, with the node that holds it. */
async function keysByNode(cluster: Cluster, prefix: string): Promise<Map<string, string[]>> {
  const byNode = new Map<string, string[]>();
  for (const node of cluster.nodes('master')) {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await node.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    byNode.set(`${node.options.host}:${node.options.port}`, keys);
  }
  return byNode;
}

async function keySlot(node: Redis, key: string): Promise<number> {
  return Number(await node.cluster('KEYSLOT', key));
}

test('Redis limiters on a real 3-node Redis Cluster', { timeout: 120_000 }, async (t) => {
  if (!requireRedisCluster(t)) return;
  let redisCluster: RedisCluster | undefined;
  let client: Cluster | undefined;
  t.after(async () => {
    client?.disconnect();
    await redisCluster?.stop();
  });
  // Survivors keep serving their own slots while a primary is down (see the last subtest).
  redisCluster = await startRedisCluster({ extraArgs: ['--cluster-require-full-coverage', 'no'] });
  // The fail-fast options of docs/redis-operations.md; enableOfflineQueue: false means commands
  // are refused until the client is ready, hence the wait.
  client = new Cluster(redisCluster.startupNodes, {
    enableOfflineQueue: false,
    slotsRefreshTimeout: 2_000,
    redisOptions: {
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      connectTimeout: 1_000,
      socketTimeout: 2_000,
    },
  });
  client.on('error', () => {});
  if (client.status !== 'ready') await once(client, 'ready');
  const cluster = client;
  const clusterNodes = redisCluster.nodes;
  const redis = ioredisAdapter(cluster);
  const anyNode = cluster.nodes('master')[0]!;

  for (const kind of kinds) {
    await t.test(
      `${kind.name}: admits exactly the limit per key, for keys spread over every node`,
      async () => {
        const prefix = `spread-${kind.name.replace(' ', '-')}`;
        const limit = 5;
        const extra = 3;
        const limiter = kind.create(redis, prefix, limit);
        // Plain keys plus keys with braces, which must not move the hash tag (src/redis/redis-key.ts).
        const keys = Array.from({ length: 60 }, (_, i) => `user-${String(i).padStart(3, '0')}`);
        keys.push('}starts-with-close', '{}empty-tag', 'a{b}c', 'pct%7Bnot-a-brace');
        const allowedPerKey = await Promise.all(
          keys.map(async (key) => {
            let allowed = 0;
            for (let call = 0; call < limit + extra; call++) {
              const decision = await limiter.limit(key);
              assertCounted(decision, `${kind.name} ${key} call ${call}`);
              if (decision.allowed) {
                allowed++;
                assert.equal(decision.retryAfterMs, 0);
              } else {
                assert.ok(decision.retryAfterMs > 0, `${key}: a rejection carries retryAfterMs`);
              }
              assert.equal(decision.allowed, call < limit, `${kind.name} ${key}: call ${call}`);
            }
            return allowed;
          }),
        );
        assert.deepEqual(
          allowedPerKey,
          keys.map(() => limit),
        );
        assertNoFaults(limiter, kind.name);
        assert.equal(limiter.stats.calls, keys.length * (limit + extra));

        // Where did the buckets land? Every primary must hold some, each bucket's keys (the sliding
        // log has two) must share one slot, and the slots must be many, not one.
        const byNode = await keysByNode(cluster, prefix);
        assert.equal(byNode.size, 3);
        const slotByTag = new Map<string, Set<number>>();
        for (const [node, nodeKeys] of byNode) {
          assert.ok(nodeKeys.length > 0, `node ${node} holds no ${kind.name} bucket: keys are not spread`);
          for (const redisKey of nodeKeys) {
            const tag = /\{[^}]*\}/.exec(redisKey)?.[0];
            assert.ok(tag !== undefined && tag !== '{}', `${redisKey} has no non-empty hash tag`);
            const slots = slotByTag.get(tag) ?? new Set<number>();
            slots.add(await keySlot(anyNode, redisKey));
            slotByTag.set(tag, slots);
          }
        }
        assert.equal(slotByTag.size, keys.length, 'one hash tag per caller key');
        for (const [tag, slots] of slotByTag)
          assert.equal(slots.size, 1, `${tag}: keys in ${slots.size} slots`);
        const distinctSlots = new Set([...slotByTag.values()].map((slots) => [...slots][0]));
        assert.ok(distinctSlots.size >= keys.length - 10, `only ${distinctSlots.size} distinct slots`);
        t.diagnostic(
          `${kind.name}: keys per node ${[...byNode.values()].map((k) => k.length).join('/')}, ${distinctSlots.size} slots`,
        );
      },
    );

    await t.test(`${kind.name}: 300 concurrent calls on one key with limit 50 admit exactly 50`, async () => {
      const limiter = kind.create(redis, `hot-${kind.name.replace(' ', '-')}`, 50);
      const decisions = await Promise.all(Array.from({ length: 300 }, () => limiter.limit('hot-key')));
      decisions.forEach((decision, i) => {
        assertCounted(decision, `call ${i}`);
      });
      assert.equal(decisions.filter((d) => d.allowed).length, 50);
      assertNoFaults(limiter, kind.name);
    });

    await t.test(`${kind.name}: concurrent bursts on 30 keys across nodes, limit 10 each`, async () => {
      const limiter = kind.create(redis, `burst-${kind.name.replace(' ', '-')}`, 10);
      const keys = Array.from({ length: 30 }, (_, i) => `tenant-${i}`);
      // Interleave keys so calls for different nodes are in flight together.
      const calls = Array.from({ length: 40 }, () => keys).flat();
      const decisions = await Promise.all(calls.map((key) => limiter.limit(key)));
      const allowedByKey = new Map<string, number>();
      decisions.forEach((decision, i) => {
        assertCounted(decision, `call ${i}`);
        if (decision.allowed) allowedByKey.set(calls[i]!, (allowedByKey.get(calls[i]!) ?? 0) + 1);
      });
      for (const key of keys) assert.equal(allowedByKey.get(key), 10, key);
      assertNoFaults(limiter, kind.name);
    });
  }

  await t.test(
    'after SCRIPT FLUSH on every node, each node reloads the scripts (EVALSHA -> EVAL)',
    async () => {
      const limiters = kinds.map((kind) => kind.create(redis, `flush-${kind.name.replace(' ', '-')}`, 3));
      // 60 keys: the chance that one of three nodes owns none of them is about 1e-10.
      const keys = Array.from({ length: 60 }, (_, i) => `flushed-${i}`);
      // Warm: every script cached on every node.
      for (const limiter of limiters) await Promise.all(keys.map((key) => limiter.limit(key)));
      const before = limiters.map((limiter) => limiter.stats.noscriptReloads);
      await Promise.all(cluster.nodes('master').map((node) => node.script('FLUSH')));
      for (const limiter of limiters) {
        // Sequential per key so each node's first call after the flush meets NOSCRIPT.
        for (const key of keys) {
          const decision = await limiter.limit(key);
          assertCounted(decision, key);
          assert.equal(decision.allowed, true);
        }
      }
      limiters.forEach((limiter, i) => {
        const reloads = limiter.stats.noscriptReloads - before[i]!;
        // Exactly once per node: the first call to reach each node after the flush reloads there.
        assert.equal(reloads, 3, `${kinds[i]!.name}: ${reloads} reloads`);
        assertNoFaults(limiter, kinds[i]!.name);
      });
    },
  );

  // Last: it kills a node.
  await t.test(
    'one primary killed: its buckets answer by policy within the timeout, the rest keep counting',
    async () => {
      const timeoutMs = 100;
      const limiter = createRedisFixedWindow({
        redis,
        prefix: 'down',
        limit: 1000,
        windowMs: DAY_MS,
        timeoutMs,
      });
      const keys = Array.from({ length: 60 }, (_, i) => `down-${i}`);
      // CLUSTER SLOTS: [[first, last, [host, port, id], ...replicas], ...]
      const ranges = await anyNode.cluster('SLOTS');
      const victimPort = clusterNodes.map((n) => n.port).find((port) => port !== anyNode.options.port)!;
      const onVictim = new Set<string>();
      for (const key of keys) {
        const slot = await keySlot(anyNode, `{${key}}`);
        const owner = ranges.find(([first, last]) => slot >= first && slot <= last)!;
        if (owner[2]?.[1] === victimPort) onVictim.add(key);
      }
      assert.ok(onVictim.size > 0 && onVictim.size < keys.length, 'keys on the victim and on the survivors');
      for (const key of keys) assertCounted(await limiter.limit(key), key);

      await redisCluster!.killNode(victimPort);
      const killedAtMs = performance.now();
      let rounds = 0;
      let worstMs = 0;
      // Past cluster-node-timeout (2 s), when the survivors mark the victim as failed.
      while (performance.now() - killedAtMs < 2_500) {
        rounds++;
        await Promise.all(
          keys.map(async (key) => {
            const startMs = performance.now();
            let timerFiredMs = Number.NaN;
            const sentinel = setTimeout(() => {
              timerFiredMs = performance.now();
            }, timeoutMs);
            const decision = await limiter.limit(key);
            const elapsedMs = performance.now() - startMs;
            clearTimeout(sentinel);
            const timerLateMs = Number.isNaN(timerFiredMs)
              ? 0
              : Math.max(0, timerFiredMs - startMs - timeoutMs);
            worstMs = Math.max(worstMs, elapsedMs);
            // The limiter's timer cannot beat a plain timer armed at the same moment: its lateness is
            // the machine's, not the limiter's.
            assert.ok(elapsedMs <= timeoutMs + 250 + timerLateMs, `${key}: ${elapsedMs.toFixed(1)} ms`);
            if (onVictim.has(key)) {
              assert.equal(decision.reason, 'fail-open', key);
              assert.equal(decision.allowed, true);
            } else {
              assertCounted(decision, `${key} (survivor) round ${rounds}`);
              assert.equal(decision.allowed, true);
              assert.equal(decision.remaining, 1000 - 1 - rounds, `${key}: every call counted once`);
            }
          }),
        );
      }
      const { calls, failOpen, timeouts, errors } = limiter.stats;
      assert.equal(calls, keys.length * (rounds + 1));
      assert.equal(failOpen, onVictim.size * rounds);
      t.diagnostic(
        `primary killed: ${onVictim.size}/${keys.length} buckets on it answered fail-open over ${rounds} rounds (${timeouts} timeouts, ${errors} errors), worst call ${worstMs.toFixed(1)} ms; the other ${keys.length - onVictim.size} kept counting`,
      );
    },
  );
});
