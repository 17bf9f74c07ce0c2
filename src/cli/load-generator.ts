/**
 * Offers calls at fixed rates, spread over time: every `tickMs` each stream issues the calls due
 * since it started (`floor(rps * elapsed) - issued`), so timer jitter is caught up on the next tick
 * and the long-run rate is exact. After a stall (a paused process) at most `maxCatchUpMs` of calls
 * are issued at once, like a client that gave up on the rest.
 */
export interface LoadStream {
  rps: number;
  offer: () => void;
}

export interface LoadGenerator {
  start(): void;
  stop(): void;
  /** Calls issued per stream so far. */
  readonly issued: readonly number[];
}

export function createLoadGenerator(
  streams: LoadStream[],
  { tickMs = 10, maxCatchUpMs = 1_000 }: { tickMs?: number; maxCatchUpMs?: number } = {},
): LoadGenerator {
  const issued = streams.map(() => 0);
  const accounted = streams.map(() => 0);
  let timer: NodeJS.Timeout | undefined;
  let startedAtMs = 0;

  const tick = () => {
    const nowMs = performance.now();
    streams.forEach((stream, i) => {
      const elapsedS = (nowMs - startedAtMs) / 1000;
      let due = Math.floor(stream.rps * elapsedS) - accounted[i]!;
      const cap = Math.ceil((stream.rps * maxCatchUpMs) / 1000);
      if (due > cap) {
        accounted[i]! += due - cap;
        due = cap;
      }
      for (let n = 0; n < due; n++) stream.offer();
      accounted[i]! += due;
      issued[i]! += due;
    });
  };

  return {
    issued,
    start() {
      if (timer) return;
      startedAtMs = performance.now();
      timer = setInterval(tick, tickMs);
    },
    stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
    },
  };
}
