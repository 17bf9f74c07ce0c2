/**
 * The controller generation an aggregator last heard from, for the `epoch` of its replies to its
 * children. A reply's epoch above 0 tells a host that a controller is answering now, so a bucket
 * it reported and got no directive for has no rule there (src/global/unknown-buckets.ts). So: the
 * newest epoch of the directives the host's buckets hold, as before, or the parent's when they hold
 * none; and 0 while no parent has answered for `freshForIntervals` forward intervals, when no
 * directive proves anything (cached ones would still be relayed until their TTL: they carry their
 * own epochs).
 */
export class ParentEpoch {
  #epoch = 0n;
  #heardAtMs = Number.NEGATIVE_INFINITY;

  constructor(private readonly freshForIntervals = 3) {}

  /** A parent replied, from controller generation `epoch` (0: a reply that names none). */
  heard(epoch: bigint, nowMs: number): void {
    if (epoch <= 0n) return;
    if (epoch > this.#epoch) this.#epoch = epoch;
    this.#heardAtMs = nowMs;
  }

  /** The epoch of a reply to a child whose buckets' directives have `newest` (0: none). */
  replyEpoch(newest: bigint, nowMs: number, intervalMs: number): bigint {
    if (nowMs - this.#heardAtMs > this.freshForIntervals * intervalMs) return 0n;
    return newest > 0n ? newest : this.#epoch;
  }
}
