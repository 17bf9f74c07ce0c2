/**
 * The slice of a structured logger the control plane uses (pino's `logger.warn(fields, message)`
 * fits). Control-plane components log state changes only, never per report, so a flood of bad
 * reports cannot flood the log.
 */
export interface ControlLogger {
  info(fields: Record<string, unknown>, message: string): void;
  warn(fields: Record<string, unknown>, message: string): void;
}

export const silentLogger: ControlLogger = {
  info: () => {},
  warn: () => {},
};
