import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * Test helper: runs `spillway <command>` as a real process from source (no build needed) and reads
 * the addresses it bound from its `listening` log line, so every process can use port 0.
 */
export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface SpillwayProcess {
  readonly name: string;
  readonly child: ChildProcess;
  /** From the `listening` line: the gRPC address (controller, aggregator) and the ops address. */
  readonly grpc: string | undefined;
  readonly ops: string;
  /** Every stdout and stderr line so far (for failure messages). */
  readonly output: string[];
  /** Settles with the exit code (or the signal name) when the process ends. */
  readonly exited: Promise<number | string>;
  readonly running: boolean;
}

/**
 * `prefix`: a command that execs node in place (e.g. `ip netns exec NS setpriv --pdeathsig KILL --`),
 * so the child's pid stays node's and signals reach it.
 */
export function spawnSpillwayRaw(
  args: string[],
  env: Record<string, string> = {},
  prefix: readonly string[] = [],
): ChildProcess {
  const command = [...prefix, process.execPath, '--import', 'tsx', 'src/cli/entry.ts', ...args];
  return spawn(command[0]!, command.slice(1), {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '', ...env },
  });
}

export async function startSpillway(
  name: string,
  args: string[],
  { timeoutMs = 30_000, env = {} as Record<string, string>, prefix = [] as readonly string[] } = {},
): Promise<SpillwayProcess> {
  const child = spawnSpillwayRaw(args, env, prefix);
  const output: string[] = [];
  let running = true;
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => {
      running = false;
      resolve(code ?? signal ?? 'unknown');
    });
  });
  try {
    const listening = await readListening(name, child, output, timeoutMs);
    if (typeof listening.ops !== 'string')
      throw new Error(`${name}: no ops address in ${JSON.stringify(listening)}`);
    return {
      name,
      child,
      grpc: typeof listening.grpc === 'string' ? listening.grpc : undefined,
      ops: listening.ops,
      output,
      exited,
      get running() {
        return running;
      },
    };
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  }
}

/**
 * Resolves with the fields of `child`'s first `listening` log line (a JSON line on stdout, the
 * shape every spillway process and the benchmarks' helper roles print); rejects when the child exits
 * first or stays silent for `timeoutMs`, with its output in the message. Appends every stdout and
 * stderr line of the child to `output` as it comes, for as long as it runs (tests read log lines
 * from it).
 */
export function readListening(
  name: string,
  child: ChildProcess,
  output: string[],
  timeoutMs: number,
): Promise<Record<string, unknown>> {
  const keep = (line: string) => output.push(line);
  createInterface({ input: child.stderr! }).on('line', (line) => keep(`[stderr] ${line}`));
  return new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name} did not listen within ${timeoutMs} ms:\n${output.join('\n')}`)),
      timeoutMs,
    );
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before listening:\n${output.join('\n')}`));
    });
    createInterface({ input: child.stdout! }).on('line', (line) => {
      keep(line);
      if (!line.includes('"listening"')) return;
      try {
        const parsed = JSON.parse(line) as Record<string, unknown>;
        if (parsed.msg === 'listening') {
          clearTimeout(timer);
          resolve(parsed);
        }
      } catch {
        // not a log line
      }
    });
  });
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves with how it ended. */
export async function stopSpillway(process: SpillwayProcess, graceMs = 5_000): Promise<number | string> {
  if (!process.running) return process.exited;
  process.child.kill('SIGTERM');
  const timer = setTimeout(() => process.child.kill('SIGKILL'), graceMs);
  try {
    return await process.exited;
  } finally {
    clearTimeout(timer);
  }
}

/** One scrape of `/metrics` as `name{labels}` → value, keys exactly as Prometheus text prints them. */
export async function scrape(ops: string): Promise<Map<string, number>> {
  const response = await fetch(`http://${ops}/metrics`);
  if (response.status !== 200) throw new Error(`GET ${ops}/metrics: ${response.status}`);
  const series = new Map<string, number>();
  for (const line of (await response.text()).split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*(?:\{.*\})?) (\S+)$/.exec(line);
    if (match) series.set(match[1]!, Number(match[2]));
  }
  return series;
}

export function seriesKey(name: string, labels: Record<string, string> = {}): string {
  const entries = Object.entries(labels);
  return entries.length === 0 ? name : `${name}{${entries.map(([k, v]) => `${k}="${v}"`).join(',')}}`;
}

/** Polls `check` until it returns a value (not undefined) or the deadline passes. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined>,
  { timeoutMs = 20_000, everyMs = 250 } = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ''}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
