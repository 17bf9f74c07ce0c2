/**
 * Offers calls at rates that change over time: every `tickMs` each stream accrues
 * `rateAt(t) x elapsed` calls and issues the whole ones, carrying the fraction, so the long-run
 * count follows the integral of the rate despite timer jitter. After a stall at most `maxCatchUpMs`
 * of calls are issued at once, like clients that gave up on the rest.
 */
export interface VaryingStream {
  /** Calls per second wanted at `tS` seconds after `startedAtMs`. */
  rateAt(tS: number): number;
  offer(): void;
}

export interface VaryingLoad {
  start(): void;
  stop(): void;
  /** Calls issued per stream so far. */
  readonly issued: readonly number[];
}

export function createVaryingLoad(
  streams: readonly VaryingStream[],
  {
    startedAtMs = Date.now(),
    tickMs = 10,
    maxCatchUpMs = 1_000,
  }: { startedAtMs?: number; tickMs?: number; maxCatchUpMs?: number } = {},
): VaryingLoad {
  const issued = streams.map(() => 0);
  const owed = streams.map(() => 0);
  const due = streams.map(() => 0);
  let timer: NodeJS.Timeout | undefined;
  let lastMs = 0;

  const tick = () => {
    const nowMs = Date.now();
    const elapsedS = Math.min(nowMs - lastMs, maxCatchUpMs) / 1000;
    lastMs = nowMs;
    const tS = (nowMs - startedAtMs) / 1000;
    let most = 0;
    streams.forEach((stream, i) => {
      owed[i]! += Math.max(0, stream.rateAt(tS)) * elapsedS;
      due[i] = Math.floor(owed[i]!);
      owed[i]! -= due[i]!;
      issued[i]! += due[i]!;
      most = Math.max(most, due[i]!);
    });
    // Interleaved, so that a consumer that sheds load (an overloaded client) sheds it fairly.
    for (let round = 0; round < most; round++) {
      for (let i = 0; i < streams.length; i++) if (round < due[i]!) streams[i]!.offer();
    }
  };

  return {
    issued,
    start() {
      if (timer) return;
      lastMs = Date.now();
      timer = setInterval(tick, tickMs);
    },
    stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
    },
  };
}
