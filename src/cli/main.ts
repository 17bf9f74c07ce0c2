import { existsSync, readFileSync } from 'node:fs';

/**
 * Entry point of the `spillway` command. Each subcommand is one module under src/cli/ exporting
 * `run(argv): Promise<number>` (the exit code); this file only routes and prints help.
 */
interface Subcommand {
  summary: string;
  load: () => Promise<{ run(argv: string[]): Promise<number> }>;
}

export const subcommands: Record<string, Subcommand> = {
  aggregator: {
    summary: "run a zone aggregator: sums hosts' reports, forwards them up, relays directives down",
    load: () => import('./aggregator.js'),
  },
  demo: {
    summary:
      'start a whole local cluster (controller + dashboard, aggregators, sidecar proxies, load) and watch it',
    load: () => import('./demo/demo.js'),
  },
  controller: {
    summary: 'run the global rate limiter controller (limits file, drop ratios, directives)',
    load: () => import('./controller.js'),
  },
  sim: {
    summary: "simulate a fleet in virtual time and measure the global limiter's accuracy",
    load: () => import('./sim.js'),
  },
  'header-hash': {
    summary:
      'print what {headerHash:name} renders for a header value, to name a hashed caller in the limits file',
    load: () => import('./header-hash.js'),
  },
  host: {
    summary: 'run a data-plane host offering synthetic load to the global limiter (tests, demos)',
    load: () => import('./host.js'),
  },
  rls: {
    summary: "serve Envoy's rate limit service from an envoyproxy/ratelimit config, deciding in process",
    load: () => import('./rls.js'),
  },
  proxy: {
    summary: 'run a sidecar reverse proxy that rate limits requests before forwarding them upstream',
    load: () => import('./proxy.js'),
  },
  tune: {
    summary:
      'propose limits from recorded peaks (quantile of daily peaks x headroom); --apply writes opted-in ones',
    load: () => import('./tune.js'),
  },
};

export function helpText(): string {
  const names = Object.keys(subcommands).sort();
  const width = Math.max(12, ...names.map((n) => n.length));
  const lines = names.map((n) => `  ${n.padEnd(width)}  ${subcommands[n]!.summary}`);
  return [
    'Usage: spillway <command> [options]',
    '',
    'Rate limiting for fleets of Node.js services.',
    '',
    'Commands:',
    ...(lines.length > 0 ? lines : ['  (none yet)']),
    '',
    'Options:',
    "  -h, --help     show this help (or a command's help: spillway <command> --help)",
    '  -v, --version  print the version',
    '',
  ].join('\n');
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    process.stdout.write(helpText());
    return 0;
  }
  if (command === '-v' || command === '--version') {
    process.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  const sub = subcommands[command];
  if (!sub) {
    process.stderr.write(`spillway: unknown command '${command}'\n\n${helpText()}`);
    return 2;
  }
  const module = await sub.load();
  return module.run(rest);
}

/** The package version, found by walking up from this module (works from src/ under tsx and from dist/). */
function packageVersion(): string {
  let dir = new URL('.', import.meta.url);
  for (let i = 0; i < 5; i++) {
    const candidate = new URL('package.json', dir);
    if (existsSync(candidate))
      return (JSON.parse(readFileSync(candidate, 'utf8')) as { version: string }).version;
    dir = new URL('..', dir);
  }
  return 'unknown';
}
