import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/**
 * The processes `spillway demo` starts, each a `spillway <command>` run by the same Node and entry
 * script as the demo itself (so a demo started from source starts its children from source).
 * Every child binds port 0 and is ready when it prints its `listening` line; the group remembers
 * every child so that none outlives the demo: stopping sends SIGTERM in reverse start order, then
 * SIGKILL to whatever is still running after the grace period; an exit of the demo process itself
 * (even on an uncaught error) SIGKILLs anything left; and every child is started with
 * demo-parent-watch.ts preloaded, so it stops itself when the demo is killed outright.
 */
export interface DemoChild {
  readonly name: string;
  readonly pid: number;
  /** The fields of its `listening` line (addresses). */
  readonly listening: Record<string, unknown>;
  /** Its last output lines, for error messages. */
  readonly tail: readonly string[];
  readonly exited: Promise<number | string>;
  readonly running: boolean;
}

export interface DemoProcessGroup {
  start(name: string, args: string[], options?: { env?: Record<string, string> }): Promise<DemoChild>;
  readonly children: readonly DemoChild[];
  /** Resolves with the first child that exits while the group is not stopping. */
  readonly unexpectedExit: Promise<DemoChild>;
  /** SIGTERM everything (newest first), SIGKILL after `graceMs`; resolves when all have exited. */
  stopAll(graceMs?: number): Promise<void>;
  /** SIGKILL everything still running, now (an impatient second Ctrl-C). */
  killNow(): void;
}

export interface DemoProcessGroupOptions {
  /** Copy every child's output lines here, prefixed with its name (`--verbose`). */
  echo?: (line: string) => void;
  startTimeoutMs?: number;
  tailLines?: number;
}

interface Tracked extends DemoChild {
  child: ChildProcess;
}

export function createDemoProcessGroup(options: DemoProcessGroupOptions = {}): DemoProcessGroup {
  const startTimeoutMs = options.startTimeoutMs ?? 60_000;
  const tailLines = options.tailLines ?? 40;
  const tracked: Tracked[] = [];
  let stopping = false;
  let reportUnexpected: (child: DemoChild) => void = () => {};
  const unexpectedExit = new Promise<DemoChild>((resolve) => {
    reportUnexpected = resolve;
  });

  const killLeftovers = () => {
    for (const t of tracked) if (t.running) t.child.kill('SIGKILL');
  };
  process.once('exit', killLeftovers);

  // Children run from the same entry as this process: bin/spillway.js (built) or src/cli/entry.ts
  // under `node --import tsx`. Debugger flags are not passed on (every child would claim the port).
  const entry = process.argv[1]!;
  const watchParent = new URL(
    `./parent-watch${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`,
    import.meta.url,
  ).href;
  const nodeArgs = [
    ...process.execArgv.filter((arg) => !arg.startsWith('--inspect')),
    '--import',
    watchParent,
  ];

  async function start(
    name: string,
    args: string[],
    { env }: { env?: Record<string, string> } = {},
  ): Promise<DemoChild> {
    if (stopping) throw new Error(`not starting ${name}: the demo is stopping`);
    const child = spawn(process.execPath, [...nodeArgs, entry, ...args], {
      // Its own process group: Ctrl-C reaches the demo only, which stops children in order.
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    const tail: string[] = [];
    let running = true;
    let listening: Record<string, unknown> | undefined;
    const exited = new Promise<number | string>((resolve) => {
      child.once('exit', (code, signal) => {
        running = false;
        resolve(code ?? signal ?? 'unknown');
      });
      child.once('error', (error) => {
        running = false;
        tail.push(`[spawn error] ${error.message}`);
        resolve('spawn-error');
      });
    });
    const entryRecord: Tracked = {
      name,
      child,
      get pid() {
        return child.pid ?? -1;
      },
      get listening() {
        return listening ?? {};
      },
      tail,
      exited,
      get running() {
        return running;
      },
    };
    tracked.push(entryRecord);
    const keep = (line: string) => {
      tail.push(line);
      if (tail.length > tailLines) tail.shift();
      options.echo?.(`[${name}] ${line}`);
    };
    createInterface({ input: child.stderr! }).on('line', keep);
    const ready = new Promise<void>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on('line', (line) => {
        keep(line);
        if (listening || !line.includes('"listening"')) return;
        try {
          const parsed = JSON.parse(line) as Record<string, unknown>;
          if (parsed.msg === 'listening') {
            listening = parsed;
            resolve();
          }
        } catch {
          // Not a log line.
        }
      });
      void exited.then((code) =>
        reject(new Error(`${name} exited (${code}) before it was ready:\n${tail.join('\n')}`)),
      );
    });
    void exited.then(() => {
      if (!stopping) reportUnexpected(entryRecord);
    });
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        ready,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`${name} was not ready within ${startTimeoutMs} ms:\n${tail.join('\n')}`)),
            startTimeoutMs,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
    return entryRecord;
  }

  return {
    start,
    get children() {
      return tracked;
    },
    unexpectedExit,
    killNow: killLeftovers,
    async stopAll(graceMs = 8_000) {
      stopping = true;
      for (const t of [...tracked].reverse()) {
        if (!t.running) continue;
        // SIGTERM only: closing stdin as well would be a second stop request (demo-parent-watch.ts).
        t.child.kill('SIGTERM');
      }
      const killer = setTimeout(killLeftovers, graceMs);
      await Promise.all(tracked.map((t) => t.exited));
      clearTimeout(killer);
      process.off('exit', killLeftovers);
    },
  };
}
