import { Pool } from 'undici';

/**
 * The attacker of the cardinality runs, a child process (forked with an IPC channel) so the process
 * that samples the proxy and paces the victims is not starved: `keys` requests, each with a
 * distinct `x-api-key`, over `connections` keep-alive connections (one request in flight per
 * connection). Takes its input as the first IPC message; sends its counts every `progressMs` and
 * once more, with `done: true`, at the end, then exits.
 */
export interface AttackerInput {
  base: string;
  path: string;
  keys: number;
  connections: number;
  progressMs: number;
  /** Length of each key value (the attacker picks; 128 is the longest kept verbatim in a key). */
  keyLength: number;
}

export interface AttackerProgress {
  sent: number;
  /** Responses by status code; `error` counts requests that got no response (connection errors). */
  statuses: Record<string, number>;
  /** Thread CPU of the attacker is not the proxy's: elapsed only, for the achieved rate. */
  elapsedMs: number;
  done: boolean;
  firstError?: string;
}

/** Distinct, header-safe (so kept verbatim by `{header:...}`), `length` characters. */
export function attackKey(index: number, length: number): string {
  const head = `atk-${index.toString(36).padStart(8, '0')}-`;
  return head + 'x'.repeat(Math.max(0, length - head.length));
}

async function attack(input: AttackerInput): Promise<void> {
  const pool = new Pool(input.base, { connections: input.connections, pipelining: 1 });
  const statuses: Record<string, number> = {};
  let next = 0;
  let sent = 0;
  let firstError: string | undefined;
  const startedMs = performance.now();
  const progress = (done: boolean): AttackerProgress => ({
    sent,
    statuses: { ...statuses },
    elapsedMs: performance.now() - startedMs,
    done,
    firstError,
  });
  const timer = setInterval(() => send(progress(false)), input.progressMs);
  const loop = async () => {
    while (next < input.keys) {
      const index = next++;
      try {
        const response = await pool.request({
          path: input.path,
          method: 'GET',
          headers: { 'x-api-key': attackKey(index, input.keyLength) },
        });
        await response.body.dump();
        statuses[response.statusCode] = (statuses[response.statusCode] ?? 0) + 1;
      } catch (error) {
        statuses.error = (statuses.error ?? 0) + 1;
        firstError ??= error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      }
      sent++;
    }
  };
  try {
    await Promise.all(Array.from({ length: input.connections }, loop));
  } finally {
    clearInterval(timer);
    await pool.close();
  }
  send(progress(true));
}

function send(progress: AttackerProgress): void {
  process.send?.(progress);
}

if (process.send) {
  // The parent going away ends the attack: no orphan keeps loading the machine.
  process.on('disconnect', () => process.exit(2));
  process.once('message', (input: AttackerInput) => {
    attack(input).then(
      () => process.disconnect(),
      (error: unknown) => {
        console.error(error);
        process.exit(1);
      },
    );
  });
}
