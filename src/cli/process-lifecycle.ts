import type { Logger } from '../ops/logger.js';

/**
 * Signals for long-running subcommands: SIGTERM and SIGINT ask for a graceful shutdown (a second
 * one exits at once), SIGHUP calls `onReload`. Resolves with the signal that asked to stop.
 *
 * A command that reloads calls this as it starts, before anything slow, so that a SIGHUP never
 * gets Node's default action, which ends the process: `onReload` returns whether it reloaded,
 * false while there is nothing to reload yet (startup), and a SIGHUP during the shutdown is logged and ignored, never
 * a kill in the middle of a drain. A SIGTERM during startup is answered once startup finishes.
 */
export function waitForShutdown(logger: Logger, onReload?: () => boolean): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    let stopping = false;
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) {
        logger.warn({ signal }, 'second signal: exiting now');
        process.exit(1);
      }
      stopping = true;
      logger.info({ signal }, 'shutting down');
      resolve(signal);
    };
    const reload = () => {
      if (stopping) {
        logger.warn({ signal: 'SIGHUP' }, 'SIGHUP while shutting down: ignored');
        return;
      }
      if (onReload?.() === false) logger.warn({ signal: 'SIGHUP' }, 'SIGHUP while starting: ignored');
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
    if (onReload) process.on('SIGHUP', reload);
  });
}

/** `waitForShutdown` for a command that reloads, installed before it has anything to reload. */
export interface ReloadableShutdown {
  /** Resolves with the signal that asked to stop. */
  stopRequested: Promise<NodeJS.Signals>;
  /** What a SIGHUP does from now on; until this is called it is logged and ignored. */
  reloadWith(reload: () => void): void;
}

/**
 * Signals first, as a command that reloads starts: a SIGHUP before its file is loaded must not
 * end the process.
 */
export function waitForShutdownOrReload(logger: Logger): ReloadableShutdown {
  let reloadOnSignal: (() => void) | undefined;
  const stopRequested = waitForShutdown(logger, () => {
    if (reloadOnSignal === undefined) return false;
    reloadOnSignal();
    return true;
  });
  return {
    stopRequested,
    reloadWith(reload) {
      reloadOnSignal = reload;
    },
  };
}

/**
 * Runs `close` (the graceful part) and bounds it: a shutdown that takes longer than `boundMs` is
 * logged and the process exits anyway, so an orchestrator's stop never hangs.
 */
export async function shutdownWithin(
  logger: Logger,
  boundMs: number,
  close: () => Promise<void>,
): Promise<void> {
  const guard = setTimeout(() => {
    logger.error({ boundMs }, 'graceful shutdown timed out: exiting');
    process.exit(1);
  }, boundMs);
  try {
    await close();
  } finally {
    clearTimeout(guard);
  }
  // Nothing should keep the loop alive now; if something does, do not wait for it forever.
  setTimeout(() => process.exit(process.exitCode ?? 0), 2_000).unref();
}
