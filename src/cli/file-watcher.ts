import { type FSWatcher, watch } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';

export interface FileWatcher {
  close(): void;
}

/**
 * Calls `onChange` once things settle after `path` changes. Watches the file's directory, not the
 * file: editors and config-management tools replace files by rename, which ends a watch on the old
 * inode. Bursts of events (write + rename + chmod) within `debounceMs` make one call.
 */
export function watchFile(path: string, onChange: () => void, { debounceMs = 200 } = {}): FileWatcher {
  const absolute = resolve(path);
  const name = basename(absolute);
  let timer: NodeJS.Timeout | undefined;
  const watcher: FSWatcher = watch(dirname(absolute), { persistent: false }, (_event, changed) => {
    if (changed !== null && changed !== name) return;
    if (timer) clearTimeout(timer);
    timer = setTimeout(onChange, debounceMs);
  });
  // A deleted directory or exhausted watch descriptors must not crash the process; SIGHUP still works.
  watcher.on('error', () => watcher.close());
  return {
    close() {
      if (timer) clearTimeout(timer);
      watcher.close();
    },
  };
}
