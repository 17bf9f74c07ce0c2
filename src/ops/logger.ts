import { type DestinationStream, type Logger, pino } from 'pino';
import { ErrorCode, SpillwayError } from '../core/errors.js';

export type { Logger } from 'pino';

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export interface LoggerOptions {
  /** Default `info`. */
  level?: LogLevel;
  component: string;
  id: string;
  /** Default: stdout, written synchronously (a process's last lines before exit are not lost). */
  destination?: DestinationStream;
}

/**
 * Structured logs: one JSON object per line (pino), with `component` and `id` on every line and
 * `time` in epoch ms. Control-plane processes log a few lines a second at most, so synchronous
 * writes cost nothing and keep the order of lines with other output.
 */
export function createLogger(options: LoggerOptions): Logger {
  return pino(
    {
      level: options.level ?? 'info',
      base: { component: options.component, id: options.id, pid: process.pid },
      formatters: { level: (label) => ({ level: label }) },
    },
    options.destination ?? pino.destination({ dest: 1, sync: true }),
  );
}

export function parseLogLevel(value: string): LogLevel {
  if ((LOG_LEVELS as readonly string[]).includes(value)) return value as LogLevel;
  throw new SpillwayError(
    ErrorCode.InvalidUsage,
    `--log-level must be one of ${LOG_LEVELS.join(', ')}, got '${value}'`,
    {
      field: 'log-level',
    },
  );
}

/**
 * The one line every process prints once it accepts traffic, whatever `--log-level` says: tools and
 * tests read the bound addresses from it (`{"msg":"listening","grpc":"127.0.0.1:43123","ops":...}`).
 */
export function logListening(logger: Logger, fields: Record<string, unknown>): void {
  const level = logger.level === 'silent' ? 'silent' : 'info';
  logger.child({}, { level }).info(fields, 'listening');
}
