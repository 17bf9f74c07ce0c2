import type { ChildProcess } from 'node:child_process';
import { execFile, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { freePort, launch, redisServerAvailable } from './redis-server.js';

const execFileAsync = promisify(execFile);

/**
 * A real Redis Cluster of `masters` primaries (no replicas) on private ports, for tests that must
 * prove the limiters' keys hash to one slot per bucket (no CROSSSLOT) and that the client routes
 * every script to the node owning its slot.
 *
 * Each node gets an explicit cluster bus port (`--cluster-port`) from freePort: the default
 * `port + 10000` can land above 65535 or on a port another process holds.
 */
export interface RedisClusterNode {
  host: string;
  port: number;
  busPort: number;
  process: ChildProcess;
}

export interface RedisCluster {
  nodes: RedisClusterNode[];
  /** `[{ host, port }]` for `new Cluster(startupNodes)`. */
  startupNodes: { host: string; port: number }[];
  /** SIGKILL one node (a primary without replicas: its slots become unreachable). */
  killNode(port: number): Promise<void>;
  /** SIGKILL every node and remove the temp dir. Safe to call twice. */
  stop(): Promise<void>;
}

export function redisClusterAvailable(): boolean {
  return redisServerAvailable() && spawnSync('redis-cli', ['--version']).status === 0;
}

/** Skip (or, under CI=true, fail) when redis-server or redis-cli is missing. */
export function requireRedisCluster(t: TestContext): boolean {
  if (redisClusterAvailable()) return true;
  if (process.env.CI === 'true')
    throw new Error('redis-server and redis-cli must be installed for the cluster tests under CI (.ci/run)');
  t.skip('redis-server or redis-cli is not installed');
  return false;
}

export interface StartRedisClusterOptions {
  /** Number of primaries; Redis Cluster needs at least 3. */
  masters?: number;
  /** How long to wait for `cluster_state:ok` on every node. */
  readyTimeoutMs?: number;
  /** More redis-server arguments for every node, e.g. `['--cluster-require-full-coverage', 'no']`. */
  extraArgs?: string[];
}

export async function startRedisCluster(options: StartRedisClusterOptions = {}): Promise<RedisCluster> {
  const masters = options.masters ?? 3;
  const readyTimeoutMs = options.readyTimeoutMs ?? 20_000;
  const dir = mkdtempSync(join(tmpdir(), 'spillway-redis-cluster-'));
  const nodes: RedisClusterNode[] = [];
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    await Promise.all(nodes.map((node) => killNode(node.process)));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < masters; i++) {
      const port = await freePort();
      let busPort = await freePort();
      while (busPort === port) busPort = await freePort();
      const child = await launch(port, dir, [
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        `nodes-${port}.conf`,
        '--cluster-node-timeout',
        '2000',
        '--cluster-port',
        String(busPort),
        ...(options.extraArgs ?? []),
      ]);
      nodes.push({ host: '127.0.0.1', port, busPort, process: child });
    }
    await execFileAsync(
      'redis-cli',
      [
        '--cluster',
        'create',
        ...nodes.map((node) => `${node.host}:${node.port}`),
        '--cluster-replicas',
        '0',
        '--cluster-yes',
      ],
      { timeout: readyTimeoutMs },
    );
    await waitForClusterOk(nodes, Date.now() + readyTimeoutMs);
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    nodes,
    startupNodes: nodes.map(({ host, port }) => ({ host, port })),
    killNode: async (port) => {
      const node = nodes.find((n) => n.port === port);
      if (!node) throw new Error(`no cluster node on port ${port}`);
      await killNode(node.process);
    },
    stop,
  };
}

/** Polls `CLUSTER INFO` on every node until all report `cluster_state:ok` or the deadline passes. */
async function waitForClusterOk(nodes: RedisClusterNode[], deadlineMs: number): Promise<void> {
  const clients = nodes.map(
    (node) => new Redis({ host: node.host, port: node.port, lazyConnect: true, maxRetriesPerRequest: 1 }),
  );
  try {
    let lastState = '';
    while (Date.now() < deadlineMs) {
      const infos = await Promise.all(clients.map((client) => client.cluster('INFO').catch(() => '')));
      const states = infos.map((info) => /cluster_state:(\w+)/.exec(String(info))?.[1] ?? 'unknown');
      lastState = states.join(',');
      if (states.every((state) => state === 'ok')) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`Redis Cluster not ready before the deadline; cluster_state per node: ${lastState}`);
  } finally {
    for (const client of clients) client.disconnect();
  }
}

async function killNode(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGCONT');
  child.kill('SIGKILL');
  await exited;
}
