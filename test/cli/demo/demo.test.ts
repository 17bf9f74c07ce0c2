import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { REPO_ROOT, spawnSpillwayRaw, waitFor } from '../../integration/spillway-process.js';

// `spillway demo` end to end, from source: it starts its whole cluster (sidecar proxies and HTTP
// load by default, or in-memory hosts), prints the dashboard URL and live summary tables, and leaves
// no process behind, whether it stops on --duration or on Ctrl-C (SIGINT).

interface DemoRun {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<number | string>;
}

/** `built`: the package as `npm start` runs it (bin/spillway.js over dist/, which `npm test` builds first). */
function runDemo(args: string[], { built = false } = {}): DemoRun {
  const child = built
    ? spawn(process.execPath, ['bin/spillway.js', 'demo', ...args], {
        cwd: REPO_ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, NODE_OPTIONS: '' },
      })
    : spawnSpillwayRaw(['demo', ...args]);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk) => {
    stdout += String(chunk);
  });
  child.stderr!.on('data', (chunk) => {
    stderr += String(chunk);
  });
  const exited = new Promise<number | string>((resolve) =>
    child.once('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')),
  );
  return { child, stdout: () => stdout, stderr: () => stderr, exited };
}

/** `name=pid` pairs from the demo's `processes` line. */
function childPids(stdout: string): Map<string, number> {
  const line = stdout.split('\n').find((l) => l.trimStart().startsWith('processes '));
  assert.ok(line, `a processes line in:\n${stdout}`);
  return new Map(
    line
      .trim()
      .split(/\s+/)
      .slice(1)
      .map((pair) => {
        const [name, pid] = pair.split('=');
        return [name!, Number(pid)] as const;
      }),
  );
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Summary tables printed: each starts with its header line. */
function tables(stdout: string): string[] {
  return stdout.split('\n\n').filter((block) => /^bucket\s+mode\s+offered\/s\s+admitted\/s/m.test(block));
}

/** On failure: ask the demo to stop, then kill it and every child it listed, so none outlives the test. */
async function withKillOnFailure<T>(run: DemoRun, body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (error) {
    run.child.kill('SIGTERM');
    await Promise.race([run.exited, new Promise((resolve) => setTimeout(resolve, 20_000))]);
    run.child.kill('SIGKILL');
    for (const pid of run.stdout().includes('  processes ') ? childPids(run.stdout()).values() : []) {
      if (alive(pid)) process.kill(pid, 'SIGKILL');
    }
    throw new Error(
      `${(error as Error).message}\n--- stdout ---\n${run.stdout()}\n--- stderr ---\n${run.stderr()}`,
    );
  }
}

describe('spillway demo', { timeout: 180_000 }, () => {
  it('--duration 8: prints the URL and summary tables, exits 0, leaves no process behind', async () => {
    const run = runDemo(['--duration', '8']);
    await withKillOnFailure(run, async () => {
      const code = await Promise.race([
        run.exited,
        new Promise<string>((resolve) => setTimeout(() => resolve('timeout'), 150_000)),
      ]);
      assert.equal(code, 0, 'exit code');
      const stdout = run.stdout();
      assert.match(stdout, /dashboard +http:\/\/127\.0\.0\.1:\d+\/#token=\S{16,}/);
      const printed = tables(stdout);
      assert.ok(printed.length >= 1, 'at least one summary table');
      const last = printed.at(-1)!;
      for (const bucket of ['checkout', 'search', 'api:caller=acme']) {
        assert.match(last, new RegExp(`^${bucket.replace(/[:=]/g, '\\$&')} +(enforce|shadow)`, 'm'));
      }
      assert.match(last, /^search +shadow/m);
      assert.match(stdout, /^HTTP through the proxies: \d+ req\/s sent, \d+\/s 200, \d+\/s 429/m);
      assert.match(stdout, /stopped \(9 processes exited\)/);
      const pids = childPids(stdout);
      assert.deepEqual(
        [...pids.keys()],
        [
          'controller',
          'aggregator-z1',
          'aggregator-z2',
          'upstream',
          'proxy-1',
          'proxy-2',
          'proxy-3',
          'proxy-4',
          'load',
        ],
      );
      for (const [name, pid] of pids) assert.equal(alive(pid), false, `${name} (pid ${pid}) is gone`);
    });
  });

  it('runs from the built package as `npm start` does, and exits 0', {
    skip: existsSync(join(REPO_ROOT, 'dist/src/cli/entry.js'))
      ? false
      : 'dist/ not built (npm test builds it)',
  }, async () => {
    // Built, the proxy's report client is a worker thread loaded from a file, and Node runs the
    // demo's --import preload in it too: that once stopped every proxy seconds after the start.
    const run = runDemo(['--duration', '8'], { built: true });
    await withKillOnFailure(run, async () => {
      const code = await Promise.race([
        run.exited,
        new Promise<string>((resolve) => setTimeout(() => resolve('timeout'), 150_000)),
      ]);
      assert.equal(code, 0, 'exit code');
      assert.doesNotMatch(run.stdout() + run.stderr(), /exited unexpectedly/);
      assert.match(run.stdout(), /stopped \(9 processes exited\)/);
      assert.ok(tables(run.stdout()).length >= 1, 'at least one summary table');
    });
  });

  it('Ctrl-C (SIGINT) stops every process and exits 0, well before its --duration (hosts as the data plane)', async () => {
    // --duration 600: the duration's timer once held the stopped demo until it ran out.
    const run = runDemo([
      '--data-plane',
      'host',
      '--hosts',
      '2',
      '--summary-every',
      '1',
      '--duration',
      '600',
    ]);
    await withKillOnFailure(run, async () => {
      await waitFor('a summary table', async () => (tables(run.stdout()).length > 0 ? true : undefined), {
        timeoutMs: 120_000,
      });
      const pids = childPids(run.stdout());
      assert.deepEqual(
        [...pids.keys()],
        ['controller', 'aggregator-z1', 'aggregator-z2', 'demo-host-1', 'demo-host-2'],
      );
      for (const [name, pid] of pids) assert.equal(alive(pid), true, `${name} runs`);
      run.child.kill('SIGINT');
      const code = await Promise.race([
        run.exited,
        new Promise<string>((resolve) => setTimeout(() => resolve('still running after 60 s'), 60_000)),
      ]);
      assert.equal(code, 0);
      for (const [name, pid] of pids) assert.equal(alive(pid), false, `${name} (pid ${pid}) is gone`);
    });
  });

  it('a demo whose parent dies (npm start stopped with SIGTERM) stops itself and its children', async () => {
    // `npm start` runs the demo under a shell that a SIGTERM kills without passing it on: the demo
    // is left an orphan. Here the shell stays the parent (`; true`) and is killed outright.
    const shell = spawn(
      'sh',
      [
        '-c',
        `"${process.execPath}" --import tsx src/cli/entry.ts demo --data-plane host --hosts 1 --summary-every 1; true`,
      ],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } },
    );
    let stdout = '';
    shell.stdout!.on('data', (chunk) => {
      stdout += String(chunk);
    });
    try {
      await waitFor('a summary table', async () => (tables(stdout).length > 0 ? true : undefined), {
        timeoutMs: 120_000,
      });
      const pids = childPids(stdout);
      const demoPid = Number(
        execFileSync('pgrep', ['-P', String(shell.pid), '-f', 'entry.ts demo'], { encoding: 'utf8' }).trim(),
      );
      assert.ok(alive(demoPid), 'the demo runs');
      shell.kill('SIGKILL');
      await waitFor(
        'the demo and every child gone',
        async () => ([demoPid, ...pids.values()].every((pid) => !alive(pid)) ? true : undefined),
        { timeoutMs: 30_000 },
      );
    } finally {
      shell.kill('SIGKILL');
      for (const pid of stdout.includes('  processes ') ? childPids(stdout).values() : []) {
        if (alive(pid)) process.kill(pid, 'SIGKILL');
      }
    }
  });

  it('a demo killed outright (SIGKILL) leaves no process behind: each child stops itself', async () => {
    const run = runDemo(['--data-plane', 'host', '--hosts', '1']);
    await withKillOnFailure(run, async () => {
      await waitFor('a summary table', async () => (tables(run.stdout()).length > 0 ? true : undefined), {
        timeoutMs: 120_000,
      });
      const pids = childPids(run.stdout());
      assert.equal(pids.size, 4);
      run.child.kill('SIGKILL');
      await run.exited;
      await waitFor(
        'every child gone',
        async () => ([...pids.values()].every((pid) => !alive(pid)) ? true : undefined),
        { timeoutMs: 30_000 },
      );
    });
  });
});
