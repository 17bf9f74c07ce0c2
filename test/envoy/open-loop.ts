import { create, fromBinary, type MessageInitShape, toBinary } from '@bufbuild/protobuf';
import {
  RateLimitRequestSchema,
  type RateLimitResponse,
  RateLimitResponse_Code,
  RateLimitResponseSchema,
} from '../../src/gen/envoy/service/ratelimit/v3/rls_pb.js';
import type { RlsClient } from './rls-client.js';

/** One kind of request the generator sends, at a fixed rate, whatever the answers (open loop). */
export interface Shape {
  name: string;
  rps: number;
  request: MessageInitShape<typeof RateLimitRequestSchema>;
}

/** Per shape: calls answered, and per descriptor position how many statuses came back OK / OVER_LIMIT. */
export interface ShapeCounts {
  sent: number;
  answered: number;
  errors: number;
  overall: { ok: number; over: number };
  descriptors: { ok: number; over: number }[];
}

/**
 * An open-loop gRPC load generator, as a fleet of Envoys is: each shape's calls go out on a fixed
 * schedule (computed from elapsed time, so a late timer sends what fell due rather than slowing the
 * rate), round robin over the clients, never waiting for answers. Counts are kept per window:
 * `mark()` starts a new one and returns the previous.
 */
export class OpenLoop {
  readonly #shapes: { shape: Shape; bytes: Buffer; due: number }[];
  readonly #clients: readonly RlsClient[];
  #next = 0;
  #timer: NodeJS.Timeout | undefined;
  #startedMs = 0;
  #window: Map<string, ShapeCounts> = new Map();
  #windowStartedMs = 0;
  /** Every error seen, for messages. */
  readonly errors: string[] = [];
  inFlight = 0;

  constructor(shapes: readonly Shape[], clients: readonly RlsClient[]) {
    this.#shapes = shapes.map((shape) => ({
      shape,
      bytes: Buffer.from(toBinary(RateLimitRequestSchema, create(RateLimitRequestSchema, shape.request))),
      due: 0,
    }));
    this.#clients = clients;
    this.mark();
  }

  start(): void {
    this.#startedMs = performance.now();
    this.#timer = setInterval(() => this.#tick(), 5);
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  /** Close the current window: its counts and its length in seconds. */
  mark(): { counts: Map<string, ShapeCounts>; seconds: number } {
    const nowMs = performance.now();
    const closed = { counts: this.#window, seconds: (nowMs - this.#windowStartedMs) / 1000 };
    this.#window = new Map(
      this.#shapes.map(({ shape }) => [
        shape.name,
        {
          sent: 0,
          answered: 0,
          errors: 0,
          overall: { ok: 0, over: 0 },
          descriptors: (shape.request.descriptors ?? []).map(() => ({ ok: 0, over: 0 })),
        },
      ]),
    );
    this.#windowStartedMs = nowMs;
    return closed;
  }

  #tick(): void {
    const elapsedS = (performance.now() - this.#startedMs) / 1000;
    for (const entry of this.#shapes) {
      const target = Math.floor(elapsedS * entry.shape.rps);
      while (entry.due < target) {
        entry.due++;
        this.#send(entry.shape.name, entry.bytes);
      }
    }
  }

  #send(name: string, bytes: Buffer): void {
    const counts = this.#window.get(name)!;
    counts.sent++;
    const client = this.#clients[this.#next++ % this.#clients.length]!;
    this.inFlight++;
    client.callRaw(bytes, { timeoutMs: 5_000 }).then(
      (answer) => {
        this.inFlight--;
        this.#count(counts, fromBinary(RateLimitResponseSchema, answer));
      },
      (error: Error) => {
        this.inFlight--;
        counts.errors++;
        if (this.errors.length < 20) this.errors.push(error.message);
      },
    );
  }

  #count(counts: ShapeCounts, response: RateLimitResponse): void {
    counts.answered++;
    if (response.overallCode === RateLimitResponse_Code.OVER_LIMIT) counts.overall.over++;
    else counts.overall.ok++;
    response.statuses.forEach((status, i) => {
      const slot = counts.descriptors[i];
      if (!slot) return;
      if (status.code === RateLimitResponse_Code.OVER_LIMIT) slot.over++;
      else slot.ok++;
    });
  }
}
