/**
 * Whether the upstream answers, as the proxy last found it: `failing` from a request the upstream
 * refused, reset or did not answer in time (the proxy's `502` / `504`) until the upstream next
 * sends response headers. `/healthz` reports it (`status: degraded`, with the reason), and the
 * failures are logged: the first of a streak at once, then at most one line per `logIntervalMs`
 * with how many came since, and one line when the upstream answers again. A proxy answering 502s
 * in silence looks healthy to everything that watches it.
 */
export interface UpstreamFailure {
  status: number;
  outcome: string;
  message: string;
}

export interface UpstreamHealthReport {
  state: 'ok' | 'failing';
  /** The last failure's message (`upstream refused the connection (ECONNREFUSED)`), while failing. */
  reason: string | null;
  /** Requests failed in a row. */
  consecutiveFailures: number;
  /** When the streak began (epoch ms), while failing. */
  failingSinceMs: number | null;
}

export interface UpstreamHealthLogger {
  warn(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
}

const DEFAULT_LOG_INTERVAL_MS = 10_000;

export class UpstreamHealth {
  readonly #logger: UpstreamHealthLogger | undefined;
  readonly #nowMs: () => number;
  readonly #logIntervalMs: number;
  #consecutiveFailures = 0;
  #reason: string | null = null;
  #failingSinceMs: number | null = null;
  #lastLogMs = Number.NEGATIVE_INFINITY;
  /** Failures since the last line logged. */
  #unlogged = 0;

  constructor(
    logger: UpstreamHealthLogger | undefined,
    nowMs: () => number = Date.now,
    logIntervalMs = DEFAULT_LOG_INTERVAL_MS,
  ) {
    this.#logger = logger;
    this.#nowMs = nowMs;
    this.#logIntervalMs = logIntervalMs;
  }

  /** The proxy answered a request with `failure` because of the upstream. */
  failed(failure: UpstreamFailure): void {
    const nowMs = this.#nowMs();
    if (this.#consecutiveFailures === 0) this.#failingSinceMs = nowMs;
    this.#consecutiveFailures++;
    this.#reason = failure.message;
    this.#unlogged++;
    if (this.#consecutiveFailures > 1 && nowMs - this.#lastLogMs < this.#logIntervalMs) return;
    this.#logger?.warn(
      {
        status: failure.status,
        outcome: failure.outcome,
        err: failure.message,
        failures: this.#unlogged,
        consecutiveFailures: this.#consecutiveFailures,
      },
      `proxy: the upstream is failing: ${failure.message}; answered ${failure.status}`,
    );
    this.#lastLogMs = nowMs;
    this.#unlogged = 0;
  }

  /** The upstream sent response headers. */
  answered(): void {
    if (this.#consecutiveFailures === 0) return;
    this.#logger?.info(
      {
        consecutiveFailures: this.#consecutiveFailures,
        failingForMs: this.#nowMs() - (this.#failingSinceMs ?? 0),
      },
      'proxy: the upstream answers again',
    );
    this.#consecutiveFailures = 0;
    this.#reason = null;
    this.#failingSinceMs = null;
    this.#unlogged = 0;
    this.#lastLogMs = Number.NEGATIVE_INFINITY;
  }

  report(): UpstreamHealthReport {
    return {
      state: this.#consecutiveFailures > 0 ? 'failing' : 'ok',
      reason: this.#reason,
      consecutiveFailures: this.#consecutiveFailures,
      failingSinceMs: this.#failingSinceMs,
    };
  }
}
