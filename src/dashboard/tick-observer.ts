import type { Scheduler } from '../core/clock.js';

/**
 * A scheduler that calls `afterTimer` after each timer it runs. The controller's only timer is its
 * tick, so this tells the dashboard "a tick just happened" without the controller knowing about
 * dashboards and without polling snapshots; the dashboard still dedupes by the controller's tick
 * count, so an extra timer would cost one snapshot, never a duplicate event.
 */
export function observeTimers(scheduler: Scheduler, afterTimer: () => void): Scheduler {
  return {
    nowMs: () => scheduler.nowMs(),
    setTimeout(fn, delayMs) {
      return scheduler.setTimeout(() => {
        fn();
        afterTimer();
      }, delayMs);
    },
  };
}
