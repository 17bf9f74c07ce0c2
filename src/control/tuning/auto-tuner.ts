import { loadLimitsConfig } from '../../config/limits-config.js';
import { type Cancellable, type Scheduler, systemScheduler } from '../../core/clock.js';
import { assertKnownOptions, optionNames } from '../../core/validate.js';
import type { ControlLogger } from '../control-logger.js';
import { silentLogger } from '../control-logger.js';
import { DAY_MS, dayStartOf, type HistoryStore, utcDate } from './history-store.js';
import type { LimitChange } from './limits-file-writer.js';
import { writeLimitsFile } from './limits-file-writer.js';
import { type ProposeLimitsOptions, proposeLimits, type TuningProposal } from './propose-limits.js';

export interface AutoTunerOptions {
  store: HistoryStore;
  /** The limits file the controller runs from; applied proposals are written back to it. */
  configPath: string;
  scheduler?: Scheduler;
  /** How often to check whether today's run is due. Default 1 hour. */
  checkEveryMs?: number;
  propose?: ProposeLimitsOptions;
  logger?: ControlLogger;
  /** After the file was rewritten (the controller reloads it now rather than wait for its watcher). */
  onApplied?: (changes: LimitChange[]) => void;
}

export interface AutoTuneResult {
  /** `skipped`: already ran this UTC day. */
  outcome: 'applied' | 'nothing-to-apply' | 'skipped' | 'failed';
  proposals: TuningProposal[];
  changes: LimitChange[];
  error?: string;
}

export interface AutoTuner {
  start(): void;
  /** Stops the timer; resolves when a run in flight has finished (close the store after this). */
  stop(): Promise<void>;
  /** Run now if today's run has not happened yet (the timer calls this). Never rejects. */
  runIfDue(): Promise<AutoTuneResult>;
}

/** Marker in the history store: the UTC day start of the last automatic run. */
export const AUTO_TUNE_MARKER = 'autoTune.lastRunDayStartMs';

/**
 * Whether today's step has been taken: the marker is today, or tomorrow. Tomorrow means a clock ran
 * a day ahead when the step was taken; taking another now would make two steps in one real day, so
 * tuning waits a day (`spillway tune --apply --force` takes a step now and resets it). A marker
 * further ahead is ignored (and overwritten by the next step).
 */
export function stepTakenToday(store: HistoryStore, todayMs: number): boolean {
  const marker = store.getMarker(AUTO_TUNE_MARKER);
  // More than a day ahead is no clock drift but bad data (an RTC reading 2038): counted, it would
  // stop tuning until that date. Ignored, it costs at most one extra step.
  return marker !== undefined && marker >= todayMs && marker <= todayMs + DAY_MS;
}

/**
 * Takes today's step: the marker first, then the limits file, so a crash between the two loses the
 * day's step instead of allowing a second one after a restart. A write that fails gives the day back
 * (the next check retries).
 */
export async function takeTodaysStep(
  store: HistoryStore,
  configPath: string,
  changes: LimitChange[],
  todayMs: number,
): Promise<void> {
  const previous = store.getMarker(AUTO_TUNE_MARKER);
  store.setMarker(AUTO_TUNE_MARKER, todayMs);
  if (changes.length === 0) return;
  try {
    await writeLimitsFile(configPath, changes);
  } catch (error) {
    store.setMarker(AUTO_TUNE_MARKER, previous ?? 0);
    throw error;
  }
}

/**
 * Applies the proposals of buckets that opted in (`tuning.auto: true`) once per UTC day, by rewriting
 * the limits file (atomically; comments kept) so the file stays the one source of truth and the
 * controller's reload applies the new limits (`controller.updateConfig`). Proposals for the other
 * buckets are logged for review, not applied.
 *
 * Once a day because `maxChangePerDay` bounds each application: the day of the last run is kept in
 * the history store, so a restarted controller does not apply a second step the same day. A failure
 * (unwritable file, invalid file) is logged and retried at the next check; it never affects enforcement.
 */
const AUTO_TUNER_OPTIONS = optionNames<AutoTunerOptions>({
  store: true,
  configPath: true,
  scheduler: true,
  checkEveryMs: true,
  propose: true,
  logger: true,
  onApplied: true,
});

export function createAutoTuner(options: AutoTunerOptions): AutoTuner {
  assertKnownOptions(options, AUTO_TUNER_OPTIONS, 'createAutoTuner');
  const scheduler = options.scheduler ?? systemScheduler;
  const logger = options.logger ?? silentLogger;
  const checkEveryMs = options.checkEveryMs ?? 3_600_000;
  let timer: Cancellable | undefined;
  let running = false;
  let inFlight: Promise<AutoTuneResult> | undefined;

  async function run(): Promise<AutoTuneResult> {
    const nowMs = scheduler.nowMs();
    const todayMs = dayStartOf(nowMs);
    let proposals: TuningProposal[] = [];
    try {
      if (stepTakenToday(options.store, todayMs)) {
        const marker = options.store.getMarker(AUTO_TUNE_MARKER)!;
        if (marker > todayMs) {
          // Tomorrow's, by stepTakenToday.
          logger.warn(
            { lastRun: utcDate(marker), today: utcDate(todayMs) },
            'tuning: the last automatic run is dated after today (a clock ran ahead); no step until that day passes (spillway tune --apply --force takes one now)',
          );
        }
        return { outcome: 'skipped', proposals, changes: [] };
      }
      const marker = options.store.getMarker(AUTO_TUNE_MARKER);
      if (marker !== undefined && marker > todayMs + DAY_MS) {
        logger.warn(
          { lastRun: utcDate(marker), today: utcDate(todayMs) },
          'tuning: the last automatic run is dated more than a day ahead; ignored as a bad clock reading',
        );
      }
      const config = await loadLimitsConfig(options.configPath);
      proposals = proposeLimits(options.store, config, nowMs, options.propose);
      const changes = proposals
        .filter((p) => p.action === 'apply')
        .map((p) => ({ bucket: p.bucket, limitRps: p.proposedLimitRps }));
      await takeTodaysStep(options.store, options.configPath, changes, todayMs);
      for (const p of proposals) {
        if (p.action === 'none') continue;
        logger.info(
          {
            bucket: p.bucket,
            action: p.action,
            currentLimitRps: p.currentLimitRps,
            proposedLimitRps: p.proposedLimitRps,
            reason: p.reason,
          },
          p.action === 'apply'
            ? 'tuning: limit changed (tuning.auto)'
            : 'tuning: limit change proposed for review',
        );
      }
      if (changes.length > 0) options.onApplied?.(changes);
      return { outcome: changes.length > 0 ? 'applied' : 'nothing-to-apply', proposals, changes };
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      logger.warn(
        { file: options.configPath, err: message },
        'tuning: automatic run failed; limits unchanged',
      );
      return { outcome: 'failed', proposals, changes: [], error: message };
    }
  }

  function runIfDue(): Promise<AutoTuneResult> {
    // One run at a time: a slow file system must not let two runs both pass the marker check.
    inFlight ??= run().finally(() => {
      inFlight = undefined;
    });
    return inFlight;
  }

  function schedule(): void {
    timer = scheduler.setTimeout(() => {
      if (!running) return;
      void runIfDue().finally(() => {
        if (running) schedule();
      });
    }, checkEveryMs);
  }

  return {
    start() {
      if (running) return;
      running = true;
      void runIfDue();
      schedule();
    },
    async stop() {
      running = false;
      timer?.cancel();
      timer = undefined;
      await inFlight;
    },
    runIfDue,
  };
}
