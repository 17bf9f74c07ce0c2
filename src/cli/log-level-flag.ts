import { createLogger, type Logger, parseLogLevel } from '../ops/logger.js';
import { type FlagSpec, type FlagValues, stringFlag } from './command-line.js';

/** `--log-level`, for every long-running command. */
export const LOG_LEVEL_FLAG: Record<string, FlagSpec> = {
  'log-level': {
    type: 'string',
    valueName: 'level',
    description: 'fatal|error|warn|info|debug|trace|silent',
    defaultText: 'info',
  },
};

/** The process's logger at `--log-level` (default info); ERR_SPILLWAY_INVALID_USAGE for another level. */
export function loggerFromFlags(values: FlagValues, component: string, id: string): Logger {
  return createLogger({
    component,
    id,
    level: parseLogLevel(stringFlag(values, 'log-level') ?? 'info'),
  });
}
