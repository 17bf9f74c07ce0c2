import type { Clock } from '../core/clock.js';
import { keyFamily } from '../protocol/key-family.js';
import type { ControlLogger } from './control-logger.js';

/**
 * Logs bucket keys reported to the controller that match no rule of its limits file: they get no
 * directive, so nothing limits them. At most one line per key family (`payments:caller=*`, see
 * key-family.ts) per `logIntervalMs`, with one example key and how many reports named the family
 * since its last line, so a host sending a thousand such keys a second costs a line a minute.
 *
 * Memory: at most `maxFamilies` families; past it, families not logged for an interval are
 * dropped to make room, and until there is room new families are only counted (`unlogged`).
 */
export interface UnknownBucketLogOptions {
  logger: ControlLogger;
  clock: Clock;
  /** Who logs (the controller's id). */
  controllerId: string;
  /** Default 60 s. */
  logIntervalMs?: number;
  /** Default 1,000. */
  maxFamilies?: number;
}

interface FamilyEntry {
  lastLogMs: number;
  /** Reports that named a key of the family since its last line. */
  since: number;
}

export const DEFAULT_UNKNOWN_LOG_INTERVAL_MS = 60_000;
const DEFAULT_MAX_FAMILIES = 1_000;

export class UnknownBucketLog {
  readonly #options: UnknownBucketLogOptions;
  readonly #logIntervalMs: number;
  readonly #maxFamilies: number;
  readonly #families = new Map<string, FamilyEntry>();
  /** Keys of families that found no room (the table was full of recently logged ones). */
  #unlogged = 0;

  constructor(options: UnknownBucketLogOptions) {
    this.#options = options;
    this.#logIntervalMs = options.logIntervalMs ?? DEFAULT_UNKNOWN_LOG_INTERVAL_MS;
    this.#maxFamilies = options.maxFamilies ?? DEFAULT_MAX_FAMILIES;
  }

  /** Reports that named a key of a family with no room to be logged, cumulative. */
  get unlogged(): number {
    return this.#unlogged;
  }

  /** A report named `key`, which matches no rule. */
  note(key: string): void {
    const family = keyFamily(key);
    const nowMs = this.#options.clock.nowMs();
    let entry = this.#families.get(family);
    if (entry === undefined) {
      if (this.#families.size >= this.#maxFamilies && !this.#makeRoom(nowMs)) {
        this.#unlogged++;
        return;
      }
      entry = { lastLogMs: Number.NEGATIVE_INFINITY, since: 0 };
      this.#families.set(family, entry);
    }
    entry.since++;
    if (nowMs - entry.lastLogMs < this.#logIntervalMs) return;
    this.#options.logger.warn(
      {
        controller: this.#options.controllerId,
        family,
        example: key,
        reports: entry.since,
        logIntervalMs: this.#logIntervalMs,
      },
      'control: a reported bucket key matches no rule of the limits file; it gets no directive and is not limited (add a rule, e.g. a template, or fix the key)',
    );
    entry.lastLogMs = nowMs;
    entry.since = 0;
  }

  /** The limits changed: a family that now has a rule is forgotten; one that still has none logs again. */
  clear(): void {
    this.#families.clear();
  }

  #makeRoom(nowMs: number): boolean {
    for (const [family, entry] of this.#families) {
      if (nowMs - entry.lastLogMs >= this.#logIntervalMs) this.#families.delete(family);
    }
    return this.#families.size < this.#maxFamilies;
  }
}
