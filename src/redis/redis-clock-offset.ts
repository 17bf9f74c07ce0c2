/**
 * Where the Redis clock stands relative to the local one, learned from script replies, so that a
 * call can carry its deadline in Redis time and the script can skip a call that reaches Redis after
 * its caller was already answered (a paused Redis running its socket backlog on resume).
 *
 * Each reply is a sample: the call was sent at local time `s`, the script read Redis TIME `T`, the
 * reply was seen at local time `r`. With `offset = Redis clock - local clock`, the script ran
 * between send and receipt, so `T - r <= offset <= T - s`.
 *
 * The estimate is `max(T - r) + min(r - s)` over recent samples. For one Redis clock it is never
 * below the true offset: the sample k with the shortest round trip gives
 * `offset <= T_k - s_k = (T_k - r_k) + (r_k - s_k) <= max(T - r) + min(r - s)`. Every source of
 * error (a reply handled late by a busy event loop, a send recorded before the bytes left) widens a
 * round trip or lowers `T - r`, so it only makes the estimate higher. Too high only lets a call that
 * reached Redis a little after its caller gave up still count, as every call did before deadlines;
 * too low would skip a call whose caller is still waiting, which the limiter then retries once.
 *
 * Several clocks (Redis Cluster nodes, a replica promoted on another host): `max(T - r)` follows the
 * latest clock from its first reply on. Samples age out after one to two `windowMs`, so a Redis clock
 * stepped back, or running slower than the local monotonic clock, stops inflating the estimate.
 * Drift within the window (NTP slews at most 0.5 ms/s) is what `marginMs` is for.
 */
export class RedisClockOffset {
  readonly #windowMs: number;
  readonly #marginMs: number;
  /** Samples received from `#windowStartMs` on, and those of the window before it. */
  #windowStartMs = Number.NEGATIVE_INFINITY;
  #currentLowMax = Number.NEGATIVE_INFINITY;
  #currentRttMin = Number.POSITIVE_INFINITY;
  #previousLowMax = Number.NEGATIVE_INFINITY;
  #previousRttMin = Number.POSITIVE_INFINITY;
  #offsetMs: number | undefined;

  constructor(options: { windowMs?: number; marginMs?: number } = {}) {
    this.#windowMs = options.windowMs ?? 10_000;
    this.#marginMs = options.marginMs ?? 5;
  }

  /** One reply: sent at local `sentMs`, Redis TIME `serverMs` (epoch ms), seen at local `receivedMs`. */
  observe(sentMs: number, serverMs: number, receivedMs: number): void {
    const rttMs = receivedMs - sentMs;
    if (!(rttMs >= 0) || !Number.isFinite(serverMs) || !Number.isFinite(receivedMs)) return;
    if (receivedMs - this.#windowStartMs >= this.#windowMs) {
      const stale = receivedMs - this.#windowStartMs >= 2 * this.#windowMs;
      this.#previousLowMax = stale ? Number.NEGATIVE_INFINITY : this.#currentLowMax;
      this.#previousRttMin = stale ? Number.POSITIVE_INFINITY : this.#currentRttMin;
      this.#currentLowMax = Number.NEGATIVE_INFINITY;
      this.#currentRttMin = Number.POSITIVE_INFINITY;
      this.#windowStartMs = receivedMs;
    }
    const lowMs = serverMs - receivedMs;
    if (lowMs > this.#currentLowMax) this.#currentLowMax = lowMs;
    if (rttMs < this.#currentRttMin) this.#currentRttMin = rttMs;
    this.#offsetMs =
      Math.max(this.#currentLowMax, this.#previousLowMax) +
      Math.min(this.#currentRttMin, this.#previousRttMin);
  }

  /** An upper bound on Redis clock minus local clock, in ms; undefined before the first sample. */
  get offsetMs(): number | undefined {
    return this.#offsetMs;
  }

  /**
   * The Redis-time deadline (whole epoch ms, rounded up) for a call whose caller stops waiting at
   * local `localDeadlineMs`, or 0 (no deadline) while no reply has shown the Redis clock. Kept
   * when samples stop coming (Redis unreachable): the last estimate is the best one there is.
   */
  serverDeadlineMs(localDeadlineMs: number): number {
    if (this.#offsetMs === undefined) return 0;
    return Math.ceil(localDeadlineMs + this.#offsetMs + this.#marginMs);
  }
}
