import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { create } from '@bufbuild/protobuf';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { dayStartOf } from '../../src/control/tuning/history-store.js';
import type { TuningProposal } from '../../src/control/tuning/propose-limits.js';
import { createSqliteHistoryStore } from '../../src/control/tuning/sqlite-history-store.js';
import { ReportRequestSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createGrpcControlClient } from '../../src/transport/grpc-control-client.js';
import {
  REPO_ROOT,
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';
import { recordDays } from './generated-history.js';

const execFileAsync = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), 'spillway-tune-'));
const running: SpillwayProcess[] = [];
after(async () => {
  await Promise.all(running.map((p) => stopSpillway(p, 3_000)));
  rmSync(dir, { recursive: true, force: true });
});

async function spillway(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await execFileAsync(
      process.execPath,
      ['--import', 'tsx', 'src/cli/entry.ts', ...args],
      { cwd: REPO_ROOT, timeout: 60_000 },
    );
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

const LIMITS = `# Production limits: reviewed weekly.
version: 1
buckets:
  # Opted in: the controller (or spillway tune --apply) moves this one.
  - key: payments:charge
    limitRps: 1000 # tuned
    tuning:
      auto: true
      headroom: 0.3
  # Not opted in: proposals are for review.
  - key: search
    limitRps: 1000
  - key: brand-new
    limitRps: 50
    tuning: { auto: true }
`;

describe('spillway tune (end to end on a temp SQLite history and limits file)', () => {
  // History relative to the real clock: the command reads "now" from it.
  const historyPath = join(dir, 'history.sqlite');
  const limitsPath = join(dir, 'limits.yaml');
  const store = createSqliteHistoryStore({ path: historyPath });
  const todayMs = dayStartOf(Date.now());
  recordDays(store, 'payments:charge', 28, () => 1000, todayMs);
  recordDays(store, 'search', 28, () => 1000, todayMs);
  recordDays(store, 'brand-new', 3, () => 10, todayMs);
  store.close();
  writeFileSync(limitsPath, LIMITS);

  it('prints the proposals table with explanations and writes nothing without --apply', async () => {
    const { code, stdout, stderr } = await spillway([
      'tune',
      '--history',
      historyPath,
      '--config',
      limitsPath,
    ]);
    assert.equal(code, 0, stderr);
    const lines = stdout.split('\n');
    assert.match(lines[0]!, /^bucket +current +proposed +change +action +status$/);
    assert.match(stdout, /^payments:charge +1000 +1200 +\+20% +apply \(auto\) +change$/m);
    assert.match(stdout, /^search +1000 +1200 +\+20% +review +change$/m);
    assert.match(stdout, /^brand-new +50 +- +- +none +insufficient-history$/m);
    assert.match(stdout, /^ {2}p95 of daily peaks: 3rd highest of 28 = 1000 rps on /m);
    assert.match(stdout, /^ {2}no proposal: watched for 3 days of the last 4 weeks \(need 21\)$/m);
    assert.equal(readFileSync(limitsPath, 'utf8'), LIMITS);
  });

  it('--json prints the same proposals as data', async () => {
    const { code, stdout } = await spillway([
      'tune',
      '--history',
      historyPath,
      '--config',
      limitsPath,
      '--json',
    ]);
    assert.equal(code, 0);
    const out = JSON.parse(stdout) as { weeks: number; apply: boolean; proposals: TuningProposal[] };
    assert.equal(out.weeks, 4);
    assert.equal(out.apply, false);
    assert.deepEqual(
      out.proposals.map((p) => [p.bucket, p.action, p.proposedLimitRps]),
      [
        ['payments:charge', 'apply', 1200],
        ['search', 'review', 1200],
        ['brand-new', 'none', 50],
      ],
    );
    assert.equal(out.proposals[0]!.explanation!.sizing!.chosen.peakOfferedRps, 1000);
  });

  it('--apply changes only the opted-in buckets, keeps comments, and runs once a day', async () => {
    const applied = await spillway(['tune', '--history', historyPath, '--config', limitsPath, '--apply']);
    assert.equal(applied.code, 0, applied.stderr);
    assert.match(applied.stdout, /^payments:charge +1000 +1200 +\+20% +applied +change$/m);
    assert.match(
      applied.stdout,
      new RegExp(`^wrote 1 new limit to ${limitsPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`, 'm'),
    );
    const text = readFileSync(limitsPath, 'utf8');
    assert.equal(text, LIMITS.replace('limitRps: 1000 # tuned', 'limitRps: 1200 # tuned'));
    const config = parseLimitsConfig(text);
    assert.deepEqual(
      config.buckets.map((b) => [b.key, b.limitRps]),
      [
        ['payments:charge', 1200],
        ['search', 1000],
        ['brand-new', 50],
      ],
    );

    const again = await spillway(['tune', '--history', historyPath, '--config', limitsPath, '--apply']);
    assert.equal(again.code, 0);
    assert.match(again.stdout, /tuning was already applied today .* nothing written/);
    // Issue #35: the table said "apply (auto)" for what was not written.
    assert.match(again.stdout, /^payments:charge +1200 +1300 +\+8\.3% +not applied +change$/m);
    assert.doesNotMatch(again.stdout, /apply \(auto\)/);
    assert.equal(readFileSync(limitsPath, 'utf8'), text);

    const forced = await spillway([
      'tune',
      '--history',
      historyPath,
      '--config',
      limitsPath,
      '--apply',
      '--force',
    ]);
    assert.equal(forced.code, 0);
    assert.equal(parseLimitsConfig(readFileSync(limitsPath, 'utf8')).buckets[0]!.limitRps, 1300);
  });

  it('usage and file errors exit 2 with a clear message', async () => {
    const cases: [string[], RegExp][] = [
      [['tune', '--config', limitsPath], /--history is required/],
      [
        ['tune', '--history', historyPath, '--config', limitsPath, '--weeks', '0'],
        /--weeks must be an integer >= 1/,
      ],
      [
        ['tune', '--history', historyPath, '--config', limitsPath, '--force'],
        /--force only makes sense with --apply/,
      ],
      // Issue #35: "unable to open database file" gave no hint.
      [
        ['tune', '--history', join(dir, 'missing.sqlite'), '--config', limitsPath],
        /--history: .*missing\.sqlite does not exist\. A controller writes it while it runs \(spillway controller --history .*\), and a proposal needs 21 days of it; to see a proposal now, write a sample: spillway tune --sample-history <new file>/,
      ],
      [['tune', '--config', limitsPath], /to try tune without one, write a sample: --sample-history/],
      [
        ['tune', '--history', historyPath, '--sample-history', join(dir, 'x.sqlite'), '--config', limitsPath],
        /--history and --sample-history: give one/,
      ],
      [
        ['tune', '--sample-history', join(dir, 'y.sqlite'), '--config', limitsPath, '--apply'],
        /--apply with --sample-history would write limits sized from made-up peaks/,
      ],
      [
        ['tune', '--sample-history', historyPath, '--config', limitsPath],
        /--sample-history: .*history\.sqlite exists; name a new file/,
      ],
      [['tune', '--history', historyPath, '--config', join(dir, 'none.yaml')], /cannot read limits file/],
    ];
    for (const [args, pattern] of cases) {
      const { code, stderr } = await spillway(args);
      assert.equal(code, 2, args.join(' '));
      assert.match(stderr, pattern);
    }
  });
});

describe('spillway tune --sample-history (issue #35: a proposal in a minute, no weeks of history)', () => {
  it('writes a made-up history for the exact-key buckets and proposes from it, writing nothing else', async () => {
    const samplePath = join(dir, 'sample.sqlite');
    const limitsPath = join(dir, 'sample-limits.yaml');
    writeFileSync(limitsPath, LIMITS);
    const { code, stdout, stderr } = await spillway([
      'tune',
      '--sample-history',
      samplePath,
      '--config',
      limitsPath,
    ]);
    assert.equal(code, 0, stderr);
    assert.match(
      stderr,
      /^spillway tune: wrote a sample history to .*sample\.sqlite: 28 days of made-up peaks for 3 buckets \(payments:charge, search, brand-new\); not your traffic$/m,
    );
    assert.match(stdout, /^payments:charge +1000 +\d+ +[+-][\d.]+% +apply \(auto\) +change$/m);
    assert.match(stdout, /^brand-new +50 +[\d.]+ +/m);
    assert.doesNotMatch(stdout, /insufficient-history/);
    assert.equal(readFileSync(limitsPath, 'utf8'), LIMITS);
    // The file is a history like any other: tune reads it again.
    const again = await spillway(['tune', '--history', samplePath, '--config', limitsPath]);
    assert.equal(again.code, 0);
    assert.equal(again.stdout, stdout);
  });
});

describe('spillway tune piped into a reader that stops early', () => {
  it('exits 0 without a stack trace when stdout closes (tune --apply | head -3)', async () => {
    const historyPath = join(dir, 'pipe.sqlite');
    const limitsPath = join(dir, 'pipe-limits.yaml');
    writeFileSync(limitsPath, LIMITS);
    await spillway(['tune', '--sample-history', historyPath, '--config', limitsPath]);
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        'src/cli/entry.ts',
        'tune',
        '--history',
        historyPath,
        '--config',
        limitsPath,
        '--apply',
      ],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    child.stdout.destroy(); // the reader is gone before the first line
    let stderr = '';
    child.stderr.on('data', (chunk) => {
      stderr += String(chunk);
    });
    const code = await new Promise((resolve) => child.once('exit', resolve));
    assert.equal(code, 0, stderr);
    assert.equal(stderr, '');
    assert.notEqual(readFileSync(limitsPath, 'utf8'), LIMITS, 'the limits were written before the output');
  });
});

