import { isMainThread } from 'node:worker_threads';

/**
 * Preloaded (`node --import`) into every process `spillway demo` starts. The demo holds each
 * child's standard input open; if the demo dies without stopping its children (SIGKILL, a crash),
 * that pipe closes and the child stops itself as if sent SIGTERM, so no orphan keeps running.
 * The handle is unref'd: it never keeps a process alive on its own.
 *
 * Main thread only: Node runs `--import` preloads in worker threads too (the proxy's report client
 * is one, loaded from a file when built), and a worker's `process.stdin` is empty and ends at once:
 * watched there, it stopped the whole process seconds after `npm start`.
 */
if (isMainThread) {
  const stopSelf = () => process.kill(process.pid, 'SIGTERM');
  process.stdin.once('end', stopSelf);
  process.stdin.once('error', stopSelf);
  process.stdin.resume();
  (process.stdin as { unref?: () => void }).unref?.();
}
