import { existsSync } from 'node:fs';
import { loadLimitsConfig } from '../config/limits-config.js';
import { stepTakenToday, takeTodaysStep } from '../control/tuning/auto-tuner.js';
import { formatProposals } from '../control/tuning/format-proposals.js';
import { dayStartOf, type HistoryStore, utcDate } from '../control/tuning/history-store.js';
import type { LimitChange } from '../control/tuning/limits-file-writer.js';
import { DEFAULT_MIN_DAYS, MIN_DEMAND_DAYS, proposeLimits } from '../control/tuning/propose-limits.js';
import { SAMPLE_DAYS, writeSampleHistory } from '../control/tuning/sample-history.js';
import { createSqliteHistoryStore } from '../control/tuning/sqlite-history-store.js';
import { isSpillwayError } from '../core/errors.js';
import { exitQuietlyWhenStdoutCloses } from './closed-stdout.js';
import { type CommandSpec, numberFlag, runCommand, stringFlag, usageError } from './command-line.js';

export const spec: CommandSpec = {
  name: 'tune',
  summary:
    'Propose limits from the peaks a controller recorded (--history): per bucket, a high quantile of ' +
    'the daily peaks of offered load x (1 + headroom), clamped; each proposal with its explanation. ' +
    'With --apply, buckets with `tuning.auto: true` get their new limits written to the limits file.',
  flags: {
    history: {
      type: 'string',
      valueName: 'path.sqlite',
      description:
        "the controller's history file (controller --history); it must exist. Required, unless --sample-history",
    },
    'sample-history': {
      type: 'string',
      valueName: 'path.sqlite',
      description: `write a made-up history (${SAMPLE_DAYS} days of peaks for each exact-key bucket of --config) to this new file and propose from it: see what tune does before a controller has recorded the ${DEFAULT_MIN_DAYS} days a proposal needs`,
    },
    config: { type: 'string', valueName: 'limits.yaml', description: 'the limits file', required: true },
    weeks: { type: 'string', valueName: 'n', description: 'weeks of daily peaks to read', defaultText: '4' },
    'min-days': {
      type: 'string',
      valueName: 'n',
      description:
        "watched for fewer days than this (from the bucket's first day in the window): no proposal; at most 7 x --weeks",
      defaultText: `${DEFAULT_MIN_DAYS}, or 7 x --weeks if fewer`,
    },
    apply: {
      type: 'boolean',
      description: "write the opted-in (tuning.auto) buckets' proposals to the limits file, atomically",
    },
    force: {
      type: 'boolean',
      description: 'with --apply: apply even if tuning was already applied today (another daily step)',
    },
    json: { type: 'boolean', description: 'print the proposals as JSON instead of a table' },
  },
  notes: [
    `A proposal needs history: a bucket watched for ${DEFAULT_MIN_DAYS} days (--min-days) with at least ${MIN_DEMAND_DAYS} days of demand.`,
    'Try it first on a sample: spillway tune --sample-history /tmp/sample.sqlite --config limits.yaml',
    'Only buckets whose rule sets `tuning: { auto: true }` are written; the others are shown for review',
    '(accept them on the dashboard or edit the file). Comments and layout of the file are kept; the running',
    'controller reloads it. Apply at most once a day: maxChangePerDay bounds each application.',
    'Exit codes: 0 done (proposals or not), 2 usage, limits file or history file errors.',
    'Example: spillway tune --history /var/lib/spillway/history.sqlite --config limits.yaml --apply',
  ],
};

