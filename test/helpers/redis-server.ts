import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';

/**
 * Starts a private `redis-server` for a test file: its own port, its own temp dir, nothing saved.
 * Tests never touch the machine's shared Redis on 6379, and may kill or pause their own.
 *
 * Without `redis-server` on PATH the test is skipped locally, but under CI=true that is a failure:
 * CI must prove the Redis limiters, never silently skip them.
 */
export interface RedisServer {
  port: number;
  host: string;
  url: string;
  process: ChildProcess;
  /** SIGSTOP: the server holds connections open but answers nothing (a GC pause, a hung host). */
  pause(): void;
  /** SIGCONT after pause(). */
  resume(): void;
  /** SIGKILL and wait for exit. */
  kill(): Promise<void>;
  /** Start again on the same port after kill(). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

export function redisServerAvailable(): boolean {
  return spawnSync('redis-server', ['--version']).status === 0;
}

/** Skip (or, under CI, fail) when redis-server is missing. Returns true when the test may run. */
export function requireRedis(t: TestContext): boolean {
  if (redisServerAvailable()) return true;
  if (process.env.CI === 'true')
    throw new Error('redis-server is not installed; CI must install it (.ci/run)');
  t.skip('redis-server is not installed');
  return false;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

export async function startRedis(extraArgs: string[] = []): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), 'spillway-redis-'));
  const port = await freePort();
  let child = await launch(port, dir, extraArgs);
  const server: RedisServer = {
    port,
    host: '127.0.0.1',
    url: `redis://127.0.0.1:${port}`,
    get process() {
      return child;
    },
    pause: () => {
      child.kill('SIGSTOP');
    },
    resume: () => {
      child.kill('SIGCONT');
    },
    kill: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await exited;
    },
    restart: async () => {
      await server.kill();
      child = await launch(port, dir, extraArgs);
    },
    stop: async () => {
      await server.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  return server;
}

export async function launch(port: number, dir: string, extraArgs: string[]): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      ...extraArgs,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  await new Promise<void>((resolve, reject) => {
    let output = '';
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Ready to accept connections')) {
        child.stdout?.off('data', onData);
        child.stdout?.resume();
        resolve();
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.resume();
    child.once('exit', (code) =>
      reject(new Error(`redis-server exited with ${code} before ready:\n${output}`)),
    );
    child.once('error', reject);
  });
  return child;
}
