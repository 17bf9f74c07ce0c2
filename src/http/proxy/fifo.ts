/**
 * A FIFO read from a moving head, compacted once the consumed part is most of it: no allocation
 * per push or shift while the array has room.
 */
export class Fifo<T> {
  private items: (T | undefined)[] = [];
  private head = 0;

  get length(): number {
    return this.items.length - this.head;
  }

  push(item: T): void {
    this.items.push(item);
  }

  shift(): T | undefined {
    if (this.head === this.items.length) return undefined;
    const item = this.items[this.head];
    this.items[this.head++] = undefined;
    if (this.head === this.items.length) {
      this.items.length = 0;
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return item;
  }

  /** Keeps only the items `keep` accepts, in order; `dropped` sees each one removed. */
  retain(keep: (item: T) => boolean, dropped: (item: T) => void): void {
    const kept: (T | undefined)[] = [];
    for (let i = this.head; i < this.items.length; i++) {
      const item = this.items[i] as T;
      if (keep(item)) kept.push(item);
      else dropped(item);
    }
    this.items = kept;
    this.head = 0;
  }
}