export function run(argv: string[]): Promise<number> {
  exitQuietlyWhenStdoutCloses();
  return runCommand(spec, argv, async (values) => {
    const samplePath = stringFlag(values, 'sample-history');
    const historyPath = stringFlag(values, 'history') ?? samplePath;
    if (historyPath === undefined) {
      throw usageError(
        `--history is required (the file a controller records with --history); to try tune without one, write a sample: --sample-history <new file>`,
        { flag: 'history' },
      );
    }
    if (samplePath !== undefined && stringFlag(values, 'history') !== undefined) {
      throw usageError('--history and --sample-history: give one (the sample is written, then read)', {
        flag: 'sample-history',
      });
    }
    const configPath = stringFlag(values, 'config')!;
    const weeks = numberFlag(values, 'weeks', 4, { min: 1, integer: true });
    if (weeks > 52) throw usageError(`--weeks must be at most 52, got ${weeks}`, { flag: 'weeks' });
    const minDays = numberFlag(values, 'min-days', Math.min(DEFAULT_MIN_DAYS, weeks * 7), {
      min: 1,
      max: weeks * 7,
      integer: true,
    });
    const apply = values.apply === true;
    const json = values.json === true;
    if (values.force === true && !apply)
      throw usageError('--force only makes sense with --apply', { flag: 'force' });
    if (samplePath !== undefined && apply) {
      throw usageError('--apply with --sample-history would write limits sized from made-up peaks', {
        flag: 'apply',
      });
    }

    const config = await loadLimitsConfig(configPath);
    const nowMs = Date.now();
    if (samplePath !== undefined) {
      if (existsSync(samplePath)) {
        throw usageError(
          `--sample-history: ${samplePath} exists; name a new file (a sample never overwrites a history)`,
          {
            flag: 'sample-history',
          },
        );
      }
      const sampleStore = createSqliteHistoryStore({ path: samplePath });
      try {
        const sample = writeSampleHistory(sampleStore, config, nowMs);
        process.stderr.write(
          `spillway tune: wrote a sample history to ${samplePath}: ${sample.days} days of made-up peaks for ${sample.buckets.length} bucket${sample.buckets.length === 1 ? '' : 's'} (${sample.buckets.join(', ') || 'none: the limits file has no exact-key rule'}); not your traffic\n`,
        );
      } finally {
        sampleStore.close();
      }
    } else if (!existsSync(historyPath)) {
      throw usageError(
        `--history: ${historyPath} does not exist. A controller writes it while it runs (spillway controller --history ${historyPath}), and a proposal needs ${DEFAULT_MIN_DAYS} days of it; to see a proposal now, write a sample: spillway tune --sample-history <new file> --config ${configPath}`,
        { flag: 'history' },
      );
    }
    let store: HistoryStore;
    try {
      // Read-only unless applying: tuning a copy of the file, or one the controller owns, writes nothing.
      store = createSqliteHistoryStore({ path: historyPath, readonly: !apply, mustExist: true });
    } catch (error) {
      throw usageError(`--history: ${isSpillwayError(error) ? error.message : String(error)}`, {
        flag: 'history',
      });
    }
    try {
      const proposals = proposeLimits(store, config, nowMs, { weeks, minDays });
      const changes: LimitChange[] = proposals
        .filter((p) => p.action === 'apply')
        .map((p) => ({ bucket: p.bucket, limitRps: p.proposedLimitRps }));
      let applied: LimitChange[] = [];
      let note: string | undefined;
      if (apply) {
        const todayMs = dayStartOf(nowMs);
        if (stepTakenToday(store, todayMs) && values.force !== true) {
          note = `tuning was already applied today (${utcDate(todayMs)}, UTC); nothing written (--force applies another step)`;
        } else {
          await takeTodaysStep(store, configPath, changes, todayMs);
          applied = changes;
          note =
            changes.length > 0
              ? `wrote ${changes.length} new limit${changes.length === 1 ? '' : 's'} to ${configPath}`
              : 'no opted-in bucket has a change to apply; file unchanged';
        }
      }
      if (json) {
        process.stdout.write(
          `${JSON.stringify({ generatedAtMs: nowMs, weeks, minDays, apply, applied, note: note ?? null, proposals }, null, 2)}\n`,
        );
      } else {
        process.stdout.write(
          formatProposals(proposals, apply ? { applied: applied.map((c) => c.bucket) } : {}),
        );
        if (note) process.stdout.write(`${note}\n`);
      }
      return 0;
    } finally {
      store.close();
    }
  });
}
