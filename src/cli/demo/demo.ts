import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DashboardView } from '../../dashboard/dashboard-view.js';
import {
  type CommandSpec,
  type FlagValues,
  MAX_TIMER_SECONDS,
  numberFlag,
  parseHostPort,
  runCommand,
  stringFlag,
  usageError,
} from '../command-line.js';
import type { HttpLoadCounts } from './http-load.js';
import { DEMO_CYCLE_S, DEMO_STREAMS, demoLimitsYaml, demoPhase, demoProxyRulesYaml } from './plan.js';
import { createDemoProcessGroup, type DemoChild } from './processes.js';
import { formatDemoSummary } from './summary.js';
import { runDemoWorker } from './worker.js';

export const spec: CommandSpec = {
  name: 'demo',
  summary:
    'Start a whole global rate limiter on this machine, one process per part (a controller with its ' +
    'dashboard, two zone aggregators, sidecar proxies in front of a small upstream, and an HTTP load ' +
    'generator whose changing, skewed load crosses the limits), print the dashboard URL and a live ' +
    'summary, and stop everything on Ctrl-C.',
  flags: {
    duration: {
      type: 'string',
      valueName: 'seconds',
      description: 'stop after this long once the cluster is up',
      defaultText: 'run until Ctrl-C',
    },
    'data-plane': {
      type: 'string',
      valueName: 'proxy|host',
      description:
        'proxy: sidecar proxies (global backend) in front of an upstream, fed HTTP by a load generator; ' +
        'host: processes calling the global limiter in memory, no HTTP',
      defaultText: 'proxy',
    },
    hosts: {
      type: 'string',
      valueName: 'n',
      description: 'data-plane processes (proxies or hosts), spread over the two zones',
      defaultText: '4',
    },
    dashboard: {
      type: 'string',
      valueName: 'host:port',
      description: "the controller's dashboard address",
      defaultText: '127.0.0.1:0 (any free port)',
    },
    scale: {
      type: 'string',
      valueName: 'factor',
      description: 'multiply every limit and all load by this',
      defaultText: '1',
    },
    'summary-every': {
      type: 'string',
      valueName: 'seconds',
      description: 'how often the terminal summary refreshes',
      defaultText: '2',
    },
    verbose: { type: 'boolean', description: "copy every process's log lines to stderr" },
  },
  notes: [
    'Everything binds 127.0.0.1 on free ports. The limits file is written to a temporary directory',
    '(its path is printed; edit it and the controller reloads it) and removed on exit.',
    'The admin token is $SPILLWAY_ADMIN_TOKEN, or a random one; the printed dashboard link carries it',
    'in its #fragment, which browsers never send to the server.',
  ],
};

export function run(argv: string[]): Promise<number> {
  if (argv[0] === '--worker') return runCommand({ ...spec, flags: {} }, [], () => runDemoWorker(argv));
  return runCommand(spec, argv, runDemo);
}

const ZONES = ['z1', 'z2'] as const;
/** Uneven data-plane processes: per zone one busy, one quiet (and so on). */
const PROCESS_WEIGHTS = [4, 1.5, 3, 1.5];

interface DataPlane {
  /** For the banner. */
  description: string;
  /** One more summary line, if the data plane has something to say (HTTP outcomes). */
  status?: () => Promise<string>;
}

