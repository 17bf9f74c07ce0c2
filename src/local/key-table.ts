/**
 * The bounded key → slot index behind the keyed local limiters. Limiters keep their per-key numbers
 * in typed arrays indexed by slot, so a decision on a known key is one `Map.get` plus array reads
 * and writes: no object per key, nothing allocated per call.
 *
 * Memory bound: never more than `maxKeys` keys. Slots are reclaimed in three ways, cheapest first:
 * - expiry: an entry whose bucket would be full again is equivalent to a missing one, so dropping
 *   it loses nothing (`SlotStore.isExpired`); each insert checks two slots ahead of the clock hand,
 *   so dead keys drain away as new ones arrive, with no timer;
 * - growth: arrays double up to `maxKeys`, so a small tenant set costs little;
 * - eviction when full: the CLOCK (second chance) policy. A key touched since the hand last passed
 *   it is spared once; a new key starts unmarked, so a flood of one-off keys evicts itself, not the
 *   hot keys. Before a live (not full) entry is evicted, the next `EXPIRED_LOOKAHEAD` slots are
 *   checked for an expired one to take instead; past that, a live entry can be evicted while an
 *   expired one waits further round (the sweep reaches it later). Evicting a live entry forgets
 *   its debt — the price of a hard bound under hostile cardinality, with a bounded cost per
 *   insert — and is counted in `evictions`.
 */
export interface SlotStore {
  /** Reallocate the per-slot arrays to `slotCapacity` slots, keeping the values of existing slots. */
  resize(slotCapacity: number): void;
  /** Whether the entry in `slot` can be dropped at `nowMs` without losing state worth keeping. */
  isExpired(slot: number, nowMs: number): boolean;
}

const INITIAL_SLOTS = 1024;
const SWEEP_PER_INSERT = 2;
/** Before evicting a live key, this many slots ahead of the hand are checked for an expired one. */
const EXPIRED_LOOKAHEAD = 8;

export class KeyTable {
  readonly index = new Map<string, number>();
  /** Set to 1 by the limiter on each touch of a slot; cleared by the eviction hand. */
  referenced: Uint8Array;
  /** Live entries dropped by eviction (not by expiry) because the table was full. */
  evictions = 0;
  private keys: (string | undefined)[];
  private readonly freeSlots: number[] = [];
  private slotCapacity: number;
  private used = 0;
  private hand = 0;

  constructor(
    readonly maxKeys: number,
    private readonly store: SlotStore,
  ) {
    this.slotCapacity = Math.min(maxKeys, INITIAL_SLOTS);
    this.referenced = new Uint8Array(this.slotCapacity);
    this.keys = new Array<string | undefined>(this.slotCapacity).fill(undefined);
    store.resize(this.slotCapacity);
  }

  get size(): number {
    return this.index.size;
  }

  /** A slot for a key not in the table; the caller initialises its state. */
  insert(key: string, nowMs: number): number {
    this.sweep(nowMs, SWEEP_PER_INSERT);
    let slot: number;
    if (this.freeSlots.length > 0) {
      slot = this.freeSlots.pop()!;
    } else if (this.used < this.slotCapacity) {
      slot = this.used++;
    } else if (this.slotCapacity < this.maxKeys) {
      this.grow();
      slot = this.used++;
    } else {
      slot = this.evict(nowMs);
    }
    this.keys[slot] = key;
    this.referenced[slot] = 0;
    this.index.set(key, slot);
    return slot;
  }

  delete(key: string): boolean {
    const slot = this.index.get(key);
    if (slot === undefined) return false;
    this.release(slot);
    return true;
  }

  /** Drop every expired entry now; returns how many. O(table size). */
  prune(nowMs: number): number {
    let dropped = 0;
    for (let slot = 0; slot < this.used; slot++) {
      if (this.keys[slot] !== undefined && this.store.isExpired(slot, nowMs)) {
        this.release(slot);
        dropped++;
      }
    }
    return dropped;
  }

  private sweep(nowMs: number, steps: number): void {
    for (let step = 0; step < steps && step < this.used; step++) {
      const slot = this.advanceHand();
      if (this.keys[slot] !== undefined && this.store.isExpired(slot, nowMs)) this.release(slot);
    }
  }

  /** Only called when every slot up to `maxKeys` is occupied. Ends within two turns of the hand. */
  private evict(nowMs: number): number {
    for (;;) {
      const slot = this.advanceHand();
      if (this.store.isExpired(slot, nowMs)) {
        this.index.delete(this.keys[slot]!);
        return slot;
      }
      if (this.referenced[slot] === 0) {
        const expired = this.expiredAhead(nowMs);
        if (expired !== undefined) {
          this.index.delete(this.keys[expired]!);
          return expired;
        }
        this.index.delete(this.keys[slot]!);
        this.evictions++;
        return slot;
      }
      this.referenced[slot] = 0;
    }
  }

  /** An expired slot among the next few from the hand (all occupied: called from `evict`). */
  private expiredAhead(nowMs: number): number | undefined {
    let slot = this.hand;
    for (let i = 0; i < EXPIRED_LOOKAHEAD && i < this.used; i++) {
      if (this.store.isExpired(slot, nowMs)) return slot;
      slot = slot + 1 >= this.used ? 0 : slot + 1;
    }
    return undefined;
  }

  private advanceHand(): number {
    const slot = this.hand;
    this.hand = slot + 1 >= this.used ? 0 : slot + 1;
    return slot;
  }

  private release(slot: number): void {
    this.index.delete(this.keys[slot]!);
    this.keys[slot] = undefined;
    this.referenced[slot] = 0;
    this.freeSlots.push(slot);
  }

  private grow(): void {
    const slotCapacity = Math.min(this.maxKeys, this.slotCapacity * 2);
    const referenced = new Uint8Array(slotCapacity);
    referenced.set(this.referenced);
    this.referenced = referenced;
    for (let slot = this.slotCapacity; slot < slotCapacity; slot++) this.keys.push(undefined);
    this.store.resize(slotCapacity);
    this.slotCapacity = slotCapacity;
  }
}

/** Copy of `source` in a new array of `length` (for `SlotStore.resize`). */
export function resizeFloat64(source: Float64Array, length: number): Float64Array<ArrayBuffer> {
  const resized = new Float64Array(length);
  resized.set(source.subarray(0, Math.min(source.length, length)));
  return resized;
}
