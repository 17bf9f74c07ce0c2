/**
 * Preloaded (`node --import`) into every process `spillway demo` starts. The demo holds each
 * child's standard input open; if the demo dies without stopping its children (SIGKILL, a crash),
 * that pipe closes and the child stops itself as if sent SIGTERM, so no orphan keeps running.
 * The handle is unref'd: it never keeps a process alive on its own.
 */
const stopSelf = () => process.kill(process.pid, 'SIGTERM');
process.stdin.once('end', stopSelf);
process.stdin.once('error', stopSelf);
process.stdin.resume();
(process.stdin as { unref?: () => void }).unref?.();

export {};
