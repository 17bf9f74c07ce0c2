import { readConfigFile } from '../config/read-config-file.js';
import type { SpillwayError } from '../core/errors.js';
import type { Logger } from '../ops/logger.js';
import { type FileWatcher, watchFile } from './file-watcher.js';

/** What asked for a reload: the signal, the file watcher, or a rewrite of the file by the process. */
export type ReloadTrigger = 'SIGHUP' | 'file' | 'tune';

export interface ConfigReloaderOptions {
  path: string;
  /** What the file holds, as logs name it: `limits` (`limits reloaded`, `limits file watch stopped`). */
  holds: string;
  /** The text in force (read at start): a watcher's event that finds it unchanged reloads nothing. */
  text: string;
  logger: Logger;
  /**
   * Parses `text` and puts it in force, or throws to keep what is in force. Answers what the
   * `reloaded` log line adds (`{ buckets }`).
   */
  apply(text: string): Record<string, unknown>;
  /** Each reload's result, for the reload metric. */
  count(result: 'ok' | 'error'): void;
  /** Reads what `apply` gets (default: the file at `path`, as text). */
  read?: () => Promise<string>;
  /** What to watch (watchFile watches its directory). Default `path`. */
  watchPath?: string;
}

/**
 * Reloads a configuration file (the controller's limits, the proxy's rules) when told to, one at
 * a time: a trigger during a reload queues one more after it, a SIGHUP if any queued trigger was
 * one (a SIGHUP reloads even an unchanged file). A file that fails to load keeps the previous one
 * in force; the failure is logged, counted and kept for `/healthz` (`lastError`).
 */
export class ConfigReloader {
  readonly #options: ConfigReloaderOptions;
  /** The text of the last reload attempted (or the start's): the watcher's events re-read the file. */
  #attemptedText: string;
  #lastError: string | undefined;
  #reloading: Promise<void> | undefined;
  #queuedTrigger: ReloadTrigger | undefined;

  constructor(options: ConfigReloaderOptions) {
    this.#options = options;
    this.#attemptedText = options.text;
  }

  /** The last reload's failure, undefined once one succeeds. */
  get lastError(): string | undefined {
    return this.#lastError;
  }

  /** Resolves when the reload in progress, if any, has finished. */
  async settled(): Promise<void> {
    await this.#reloading;
  }

  reload(trigger: ReloadTrigger): void {
    if (this.#reloading) {
      this.#queuedTrigger = this.#queuedTrigger === 'SIGHUP' ? 'SIGHUP' : trigger;
      return;
    }
    this.#reloading = this.#attempt(trigger);
  }

  /** Reloads on every change in the file's directory; a watch that stops is logged (SIGHUP still reloads). */
  watch(): FileWatcher {
    const { path, holds, logger } = this.#options;
    return watchFile(this.#options.watchPath ?? path, () => this.reload('file'), {
      onError: (error) =>
        logger.warn({ file: path, err: error.message }, `${holds} file watch stopped; SIGHUP still reloads`),
    });
  }

  async #attempt(trigger: ReloadTrigger): Promise<void> {
    const { path, holds, logger } = this.#options;
    try {
      const text = await (this.#options.read?.() ?? readConfigFile(path, { kind: `${holds} file` }));
      // The watcher reports every change in the file's directory (editors fire several events per
      // save; a log or history file beside it, many a second): text already tried is not a reload.
      // Compared with the last attempt, not the last success, so a file put back as it was after a
      // failed edit loads again (an ok reload, which clears /healthz's error) while a broken file
      // is tried once, not on every write beside it.
      if (trigger !== 'SIGHUP' && text === this.#attemptedText) return;
      this.#attemptedText = text;
      const details = this.#options.apply(text);
      this.#lastError = undefined;
      this.#options.count('ok');
      logger.info({ trigger, file: path, ...details }, `${holds} reloaded`);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      // The same failure again (an unreadable file, on every event beside it) is not news.
      if (trigger !== 'SIGHUP' && message === this.#lastError) return;
      this.#lastError = message;
      this.#options.count('error');
      logger.error(
        { trigger, file: path, code: (error as SpillwayError).code, err: message },
        `${holds} reload failed; the previous ${holds} stay in force`,
      );
    } finally {
      this.#reloading = undefined;
      const next = this.#queuedTrigger;
      this.#queuedTrigger = undefined;
      if (next !== undefined) this.reload(next);
    }
  }
}