describe('spillway controller --history', () => {
  it('records per-minute peaks of offered load while it runs and flushes the last minute on shutdown', async () => {
    const limitsPath = join(dir, 'controller-limits.yaml');
    const historyPath = join(dir, 'sub', 'controller-history.sqlite');
    writeFileSync(limitsPath, 'version: 1\nintervalMs: 200\nbuckets:\n  - key: api\n    limitRps: 100\n');
    const controller = await startSpillway('controller', [
      'controller',
      '--config',
      limitsPath,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
      '--history',
      historyPath,
    ]);
    running.push(controller);
    const client = createGrpcControlClient(controller.grpc!);
    let sequence = 0n;
    /** The controller's tick count when a reply first showed the load: a later tick recorded it. */
    let ticksWhenCounted: number | undefined;
    try {
      // 40 offered in a 1 s window: 40 rps. Repeat until a tick has counted it (the peaks are
      // recorded at ticks; the reply to a report can carry a ratio computed before any tick).
      await waitFor('the controller to count the offered load', async () => {
        sequence += 1n;
        const response = await client.report(
          create(ReportRequestSchema, {
            reporterId: 'probe',
            sequence,
            // Ends now, like a real reporter's window (a fixed one would look ever later).
            windowStartMs: BigInt(Date.now() - 1000),
            windowEndMs: BigInt(Date.now()),
            hostCount: 1,
            buckets: [{ bucket: 'api', offered: 40, admitted: 40 }],
          }),
          { timeoutMs: 5_000 },
        );
        if (response.directives[0]?.offeredRps !== 40) return undefined;
        const ticks = (await scrape(controller.ops)).get(seriesKey('spillway_controller_ticks_total')) ?? 0;
        ticksWhenCounted ??= ticks;
        return ticks > ticksWhenCounted ? true : undefined;
      });
    } finally {
      client.close();
    }
    assert.equal(await stopSpillway(controller), 0);
    const store = createSqliteHistoryStore({ path: historyPath, readonly: true });
    try {
      const peaks = store.peaks('api', 0, Date.now() + 60_000);
      assert.ok(peaks.length >= 1, controller.output.join('\n'));
      assert.equal(Math.max(...peaks.map((p) => p.peakOfferedRps)), 40);
      assert.equal(store.dailyPeaks('api', 0, Date.now() + 60_000).at(-1)?.peakOfferedRps, 40);
    } finally {
      store.close();
    }
  });

  it('--auto-tune applies an opted-in proposal to the file and the running controller enforces it', async () => {
    const limitsPath = join(dir, 'auto-limits.yaml');
    const historyPath = join(dir, 'auto-history.sqlite');
    const store = createSqliteHistoryStore({ path: historyPath });
    recordDays(store, 'api', 28, () => 1000, dayStartOf(Date.now()));
    store.close();
    writeFileSync(
      limitsPath,
      'version: 1\nintervalMs: 200\nbuckets:\n  - key: api # tuned\n    limitRps: 1000\n    tuning: { auto: true }\n',
    );
    const controller = await startSpillway('controller', [
      'controller',
      '--config',
      limitsPath,
      '--listen',
      '127.0.0.1:0',
      '--ops',
      '127.0.0.1:0',
      '--history',
      historyPath,
      '--auto-tune',
    ]);
    running.push(controller);
    const client = createGrpcControlClient(controller.grpc!);
    let sequence = 0n;
    try {
      await waitFor('the tuned limit in directives', async () => {
        sequence += 1n;
        const response = await client.report(
          create(ReportRequestSchema, {
            reporterId: 'probe',
            sequence,
            // Ends now, like a real reporter's window (a fixed one would look ever later).
            windowStartMs: BigInt(Date.now() - 1000),
            windowEndMs: BigInt(Date.now()),
            hostCount: 1,
            buckets: [{ bucket: 'api', offered: 1, admitted: 1 }],
          }),
          { timeoutMs: 5_000 },
        );
        return response.directives[0]?.limitRps === 1200 ? true : undefined;
      });
    } finally {
      client.close();
    }
    assert.match(readFileSync(limitsPath, 'utf8'), /- key: api # tuned\n {4}limitRps: 1200\n/);
    assert.ok(controller.output.some((line) => line.includes('tuning: limit changed (tuning.auto)')));
    assert.equal(await stopSpillway(controller), 0);
  });

  it('--auto-tune needs --history (exit 2)', async () => {
    const { code, stderr } = await spillway(['controller', '--config', 'x.yaml', '--auto-tune']);
    assert.equal(code, 2);
    assert.match(stderr, /--auto-tune needs --history/);
  });
});
