/**
 * The last few reports accepted from one reporter, by sequence number and window end, to count a
 * retried report once (the protocol's idempotency rule). A retry is the same report: the same
 * sequence and the same window. A reporter restarted under the same id starts its sequence over at
 * 1 with newer windows, so its reports are news even while the old process's last sequences are
 * still listed here (matching on the sequence alone would drop them and keep the old process's
 * rate; docs/reliability.md, "Reports that arrive late"). A small window instead of "greater than
 * the last" so that a late retry of an older report is still recognised.
 */
export class RecentSequences {
  static readonly size = 4;
  readonly #sequences: bigint[] = [];
  readonly #windowEndsMs: bigint[] = [];

  has(sequence: bigint, windowEndMs: bigint): boolean {
    for (let i = 0; i < this.#sequences.length; i++) {
      if (this.#sequences[i] === sequence && this.#windowEndsMs[i] === windowEndMs) return true;
    }
    return false;
  }

  add(sequence: bigint, windowEndMs: bigint): void {
    // The same sequence from an earlier process under this id: that one's report is no longer the news.
    const index = this.#sequences.indexOf(sequence);
    if (index >= 0) {
      this.#sequences.splice(index, 1);
      this.#windowEndsMs.splice(index, 1);
    }
    if (this.#sequences.length >= RecentSequences.size) {
      this.#sequences.shift();
      this.#windowEndsMs.shift();
    }
    this.#sequences.push(sequence);
    this.#windowEndsMs.push(windowEndMs);
  }

  /** The most recently accepted sequence, or -1 when none. */
  get last(): bigint {
    return this.#sequences.length === 0 ? -1n : this.#sequences[this.#sequences.length - 1]!;
  }
}
