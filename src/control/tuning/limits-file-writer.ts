import { randomBytes } from 'node:crypto';
import { readFile, realpath, rename, stat, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { isMap, isScalar, isSeq, parseDocument, Scalar } from 'yaml';
import { type LimitsConfig, parseLimitsConfig } from '../../config/limits-config.js';
import { readingConfigFile } from '../../config/read-config-file.js';
import { ErrorCode, isSpillwayError, SpillwayError } from '../../core/errors.js';

/** A new limit for the exact-key rule `bucket`. */
export interface LimitChange {
  bucket: string;
  limitRps: number;
}

/**
 * Returns `text` with the `limitRps` of each changed key rule replaced, everything else (comments,
 * order, quoting, blank lines) kept: the edit goes through the `yaml` Document API, which rewrites
 * only the nodes it touched. The result is validated like any limits file; a change naming no key
 * rule throws ERR_SPILLWAY_INVALID_CONFIG and nothing is returned.
 */
export function updateLimitsText(
  text: string,
  changes: readonly LimitChange[],
  fileName = '<limits>',
): { text: string; config: LimitsConfig } {
  parseLimitsConfig(text, fileName);
  const doc = parseDocument(text, { keepSourceTokens: false });
  const buckets = isMap(doc.contents) ? doc.contents.get('buckets', true) : undefined;
  if (!isSeq(buckets)) throw invalid(fileName, 'has no buckets list');
  for (const change of changes) {
    if (!Number.isFinite(change.limitRps) || change.limitRps < 0) {
      throw invalid(
        fileName,
        `new limit for "${change.bucket}" must be a finite number >= 0, got ${change.limitRps}`,
      );
    }
    const rule = buckets.items.find(
      (item) => isMap(item) && isScalar(item.get('key', true)) && String(item.get('key')) === change.bucket,
    );
    if (!isMap(rule)) throw invalid(fileName, `has no rule with key "${change.bucket}"`);
    const node = rule.get('limitRps', true);
    if (isScalar(node)) node.value = change.limitRps;
    else rule.set('limitRps', new Scalar(change.limitRps));
  }
  const updated = doc.toString({ lineWidth: 0 });
  return { text: updated, config: parseLimitsConfig(updated, fileName) };
}

/**
 * Applies `changes` to the limits file at `path` atomically: the new text is written to a temporary
 * file in the same directory (same file system), flushed, then renamed over the original, so a
 * reader (the controller's file watcher) sees the old file or the new one, never half of one. The
 * original's permission bits are kept. A running controller reloads the file on its own.
 *
 * A symbolic link is written through: the file it points to is replaced, and the link stays (renamed
 * over, the link would become a copy that no longer follows its source). If the file changed between
 * the read and the write (an operator's edit), nothing is written: ERR_SPILLWAY_INVALID_CONFIG, and
 * the next run starts from the edited file.
 */
export async function writeLimitsFile(path: string, changes: readonly LimitChange[]): Promise<LimitsConfig> {
  const { target, text } = await readingConfigFile(path, { kind: 'limits file' }, async () => {
    const target = await realpath(path);
    return { target, text: await readFile(target, 'utf8') };
  });
  const { text: updated, config } = updateLimitsText(text, changes, path);
  if (updated === text) return config;
  const mode = (await stat(target)).mode & 0o777;
  const temporary = join(
    dirname(target),
    `.${basename(target)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`,
  );
  try {
    await writeFile(temporary, updated, { encoding: 'utf8', mode, flush: true });
    // Narrows the window for a lost edit to the rename itself; without a lock it cannot be closed.
    if ((await readFile(target, 'utf8')) !== text) {
      await unlink(temporary).catch(() => {});
      throw new SpillwayError(
        ErrorCode.InvalidConfig,
        `${path}: the limits file changed while tuning; nothing written (the next run reads the new file)`,
        { file: path },
      );
    }
    await rename(temporary, target);
  } catch (error) {
    if (isSpillwayError(error)) throw error;
    await unlink(temporary).catch(() => {});
    throw new SpillwayError(
      ErrorCode.InvalidConfig,
      `${path}: cannot write limits file: ${(error as Error).message}`,
      { file: path },
      { cause: error },
    );
  }
  return config;
}

function invalid(file: string, what: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidConfig, `${file}: ${what}`, { file });
}
