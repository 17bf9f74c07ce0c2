import { type FSWatcher, watch } from 'node:fs';
import { dirname, resolve } from 'node:path';

export interface FileWatcher {
  close(): void;
}

/**
 * Calls `onChange` once things settle after anything in `path`'s directory changes: the caller
 * reads the file and ignores content it already has. Watches the directory, not the file: editors
 * and config-management tools replace files by rename, which ends a watch on the old inode. And
 * not only events naming the file: Kubernetes updates a mounted ConfigMap by swapping the
 * directory's `..data` symlink, and the only events then name `..data` and `..data_tmp`, never
 * the file, whose path goes through that symlink. Bursts of events (write + rename + chmod)
 * within `debounceMs` make one call. `onError`: the watch failed and stopped (a deleted
 * directory, exhausted watch descriptors); it never throws.
 */
export function watchFile(
  path: string,
  onChange: () => void,
  { debounceMs = 200, onError }: { debounceMs?: number; onError?: (error: Error) => void } = {},
): FileWatcher {
  const absolute = resolve(path);
  let timer: NodeJS.Timeout | undefined;
  const watcher: FSWatcher = watch(dirname(absolute), { persistent: false }, () => {
    if (timer) clearTimeout(timer);
    timer = setTimeout(onChange, debounceMs);
  });
  watcher.on('error', (error) => {
    watcher.close();
    onError?.(error);
  });
  return {
    close() {
      if (timer) clearTimeout(timer);
      watcher.close();
    },
  };
}
