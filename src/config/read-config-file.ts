import { readFile } from 'node:fs/promises';
import { ErrorCode, SpillwayError } from '../core/errors.js';

/**
 * How an error names a file it could not read: by what it is (`{ kind: 'limits file' }`:
 * `limits.yaml: cannot read limits file: <why>`), or by the flag that named it (`{ flag: 'tls-ca' }`:
 * `--tls-ca: cannot read ca.pem: <why>`, with `flag` in the details too).
 */
export type ConfigFileSource = { readonly kind: string } | { readonly flag: string };

/** A configuration file's text (UTF-8); a file-system failure is ERR_SPILLWAY_INVALID_CONFIG. */
export function readConfigFile(path: string, source: ConfigFileSource): Promise<string> {
  return readingConfigFile(path, source, () => readFile(path, 'utf8'));
}

/** A configuration file's bytes (a PEM); a file-system failure is ERR_SPILLWAY_INVALID_CONFIG. */
export function readConfigBytes(path: string, source: ConfigFileSource): Promise<Buffer> {
  return readingConfigFile(path, source, () => readFile(path));
}

/**
 * Runs `read`, the file-system steps of reading the configuration file at `path` (resolving a
 * link, then reading, say), and turns their failure into ERR_SPILLWAY_INVALID_CONFIG naming `path`
 * as `source` describes it, the failure as its cause. Details: `{ file }`, or `{ flag, file }`.
 */
export async function readingConfigFile<T>(
  path: string,
  source: ConfigFileSource,
  read: () => Promise<T>,
): Promise<T> {
  try {
    return await read();
  } catch (error) {
    const why = (error as Error).message;
    throw 'flag' in source
      ? new SpillwayError(
          ErrorCode.InvalidConfig,
          `--${source.flag}: cannot read ${path}: ${why}`,
          { flag: source.flag, file: path },
          { cause: error },
        )
      : new SpillwayError(
          ErrorCode.InvalidConfig,
          `${path}: cannot read ${source.kind}: ${why}`,
          { file: path },
          { cause: error },
        );
  }
}
