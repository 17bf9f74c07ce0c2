/**
 * Where the dashboard's "tuning suggestions" come from. The tuning engine (src/control/tuning/)
 * implements this; without one the dashboard says so and lists nothing.
 */
export interface TuningSuggestion {
  /** Stable while the suggestion stands: accepting names it. */
  id: string;
  /** The rule (key or template) whose limit would change. */
  rule: string;
  currentLimitRps: number;
  suggestedLimitRps: number;
  /** One sentence an operator can check, e.g. "p99.9 of 14 days of per-minute peaks x 1.2". */
  reason: string;
}

export interface TuningSource {
  /** Shown on the page ("peaks quantile", ...). */
  readonly name: string;
  suggestions(): TuningSuggestion[] | Promise<TuningSuggestion[]>;
  /** Told after the dashboard applied a suggestion, so the engine can stop proposing it. */
  accepted?(id: string): void;
}
