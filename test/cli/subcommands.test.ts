import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { create } from '@bufbuild/protobuf';
import { subcommands } from '../../src/cli/main.js';
import { ReportRequestSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import { rawExchange } from '../helpers/raw-http.js';
import {
  REPO_ROOT,
  type SpillwayProcess,
  scrape,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';

const execFileAsync = promisify(execFile);

/** Runs `spillway <args>` from source to completion. */
async function spillway(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await execFileAsync(
      process.execPath,
      ['--import', 'tsx', 'src/cli/entry.ts', ...args],
      {
        cwd: REPO_ROOT,
        timeout: 30_000,
      },
    );
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

async function captureStderr(fn: () => Promise<number>): Promise<{ code: number; stderr: string }> {
  const chunks: string[] = [];
  const original = process.stderr.write;
  process.stderr.write = ((chunk: string | Uint8Array) => {
    chunks.push(String(chunk));
    return true;
  }) as typeof process.stderr.write;
  try {
    return { code: await fn(), stderr: chunks.join('') };
  } finally {
    process.stderr.write = original;
  }
}

const dir = mkdtempSync(join(tmpdir(), 'spillway-cli-'));
const running: SpillwayProcess[] = [];
after(async () => {
  await Promise.all(running.map((p) => stopSpillway(p, 3_000)));
  rmSync(dir, { recursive: true, force: true });
});

describe('spillway subcommands: help and usage errors', () => {
  it('header-hash prints what {headerHash:…} renders, to name a hashed caller in an override', async () => {
    const { code, stdout } = await spillway(['header-hash', '--value', 'acme', '--value', 'internal-batch']);
    assert.equal(code, 0);
    assert.equal(stdout, '822b33ad87c148a0\na15e75ba55f30583\n');
  });

  it('lists the subcommands in the top-level help', async () => {
    const { code, stdout } = await spillway(['--help']);
    assert.equal(code, 0);
    for (const name of ['controller', 'aggregator', 'host'])
      assert.match(stdout, new RegExp(`^  ${name} `, 'm'));
  });

  it('prints each command’s flags with --help and exits 0', async () => {
    const expected: Record<string, string[]> = {
      controller: ['--config', '--listen', '--ops', '--id', '--log-level'],
      aggregator: ['--zone', '--parent', '--listen', '--ops', '--id', '--interval-ms'],
      host: ['--aggregator', '--zone', '--bucket', '--duration-s', '--ops', '--id'],
    };
    await Promise.all(
      Object.entries(expected).map(async ([command, flags]) => {
        const { code, stdout } = await spillway([command, '--help']);
        assert.equal(code, 0, command);
        assert.match(stdout, new RegExp(`^Usage: spillway ${command} \\[options\\]`));
        for (const flag of flags) assert.ok(stdout.includes(flag), `${command} --help mentions ${flag}`);
      }),
    );
  });

  it('exits 2 with ERR_SPILLWAY_INVALID_USAGE and a clear message on bad flags', async () => {
    const cases: [string[], RegExp][] = [
      [['host', '--zone', 'z1', '--bucket', 'a=1'], /--aggregator is required/],
      [
        ['host', '--zone', 'z1', '--bucket', 'a=fast', '--aggregator', '127.0.0.1:7071'],
        /--bucket wants key=rps/,
      ],
      [
        ['host', '--zone', 'z1', '--bucket', 'a=1', '--aggregator', 'nowhere'],
        /--aggregator must be host:port/,
      ],
      [
        ['host', '--zone', 'z1', '--bucket', 'a=1,a=2', '--aggregator', '127.0.0.1:7071'],
        /'a' is given twice/,
      ],
      [['aggregator', '--zone', 'z1', '--parent'], /--parent needs a value/],
      [
        ['aggregator', '--zone', 'z1', '--parent', '127.0.0.1:7070', '--frobnicate'],
        /Unknown option '--frobnicate'/,
      ],
      [['aggregator', '--zone', 'z1', '--parent', '127.0.0.1:0'], /port 0 is not a valid target/],
      [
        ['aggregator', '--zone', 'z1', '--parent', '127.0.0.1:7070', '--interval-ms', 'soon'],
        /--interval-ms must be/,
      ],
      [['controller', '--config', 'x.yaml', '--listen', '127.0.0.1:99999'], /--listen must be host:port/],
      [['controller', '--config', 'x.yaml', '--log-level', 'loud'], /--log-level must be one of/],
      [['controller', '--config', 'x.yaml', 'stray'], /unexpected argument 'stray'/],
      [['controller'], /--config is required/],
      // Past one timer's reach (24.8 days) the host would have stopped at once.
      [
        [
          'host',
          '--zone',
          'z1',
          '--bucket',
          'a=1',
          '--aggregator',
          '127.0.0.1:7071',
          '--duration-s',
          '9999999',
        ],
        /--duration-s must be a number from 0 to 2147483/,
      ],
      [
        ['aggregator', '--zone', 'z1', '--parent', '127.0.0.1:7070', '--max-bucket-series', '1.5'],
        /--max-bucket-series must be an integer >= 0/,
      ],
      // A token no Authorization header could carry as it is: every admin request would get 401.
      [
        ['controller', '--config', 'x.yaml', '--admin-token', 'correct horse battery staple'],
        /printable ASCII/,
      ],
      // A Host header carries a name, never a URL: this entry could match no request.
      [
        [
          'controller',
          '--config',
          'x.yaml',
          '--dashboard',
          '127.0.0.1:0',
          '--dashboard-allowed-host',
          'https://dash.example.com:8443',
        ],
        /--dashboard-allowed-host: 'https:\/\/dash\.example\.com:8443' is not a host name or IP address/,
      ],
      [
        ['controller', '--config', 'x.yaml', '--dashboard-allowed-host', 'dash.example.com'],
        /--dashboard-allowed-host needs --dashboard/,
      ],
      // Every command that serves an ops endpoint takes --ops-allowed-host, checked the same way.
      ...[
        ['host', '--zone', 'z1', '--bucket', 'a=1', '--aggregator', '127.0.0.1:7071'],
        ['aggregator', '--zone', 'z1', '--parent', '127.0.0.1:7070'],
        ['controller', '--config', 'x.yaml'],
        ['proxy', '--config', 'x.yaml'],
      ].map((args): [string[], RegExp] => [
        [...args, '--ops-allowed-host', 'metrics.example:9090'],
        /--ops-allowed-host: 'metrics\.example:9090' is not a host name or IP address/,
      ]),
      [
        [
          'controller',
          '--config',
          'x.yaml',
          '--dashboard',
          '127.0.0.1:0',
          '--dashboard-max-streams',
          '8',
          '--dashboard-max-streams-per-address',
          '9',
        ],
        /--dashboard-max-streams-per-address must be an integer from 1 to 8, got '9'/,
      ],
      [
        ['controller', '--config', 'x.yaml', '--dashboard-max-streams-per-address', '8'],
        /--dashboard-max-streams-per-address needs --dashboard/,
      ],
      // A controller's --tls-ca only verifies clients: without mutual TLS it would be ignored.
      [
        ['controller', '--config', 'x.yaml', '--tls-ca', 'ca.pem'],
        /--tls-ca names the CAs of client certificates/,
      ],
    ];
    // In process: run() returns the exit code the entry point uses; stderr is captured.
    for (const [[command, ...args], message] of cases) {
      const module = (await subcommands[command!]!.load()) as { run(argv: string[]): Promise<number> };
      const { code, stderr } = await captureStderr(() => module.run(args));
      assert.equal(code, 2, `${command} ${args.join(' ')}: ${stderr}`);
      assert.match(stderr, message, `${command} ${args.join(' ')}`);
      assert.match(stderr, /\(ERR_SPILLWAY_INVALID_USAGE\)\nRun 'spillway \w+ --help' for usage\.\n$/);
    }
    // And once through the real entry point, for the process exit code.
    const { code, stderr } = await spillway(['host', '--bogus']);
    assert.equal(code, 2);
    assert.match(stderr, /Unknown option '--bogus' \(ERR_SPILLWAY_INVALID_USAGE\)/);
  });

  it('controller refuses an admin token equal to a tier token (every host would be an admin)', async () => {
    const token = 'a-token-long-enough-for-admin-use';
    const tokenPath = join(dir, 'tier-token');
    writeFileSync(tokenPath, `${token}\n`);
    const configPath = join(dir, 'admin-token-limits.yaml');
    writeFileSync(configPath, 'version: 1\nbuckets:\n  - key: a\n    limitRps: 10\n');
    const module = (await subcommands.controller!.load()) as { run(argv: string[]): Promise<number> };
    const common = ['--config', configPath, '--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'];
    const dashboard = ['--dashboard', '127.0.0.1:0', '--admin-token', token];
    for (const tokenFlags of [
      ['--auth-token-file', tokenPath],
      ['--auth-token-file', join(dir, 'other-token'), '--zone-token-file', `z1=${tokenPath}`],
    ]) {
      writeFileSync(join(dir, 'other-token'), 'another-token-for-the-tiers\n');
      const { code, stderr } = await captureStderr(() =>
        module.run([...common, ...tokenFlags, ...dashboard]),
      );
      assert.equal(code, 2, stderr);
      assert.match(stderr, /the admin token must differ from the tiers' tokens/);
    }
  });

  it('controller exits 2 naming file, line and column for an invalid limits file', async () => {
    const path = join(dir, 'bad.yaml');
    writeFileSync(path, 'version: 1\nbuckets:\n  - key: a\n    limitRps: -1\n');
    const { code, stderr } = await spillway([
      'controller',
      '--config',
      path,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
    ]);
    assert.equal(code, 2);
    assert.match(stderr, /bad\.yaml:4:\d+: buckets\[0\]\.limitRps/);
    assert.match(stderr, /ERR_SPILLWAY_INVALID_CONFIG/);
  });
});

describe('spillway controller: limits reload', () => {
  it('reloads on file change and SIGHUP, keeps the old limits when the new file is invalid', async () => {
    const path = join(dir, 'limits.yaml');
    const limits = (limitRps: number) =>
      `version: 1\nintervalMs: 200\nbuckets:\n  - key: api\n    limitRps: ${limitRps}\n`;
    writeFileSync(path, limits(100));
    const controller = await startSpillway('controller', [
      'controller',
      '--config',
      path,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
    ]);
    running.push(controller);
    const client = createGrpcControlClient(controller.grpc!);
    let sequence = 0n;
    const limitSeen = async () => {
      sequence += 1n;
      const response = await client.report(
        create(ReportRequestSchema, {
          reporterId: 'probe',
          sequence,
          // Ends now, like a real reporter's window (a fixed one would look ever later).
          windowStartMs: BigInt(Date.now() - 1000),
          windowEndMs: BigInt(Date.now()),
          hostCount: 1,
          buckets: [{ bucket: 'api', offered: 10, admitted: 10 }],
        }),
        { timeoutMs: 5_000 },
      );
      return response.directives[0]?.limitRps;
    };
    const reloads = async (result: string) =>
      (await scrape(controller.ops)).get(`spillway_config_reloads_total{result="${result}"}`) ?? 0;
    try {
      // The reply to the first report of a bucket carries its first directive.
      await waitFor('a first directive', async () => ((await limitSeen()) === 100 ? true : undefined));
      // Both series exist from the start, so the first failure is an increase rate() can see.
      assert.equal((await scrape(controller.ops)).get('spillway_config_reloads_total{result="error"}'), 0);
      assert.equal((await scrape(controller.ops)).get('spillway_config_last_reload_successful'), 1);

      writeFileSync(path, limits(250));
      await waitFor('the file change to apply', async () => ((await limitSeen()) === 250 ? true : undefined));
      assert.equal(await reloads('ok'), 1);

      writeFileSync(path, 'version: 1\nbuckets:\n  - key: api\n    limitRps: lots\n');
      await waitFor('the failed reload to be counted', async () =>
        (await reloads('error')) >= 1 ? true : undefined,
      );
      assert.equal(await limitSeen(), 250, 'the previous limits stay in force');
      // The alert rules read this gauge (deploy/prometheus/alerts.yml): counters cannot say
      // whether a later reload succeeded.
      assert.equal((await scrape(controller.ops)).get('spillway_config_last_reload_successful'), 0);
      const health = (await (await fetch(`http://${controller.ops}/healthz`)).json()) as {
        lastReloadError: string;
        buckets: number;
        children: number;
      };
      assert.match(health.lastReloadError, /limits\.yaml:4:\d+/);
      // Counts over everything tracked (the probe's bucket and the probe), not the listed part of a
      // bounded snapshot.
      assert.deepEqual([health.buckets, health.children], [1, 1]);
      assert.ok(
        controller.output.some((line) => line.includes('limits reload failed')),
        'the failure is logged',
      );
      // Writes beside the broken file (a log, the history database) are events in the watched
      // directory: the broken text was tried once, so they reload nothing and log nothing.
      const failures = await reloads('error');
      for (let i = 0; i < 10; i++) {
        writeFileSync(join(dir, 'neighbour.log'), `line ${i}\n`, { flag: 'a' });
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      // Absence takes a wait: past the watcher's 200 ms debounce, twice over.
      await new Promise((resolve) => setTimeout(resolve, 600));
      assert.equal(await reloads('error'), failures, 'no reload loop on writes beside the file');

      // The bad edit reverted, the file is again what is in force: an ok reload, and /healthz
      // stops reporting the old error.
      const okBeforeRevert = await reloads('ok');
      writeFileSync(path, limits(250));
      await waitFor('the reverted file to reload', async () =>
        (await reloads('ok')) > okBeforeRevert ? true : undefined,
      );
      const healed = (await (await fetch(`http://${controller.ops}/healthz`)).json()) as {
        lastReloadError: string | null;
      };
      assert.equal(healed.lastReloadError, null);
      assert.equal((await scrape(controller.ops)).get('spillway_config_last_reload_successful'), 1);

      // SIGHUP reloads even when the watcher saw nothing (e.g. a file on a mount without events).
      writeFileSync(path, limits(300));
      await waitFor('the repaired file to apply', async () =>
        (await limitSeen()) === 300 ? true : undefined,
      );
      const okBefore = await reloads('ok');
      controller.child.kill('SIGHUP');
      await waitFor('SIGHUP to reload', async () => ((await reloads('ok')) > okBefore ? true : undefined));
    } finally {
      client.close();
    }
    assert.equal(await stopSpillway(controller), 0, 'SIGTERM exits 0');
    assert.ok(controller.output.some((line) => line.includes('"msg":"stopped"')));
  });
});

describe('spillway host', () => {
  it('fails open without a control plane and stops by itself after --duration-s', async () => {
    const { code, stdout } = await spillway([
      'host',
      '--aggregator',
      '127.0.0.1:1',
      '--zone',
      'z1',
      '--bucket',
      'a=200',
      '--duration-s',
      '1.5',
      '--ops',
      '127.0.0.1:0',
    ]);
    assert.equal(code, 0);
    const lines = stdout
      .trim()
      .split('\n')
      .map(
        (l) =>
          JSON.parse(l) as {
            msg: string;
            ops?: string;
            totals?: { bucket: string; offered: number; admitted: number }[];
          },
      );
    assert.equal(lines[0]!.msg, 'listening');
    assert.match(lines[0]!.ops ?? '', /^127\.0\.0\.1:\d+$/);
    assert.ok(
      lines.some((l) => l.msg.includes('report failed')),
      'the unreachable aggregator is logged',
    );
    const stopped = lines.at(-1)!;
    assert.equal(stopped.msg, 'stopped');
    const [totals] = stopped.totals!;
    assert.equal(totals!.bucket, 'a');
    assert.ok(totals!.offered >= 150, `offered ${totals!.offered} in 1.5 s at 200 rps`);
    assert.equal(totals!.admitted, totals!.offered, 'everything admitted: no directive, ratio 0');
  });
});

describe('spillway --ops-allowed-host', () => {
  it('reaches the ops endpoint: that name is served, a rebound one is refused with 403', async () => {
    const host = await startSpillway('host', [
      'host',
      '--aggregator',
      '127.0.0.1:1',
      '--zone',
      'z1',
      '--bucket',
      'a=1',
      '--ops',
      '127.0.0.1:0',
      '--ops-allowed-host',
      'metrics.example',
      '--log-level',
      'error',
    ]);
    running.push(host);
    const port = Number(host.ops.split(':').at(-1));
    const get = async (hostHeader: string) =>
      (await rawExchange(port, `GET /metrics HTTP/1.1\r\nHost: ${hostHeader}\r\nConnection: close\r\n\r\n`))
        .answers[0];
    assert.equal((await get(`metrics.example:${port}`))?.status, 200);
    assert.equal((await get(`localhost:${port}`))?.status, 200);
    const refused = await get(`evil.example:${port}`);
    assert.equal(refused?.status, 403);
    assert.match(refused?.body ?? '', /allow a name with --ops-allowed-host/);
    assert.equal(await stopSpillway(host), 0);
  });
});
