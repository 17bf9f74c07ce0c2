// The Redis clock estimate behind each call's deadline, on hand-made samples: an upper bound on the
// true offset for one Redis clock (so no on-time call is skipped), tight to the shortest round trip,
// not loosened by late replies, following a second clock or a step forward, forgetting a step back.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { RedisClockOffset } from '../../src/redis/redis-clock-offset.js';

const T0 = 1_700_000_000_000;
const WINDOW_MS = 10_000;
const MARGIN_MS = 5;
/** Epoch milliseconds near 1.7e12 are doubles with steps of about 0.0002 ms. */
const EPSILON_MS = 0.001;

function assertNear(actualMs: number | undefined, expectedMs: number, context = ''): void {
  assert.ok(
    actualMs !== undefined && Math.abs(actualMs - expectedMs) < EPSILON_MS,
    `${context} ${actualMs} is not ${expectedMs}`,
  );
}

/** A call sent at local `sentMs` that reached Redis `sendLegMs` later and came back `returnLegMs` after that. */
function sample(
  clock: RedisClockOffset,
  offsetMs: number,
  sentMs: number,
  sendLegMs: number,
  returnLegMs: number,
): void {
  clock.observe(sentMs, sentMs + sendLegMs + offsetMs, sentMs + sendLegMs + returnLegMs);
}

/** Deterministic [0, 1) numbers (a 32-bit LCG), so a failure replays. */
function lcg(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1_664_525) + 1_013_904_223) >>> 0;
    return state / 2 ** 32;
  };
}

describe('RedisClockOffset', () => {
  it('knows nothing before the first reply: no deadline (0)', () => {
    const clock = new RedisClockOffset();
    assert.equal(clock.offsetMs, undefined);
    assert.equal(clock.serverDeadlineMs(T0 + 100), 0);
  });

  it('one sample: an upper bound, above the truth by the send leg at most; the deadline adds the margin, rounded up', () => {
    const clock = new RedisClockOffset();
    // Redis 1 s ahead; the script ran 0.3 ms after the send, the reply came 0.2 ms after that.
    sample(clock, 1_000, T0, 0.3, 0.2);
    assertNear(clock.offsetMs, 1_000.3);
    assert.equal(clock.serverDeadlineMs(T0 + 100.25), T0 + 1_106);
  });

  it('many samples, any delays, late replies of a pause included: never below the true offset, above it by no more than the shortest round trip', () => {
    const random = lcg(42);
    for (const offsetMs of [-3_600_000, -0.7, 0, 12.25, 86_400_000]) {
      const clock = new RedisClockOffset();
      let nowMs = T0;
      let shortestRttMs = Number.POSITIVE_INFINITY;
      for (let i = 0; i < 5_000; i++) {
        nowMs += random() * 5;
        // Mostly sub-millisecond legs; now and then a busy event loop (tens of ms) or a reply
        // from before a 2 s pause (the send leg is the pause).
        const heavy = () => (random() < 0.05 ? random() * 50 : random() * 0.5);
        const sendLegMs = random() < 0.01 ? 2_000 : heavy();
        const returnLegMs = heavy();
        sample(clock, offsetMs, nowMs, sendLegMs, returnLegMs);
        shortestRttMs = Math.min(shortestRttMs, sendLegMs + returnLegMs);
        assert.ok(clock.offsetMs! >= offsetMs - EPSILON_MS, `sample ${i}: ${clock.offsetMs} < ${offsetMs}`);
        assert.ok(
          clock.offsetMs! <= offsetMs + shortestRttMs + EPSILON_MS,
          `sample ${i}: ${clock.offsetMs} over ${offsetMs} + ${shortestRttMs}`,
        );
      }
    }
  });

  it('two Redis clocks (Cluster nodes 3 ms apart): the estimate follows the later one', () => {
    const clock = new RedisClockOffset();
    for (let i = 0; i < 20; i++) sample(clock, 1_000, T0 + i * 10, 0.2, 0.2);
    assert.ok(clock.offsetMs! < 1_000.5, `${clock.offsetMs}`);
    sample(clock, 1_003, T0 + 300, 0.2, 0.2);
    assert.ok(clock.offsetMs! >= 1_003, `${clock.offsetMs}`);
    // More replies from the earlier clock do not pull it back down.
    for (let i = 0; i < 20; i++) sample(clock, 1_000, T0 + 400 + i * 10, 0.2, 0.2);
    assert.ok(clock.offsetMs! >= 1_003, `${clock.offsetMs}`);
  });

  it('a Redis clock stepped forward: the first reply after the step corrects the deadline', () => {
    const clock = new RedisClockOffset();
    for (let i = 0; i < 100; i++) sample(clock, 0, T0 + i * 10, 0.1, 0.1);
    // The step: 60 s ahead. The reply has a longer round trip than the old samples' shortest, so
    // the estimate may fall short of the new offset by the difference; the margin covers it.
    sample(clock, 60_000, T0 + 1_000, 0.5, 0.4);
    assert.ok(clock.offsetMs! >= 60_000 - 0.7, `${clock.offsetMs}`);
    const callerDeadlineMs = T0 + 1_100;
    assert.ok(clock.serverDeadlineMs(callerDeadlineMs) >= callerDeadlineMs + 60_000, `${clock.offsetMs}`);
  });

  it('a Redis clock stepped back: the estimate stays high (late calls may run) for one to two windows, then is tight again', () => {
    const clock = new RedisClockOffset({ windowMs: WINDOW_MS });
    let nowMs = T0;
    const every100ms = (offsetMs: number, untilMs: number) => {
      for (; nowMs < untilMs; nowMs += 100) sample(clock, offsetMs, nowMs, 0.1, 0.1);
    };
    every100ms(1_000, T0 + 15_000);
    assertNear(clock.offsetMs, 1_000.1);
    every100ms(0, T0 + 16_000); // stepped back 1 s
    assert.ok(
      clock.offsetMs! >= 1_000,
      `old samples still count: too high, never too low (${clock.offsetMs})`,
    );
    every100ms(0, T0 + 15_000 + 2 * WINDOW_MS + 100);
    assertNear(clock.offsetMs, 0.1);
  });

  it('after a silence of two windows or more, the old samples are dropped at the next reply', () => {
    const clock = new RedisClockOffset({ windowMs: WINDOW_MS });
    sample(clock, 500, T0, 0.05, 0.05);
    sample(clock, 500, T0 + 1, 50, 50); // slow, kept below the fast sample's bound
    assertNear(clock.offsetMs, 500.05);
    sample(clock, 200, T0 + 2 * WINDOW_MS + 1, 3, 2);
    assertNear(clock.offsetMs, 200 + 3, 'only the new sample, T - s:');
    // Without new samples, the last estimate stays (Redis unreachable: the best there is).
    assert.equal(clock.serverDeadlineMs(T0 + 10 * WINDOW_MS), T0 + 10 * WINDOW_MS + 203 + MARGIN_MS);
  });

  it('ignores samples it cannot use: no Redis time, or received before sent', () => {
    const clock = new RedisClockOffset();
    clock.observe(T0, Number.NaN, T0 + 1);
    clock.observe(T0 + 5, T0 + 1_000, T0 + 4);
    assert.equal(clock.offsetMs, undefined);
    sample(clock, 7, T0, 1, 1);
    assertNear(clock.offsetMs, 8);
  });
});
