import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type ConnectionWaiter, UpstreamQueue } from '../../src/http/proxy/upstream-queue.js';

// The queue for pooled upstream connections on its own: order, the cap, the sweep of entries that
// gave up, and no overtaking while a freed connection is handed to the queue.

class Turn implements ConnectionWaiter {
  queued = false;
  wanted = true;
  constructor(
    private readonly queue: UpstreamQueue,
    readonly name: string,
    private readonly served: string[],
  ) {}
  connectionFree(): void {
    this.queue.take();
    this.served.push(this.name);
  }
  giveUp(): void {
    this.wanted = false;
    if (this.queued) this.queue.abandon();
  }
}

const microtasks = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('UpstreamQueue', () => {
  it('serves waiting entries first in first out as connections are given back, skipping those that gave up', async () => {
    const queue = new UpstreamQueue(1);
    const served: string[] = [];
    assert.equal(queue.hasRoom(), true);
    queue.take();
    const [a, b, c] = ['a', 'b', 'c'].map((name) => new Turn(queue, name, served));
    for (const turn of [a!, b!, c!]) queue.wait(turn);
    assert.equal(queue.depth, 3);
    assert.equal(queue.isFull(3), true);
    assert.equal(queue.isFull(4), false);
    b!.giveUp();
    assert.equal(queue.depth, 2);
    queue.release();
    await microtasks();
    assert.deepEqual(served, ['a']);
    queue.release();
    await microtasks();
    assert.deepEqual(served, ['a', 'c'], 'b gave up and is skipped');
    assert.deepEqual([queue.depth, queue.held], [0, 0]);
  });

  it('lets no newcomer overtake the queue while a freed connection is on its way to it', async () => {
    const queue = new UpstreamQueue(1);
    const served: string[] = [];
    queue.take();
    queue.wait(new Turn(queue, 'queued', served));
    queue.release();
    // The connection is free, but the queue is served a microtask later: it goes first.
    assert.equal(queue.hasRoom(), false);
    await microtasks();
    assert.deepEqual(served, ['queued']);
  });

  it('sweeps out entries that gave up once they are half of it', () => {
    const queue = new UpstreamQueue(1);
    queue.take();
    const turns = Array.from({ length: 200 }, (_, i) => new Turn(queue, String(i), []));
    for (const turn of turns) queue.wait(turn);
    for (const turn of turns.slice(0, 99)) turn.giveUp();
    assert.equal(queue.held, 200, 'fewer than half gave up: kept until their turn');
    turns[99]!.giveUp();
    assert.deepEqual([queue.depth, queue.held], [100, 100]);
    assert.equal(turns[0]!.queued, false);
    assert.equal(turns[150]!.queued, true);
  });
});