async function runDemo(values: FlagValues): Promise<number> {
  const durationS = numberFlag(values, 'duration', 0, { min: 0, max: MAX_TIMER_SECONDS });
  const processCount = numberFlag(values, 'hosts', 4, { min: 1, integer: true });
  const scale = numberFlag(values, 'scale', 1, { min: 0.01 });
  const summaryEveryS = numberFlag(values, 'summary-every', 2, { min: 0.5, max: MAX_TIMER_SECONDS });
  const dataPlaneKind = stringFlag(values, 'data-plane') ?? 'proxy';
  if (dataPlaneKind !== 'proxy' && dataPlaneKind !== 'host') {
    throw usageError(`--data-plane must be proxy or host, got '${dataPlaneKind}'`, { flag: 'data-plane' });
  }
  const dashboardAt = stringFlag(values, 'dashboard') ?? '127.0.0.1:0';
  parseHostPort('dashboard', dashboardAt);
  const verbose = values.verbose === true;
  const out = process.stdout;
  const interactive = out.isTTY === true;

  const dir = mkdtempSync(join(tmpdir(), 'spillway-demo-'));
  const limitsPath = join(dir, 'limits.yaml');
  writeFileSync(limitsPath, demoLimitsYaml(scale));
  const token = process.env.SPILLWAY_ADMIN_TOKEN || randomBytes(18).toString('base64url');
  const group = createDemoProcessGroup({
    echo: verbose ? (line) => process.stderr.write(`${line}\n`) : undefined,
  });
  // The first Ctrl-C (or SIGTERM, or the terminal closing) stops everything in order; another one
  // while stopping kills the children at once and exits, never leaving them behind.
  let signals = 0;
  let firstSignalAtMs = 0;
  const stopSignal = new Promise<string>((resolve) => {
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
      process.on(signal, () => {
        if (++signals === 1) {
          firstSignalAtMs = Date.now();
          return resolve(signal);
        }
        // One Ctrl-C can arrive twice within moments (from the terminal and again from `npm`,
        // which forwards it): only a later one means "now".
        if (Date.now() - firstSignalAtMs < 1_000) return;
        group.killNow();
        rmSync(dir, { recursive: true, force: true });
        process.exit(130);
      });
    }
  });
  // Run by `npm start`, the demo's parent is npm's shell: a SIGTERM to npm kills that shell
  // without passing the signal on, and the demo would run on as an orphan. Its parent gone, the
  // demo stops as if signalled.
  const parentPid = process.ppid;
  const parentWatch = setInterval(() => {
    if (process.ppid !== parentPid) process.emit('SIGTERM');
  }, 500);
  parentWatch.unref();
  let summaryTimer: NodeJS.Timeout | undefined;
  let durationTimer: NodeJS.Timeout | undefined;
  let exitCode = 0;

  try {
    out.write(
      `spillway demo: starting a controller, ${ZONES.length} aggregators and ${processCount} ${
        dataPlaneKind === 'proxy' ? 'sidecar proxies' : 'hosts'
      }...\n`,
    );
    const controller = await startOrStop(
      stopSignal,
      group.start(
        'controller',
        [
          'controller',
          '--config',
          limitsPath,
          '--listen',
          '127.0.0.1:0',
          '--ops',
          '127.0.0.1:0',
          '--dashboard',
          dashboardAt,
          '--history',
          join(dir, 'history.sqlite'),
          '--id',
          'demo-controller',
        ],
        { env: { SPILLWAY_ADMIN_TOKEN: token } },
      ),
    );
    if (!controller) return 0;
    const grpc = String(controller.listening.grpc);
    const dashboardUrl = String(controller.listening.dashboard);
    const aggregators = await startOrStop(
      stopSignal,
      Promise.all(
        ZONES.map((zone) =>
          group.start(`aggregator-${zone}`, [
            'aggregator',
            '--zone',
            zone,
            '--parent',
            grpc,
            '--listen',
            '127.0.0.1:0',
            '--ops',
            '127.0.0.1:0',
            '--id',
            `demo-aggregator-${zone}`,
          ]),
        ),
      ),
    );
    if (!aggregators) return 0;
    const weights = Array.from(
      { length: processCount },
      (_, i) => PROCESS_WEIGHTS[i % PROCESS_WEIGHTS.length]!,
    );
    const totalWeight = weights.reduce((a, b) => a + b, 0);
    const zoneOf = (i: number) => i % ZONES.length;
    const aggregatorOf = (i: number) => String(aggregators[zoneOf(i)]!.listening.grpc);
    const startedAtMs = Date.now();

    const dataPlane: DataPlane | undefined =
      dataPlaneKind === 'host'
        ? await startOrStop(
            stopSignal,
            Promise.all(
              weights.map((weight, i) => {
                const workerSpec = {
                  id: `demo-host-${i + 1}`,
                  zone: ZONES[zoneOf(i)]!,
                  aggregators: [aggregatorOf(i)],
                  startedAtMs,
                  share: weight / totalWeight,
                  scale,
                };
                return group.start(workerSpec.id, worker('host', workerSpec));
              }),
            ).then(() => ({
              description: `${processCount} data-plane hosts (load offered in memory, no HTTP)`,
            })),
          )
        : await startOrStop(stopSignal, startProxies());
    if (!dataPlane) return 0;

    async function startProxies(): Promise<DataPlane> {
      const upstream = await group.start('upstream', worker('upstream', {}));
      const upstreamUrl = `http://${String(upstream.listening.http)}`;
      for (const [z, zone] of ZONES.entries()) {
        writeFileSync(
          join(dir, `proxy-${zone}.yaml`),
          demoProxyRulesYaml({ upstreamUrl, aggregator: aggregatorOf(z), zone, scale }),
        );
      }
      const proxies = await Promise.all(
        weights.map((_, i) =>
          group.start(`proxy-${i + 1}`, [
            'proxy',
            '--config',
            join(dir, `proxy-${ZONES[zoneOf(i)]}.yaml`),
            '--listen',
            '127.0.0.1:0',
            '--ops',
            '127.0.0.1:0',
            '--id',
            `demo-proxy-${i + 1}`,
            '--log-level',
            'warn',
          ]),
        ),
      );
      const load = await group.start(
        'load',
        worker('http-load', {
          targets: proxies.map((p, i) => ({ address: String(p.listening.proxy), weight: weights[i]! })),
          startedAtMs,
          scale,
        }),
      );
      let previous: { atMs: number; counts: HttpLoadCounts } | undefined;
      return {
        description:
          `${processCount} sidecar proxies (global backend) in front of 1 upstream, ` +
          '1 HTTP load generator sending through them',
        async status() {
          const health = (await (
            await fetch(`http://${String(load.listening.ops)}/healthz`, {
              signal: AbortSignal.timeout(2_000),
            })
          ).json()) as { counts: HttpLoadCounts };
          const now = { atMs: Date.now(), counts: health.counts };
          const before = previous;
          previous = now;
          if (!before) return 'HTTP through the proxies: measuring...';
          const perS = (key: keyof HttpLoadCounts) =>
            ((now.counts[key] - before.counts[key]) / ((now.atMs - before.atMs) / 1000)).toFixed(0);
          return (
            `HTTP through the proxies: ${perS('sent')} req/s sent, ${perS('ok')}/s 200, ` +
            `${perS('limited')}/s 429, ${perS('failed')}/s failed` +
            (now.counts.skipped > before.counts.skipped
              ? `, ${perS('skipped')}/s skipped (client overloaded)`
              : '')
          );
        },
      };
    }

    const banner = [
      '',
      `Spillway demo: 1 controller, ${ZONES.length} zone aggregators, ${dataPlane.description}; each its own process on loopback.`,
      `  dashboard    ${dashboardUrl}#token=${encodeURIComponent(token)}`,
      '               (the #token part fills in the admin token for the flip/limit buttons)',
      `  API          ${dashboardUrl}api/snapshot`,
      `  metrics      http://${String(controller.listening.ops)}/metrics (controller)`,
      `  limits file  ${limitsPath} (edit it: the controller reloads it)`,
      `  load         ${DEMO_STREAMS.length} buckets, changing over a ${DEMO_CYCLE_S} s cycle; each goes over its limit in turn`,
      `  processes    ${group.children.map((c) => `${c.name}=${c.pid}`).join(' ')}`,
      durationS > 0 ? `Stopping after ${durationS} s (or on Ctrl-C).` : 'Press Ctrl-C to stop.',
      '',
    ].join('\n');
    out.write(`${banner}\n`);

    const printSummary = async () => {
      let text: string;
      try {
        const response = await fetch(`${dashboardUrl}api/snapshot`, { signal: AbortSignal.timeout(2_000) });
        const view = (await response.json()) as DashboardView;
        const elapsedS = (Date.now() - startedAtMs) / 1000;
        text = formatDemoSummary(view, { elapsedS, phase: demoPhase(elapsedS) });
        if (dataPlane.status) text += `\n${await dataPlane.status()}`;
      } catch (error) {
        text = `(the controller did not answer: ${(error as Error).message})`;
      }
      // A terminal gets one table redrawn in place; a pipe or file gets every table, in order.
      out.write(interactive ? `\x1b[H\x1b[J${banner}\n${text}\n` : `${text}\n\n`);
    };
    summaryTimer = setInterval(() => void printSummary(), summaryEveryS * 1000);

    const outcome = await Promise.race([
      stopSignal.then((signal) => ({ kind: 'signal' as const, signal })),
      group.unexpectedExit.then((child) => ({ kind: 'crash' as const, child })),
      ...(durationS > 0
        ? [
            new Promise<{ kind: 'duration' }>((resolve) => {
              durationTimer = setTimeout(() => resolve({ kind: 'duration' }), durationS * 1000);
            }),
          ]
        : []),
    ]);
    if (outcome.kind === 'crash') {
      exitCode = 1;
      process.stderr.write(describeCrash(outcome.child, await outcome.child.exited));
    }
    return exitCode;
  } catch (error) {
    process.stderr.write(`spillway demo: ${(error as Error).message}\n`);
    return 1;
  } finally {
    clearInterval(summaryTimer);
    // Stopped early (a signal, a crash): the duration's timer would hold the process until it ran out.
    clearTimeout(durationTimer);
    clearInterval(parentWatch);
    out.write(`\nspillway demo: stopping ${group.children.filter((c) => c.running).length} processes...\n`);
    await group.stopAll();
    rmSync(dir, { recursive: true, force: true });
    out.write(`spillway demo: stopped (${group.children.length} processes exited)\n`);
  }
}

/** Arguments that start one of the demo's own processes (src/cli/demo/worker.ts). */
function worker(role: string, workerSpec: object): string[] {
  return ['demo', '--worker', role, '--spec', JSON.stringify(workerSpec)];
}

/** Waits for `starting`, unless a stop signal comes first (then undefined: the caller returns). */
async function startOrStop<T>(stop: Promise<string>, starting: Promise<T>): Promise<T | undefined> {
  const result = await Promise.race([starting, stop.then(() => undefined)]);
  // A start that loses the race still settles; its rejection must not go unhandled.
  starting.catch(() => {});
  return result;
}

function describeCrash(child: DemoChild, code: number | string): string {
  return [
    `spillway demo: ${child.name} (pid ${child.pid}) exited unexpectedly (${code}); stopping the rest.`,
    `Its last lines:`,
    ...child.tail.map((line) => `  ${line}`),
    '',
  ].join('\n');
}
