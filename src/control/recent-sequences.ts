/**
 * The last few report sequence numbers accepted from one reporter, to count a retried report once
 * (the protocol's idempotency rule). A small window instead of "greater than the last" so that a
 * reporter that restarts at sequence 1 is accepted again after a few reports at most, and a late
 * retry of an older report is still recognised.
 */
export class RecentSequences {
  static readonly size = 4;
  readonly #values: bigint[] = [];

  has(sequence: bigint): boolean {
    return this.#values.includes(sequence);
  }

  add(sequence: bigint): void {
    if (this.#values.length >= RecentSequences.size) this.#values.shift();
    this.#values.push(sequence);
  }

  /** The most recently accepted sequence, or -1 when none. */
  get last(): bigint {
    return this.#values.length === 0 ? -1n : this.#values[this.#values.length - 1]!;
  }
}
