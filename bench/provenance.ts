import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const REPO_ROOT = fileURLToPath(new URL('..', import.meta.url));

/**
 * What a results file needs beside its command to be reproduced: the commit the code came from
 * (a command rerun on later code measures something else) and the BENCH_* settings it ran with.
 */

/** `abc1234`, with `+ uncommitted changes` when the tree differs from it; `unknown` outside git. */
export function sourceCommit(cwd: string = REPO_ROOT): string {
  const head = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd, encoding: 'utf8' });
  if (head.status !== 0) return 'unknown';
  // Results files the run is writing do not make the code differ.
  const status = spawnSync('git', ['status', '--porcelain', '--', '.', ':!bench/results'], {
    cwd,
    encoding: 'utf8',
  });
  const dirty = status.status === 0 && status.stdout.trim() !== '';
  return `${head.stdout.trim()}${dirty ? ' + uncommitted changes' : ''}`;
}

/** The BENCH_* variables set for this run, as a command prefix (`BENCH_ROUNDS=3 `), sorted. */
export function benchEnv(): string {
  return Object.entries(process.env)
    .filter(([name, value]) => name.startsWith('BENCH_') && value !== undefined && value !== '')
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, value]) => `${name}=${value} `)
    .join('');
}

/** `git checkout <commit> && BENCH_…=… <command>`: what a results file's Reproduce line shows. */
export function reproduce(command: string): string {
  const commit = sourceCommit();
  const checkout = commit === 'unknown' ? '' : `git checkout ${commit.split(' ')[0]} && `;
  const note = commit.endsWith('uncommitted changes') ? ' (run on uncommitted changes)' : '';
  return `${checkout}${benchEnv()}${command}${note}`;
}
