import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DashboardView } from '../dashboard/dashboard-view.js';
import {
  type CommandSpec,
  type FlagValues,
  numberFlag,
  parseHostPort,
  runCommand,
  stringFlag,
} from './command-line.js';
import { DEMO_STREAMS, demoLimitsYaml, demoPhase } from './demo-plan.js';
import { createDemoProcessGroup, type DemoChild } from './demo-processes.js';
import { formatDemoSummary } from './demo-summary.js';
import { runDemoWorker } from './demo-worker.js';

export const spec: CommandSpec = {
  name: 'demo',
  summary:
    'Start a whole global rate limiter on this machine, one process per part (a controller with its ' +
    'dashboard, two zone aggregators, data-plane hosts and their changing, skewed load), print the ' +
    'dashboard URL and a live summary, and stop everything on Ctrl-C.',
  flags: {
    duration: {
      type: 'string',
      valueName: 'seconds',
      description: 'stop after this long once the cluster is up',
      defaultText: 'run until Ctrl-C',
    },
    hosts: { type: 'string', valueName: 'n', description: 'data-plane host processes', defaultText: '4' },
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
/** Uneven hosts: one busy, one quiet, one in between per zone. */
const HOST_WEIGHTS = [4, 1.5, 3, 1.5];

async function runDemo(values: FlagValues): Promise<number> {
  const durationS = numberFlag(values, 'duration', 0, { min: 0 });
  const hostCount = numberFlag(values, 'hosts', 4, { min: 1, integer: true });
  const scale = numberFlag(values, 'scale', 1, { min: 0.01 });
  const summaryEveryS = numberFlag(values, 'summary-every', 2, { min: 0.5 });
  const dashboardAt = stringFlag(values, 'dashboard') ?? '127.0.0.1:0';
  parseHostPort('dashboard', dashboardAt);
  const verbose = values.verbose === true;
  const out = process.stdout;
  const interactive = out.isTTY === true;

  const stopSignal = new Promise<string>((resolve) => {
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const)
      process.once(signal, () => resolve(signal));
  });

  const dir = mkdtempSync(join(tmpdir(), 'spillway-demo-'));
  const limitsPath = join(dir, 'limits.yaml');
  writeFileSync(limitsPath, demoLimitsYaml(scale));
  const token = process.env.SPILLWAY_ADMIN_TOKEN || randomBytes(18).toString('base64url');
  const group = createDemoProcessGroup({
    echo: verbose ? (line) => process.stderr.write(`${line}\n`) : undefined,
  });
  let summaryTimer: NodeJS.Timeout | undefined;
  let exitCode = 0;

  try {
    out.write(
      `spillway demo: starting a controller, ${ZONES.length} aggregators and ${hostCount} hosts...\n`,
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
    const weights = Array.from({ length: hostCount }, (_, i) => HOST_WEIGHTS[i % HOST_WEIGHTS.length]!);
    const totalWeight = weights.reduce((a, b) => a + b, 0);
    const startedAtMs = Date.now();
    const hosts = await startOrStop(
      stopSignal,
      Promise.all(
        weights.map((weight, i) => {
          const zoneIndex = i % ZONES.length;
          const workerSpec = {
            id: `demo-host-${i + 1}`,
            zone: ZONES[zoneIndex]!,
            aggregators: [String(aggregators[zoneIndex]!.listening.grpc)],
            startedAtMs,
            share: weight / totalWeight,
            scale,
          };
          return group.start(workerSpec.id, [
            'demo',
            '--worker',
            'host',
            '--spec',
            JSON.stringify(workerSpec),
          ]);
        }),
      ),
    );
    if (!hosts) return 0;

    const banner = [
      '',
      `Spillway demo: 1 controller, ${ZONES.length} zone aggregators, ${hostCount} data-plane hosts, each its own process on loopback.`,
      `  dashboard    ${dashboardUrl}#token=${token}`,
      '               (the #token part fills in the admin token for the flip/limit buttons)',
      `  API          ${dashboardUrl}api/snapshot`,
      `  metrics      http://${String(controller.listening.ops)}/metrics (controller)`,
      `  limits file  ${limitsPath} (edit it: the controller reloads it)`,
      `  load         ${DEMO_STREAMS.length} buckets, changing over a 60 s cycle; buckets go over their limits in turn`,
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
            new Promise<{ kind: 'duration' }>((resolve) =>
              setTimeout(() => resolve({ kind: 'duration' }), durationS * 1000),
            ),
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
    out.write(`\nspillway demo: stopping ${group.children.filter((c) => c.running).length} processes...\n`);
    await group.stopAll();
    rmSync(dir, { recursive: true, force: true });
    out.write(`spillway demo: stopped (${group.children.length} processes exited)\n`);
  }
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
