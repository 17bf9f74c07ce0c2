import { readlinkSync } from 'node:fs';
import { setPriority } from 'node:os';

/** Nice values a thread may lower itself to: 0 (unchanged) to 19 (runs only on CPU time others leave). */
export const MIN_THREAD_NICE = 0;
export const MAX_THREAD_NICE = 19;

/** What {@link lowerThreadPriority} did. */
export type ThreadPriority =
  | { lowered: true; tid: number; nice: number }
  | { lowered: false; reason: string };

/**
 * Raises the calling thread's nice value to `nice`, this thread alone, so that the scheduler gives
 * the CPU to every normal thread first (the process's request thread, its neighbours) when they
 * compete for it; with a CPU to spare, this thread runs as before.
 *
 * Linux only. Under Linux's thread implementation the nice value belongs to each thread, and
 * setpriority(PRIO_PROCESS, tid) changes that thread alone (setpriority(2), NOTES); `os.setPriority`
 * passes its pid argument straight to setpriority, and `/proc/thread-self` names the calling
 * thread. Elsewhere the same call would change the whole process, so nothing is done.
 *
 * Threads this thread creates afterwards inherit the value. Call it only on a thread that creates
 * none (libuv's pool belongs to the process: start it before, see control-client-worker.ts).
 * Lowering a priority needs no privilege; raising it back does, so the value holds for the thread's
 * life. Never throws: what went wrong is in `reason`.
 */
export function lowerThreadPriority(nice: number): ThreadPriority {
  if (nice === MIN_THREAD_NICE) return { lowered: false, reason: 'nice 0 asked for' };
  if (process.platform !== 'linux') {
    return { lowered: false, reason: `per-thread priority is Linux only (this is ${process.platform})` };
  }
  try {
    // "<pid>/task/<tid>"
    const tid = Number(readlinkSync('/proc/thread-self').split('/').pop());
    if (!Number.isSafeInteger(tid) || tid <= 0) {
      return { lowered: false, reason: '/proc/thread-self did not name a thread' };
    }
    setPriority(tid, nice);
    return { lowered: true, tid, nice };
  } catch (error) {
    return { lowered: false, reason: error instanceof Error ? error.message : String(error) };
  }
}
