import { create } from '@bufbuild/protobuf';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import {
  type Directive,
  DirectiveSchema,
  Mode,
  type ReportRequest,
  type ReportResponse,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import {
  createGlobalLimiter,
  type GlobalLimiter,
  type GlobalLimiterOptions,
} from '../../src/global/index.js';
import type { ReportContext } from '../../src/transport/control-transport.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';

/** Let promise callbacks (and the I/O phase) run; no timers are involved. */
export async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}

/** Advance virtual time in steps, letting promise callbacks run between steps. */
export async function advance(clock: ManualClock, ms: number, stepMs = 1): Promise<void> {
  let left = ms;
  await settle();
  while (left > 0) {
    const step = Math.min(stepMs, left);
    clock.advance(step);
    left -= step;
    await settle();
  }
}

/** Run virtual time until `promise` settles (or `maxMs` passes, which fails the test). */
export async function drive<T>(
  clock: ManualClock,
  promise: Promise<T>,
  stepMs = 1,
  maxMs = 60_000,
): Promise<T> {
  let done = false;
  promise.then(
    () => {
      done = true;
    },
    () => {
      done = true;
    },
  );
  await settle();
  let elapsedMs = 0;
  while (!done) {
    // Due timers first (delay 0 still goes through the scheduler), then time moves.
    clock.advance(0);
    await settle();
    if (done) break;
    if (elapsedMs >= maxMs) throw new Error(`promise did not settle within ${maxMs} ms of virtual time`);
    clock.advance(stepMs);
    elapsedMs += stepMs;
    await settle();
  }
  return promise;
}

export interface DirectiveSpec {
  dropRatio: number;
  mode?: 'enforce' | 'shadow';
  limitRps?: number;
  offeredRps?: number;
  epoch?: number;
  version?: number;
  ttlMs?: number;
}

export function directive(bucket: string, spec: DirectiveSpec): Directive {
  return create(DirectiveSchema, {
    bucket,
    dropRatio: spec.dropRatio,
    mode: spec.mode === 'shadow' ? Mode.SHADOW : Mode.ENFORCE,
    limitRps: spec.limitRps ?? 100,
    offeredRps: spec.offeredRps ?? 0,
    epoch: BigInt(spec.epoch ?? 1),
    version: BigInt(spec.version ?? 1),
    ttlMs: spec.ttlMs ?? 3_000,
  });
}

/**
 * A control plane stand-in: records every report and answers with the directives it is told to
 * hand out. Versions increase per reply unless a spec pins one, as a real controller's do.
 */
export class FakeAggregator {
  readonly requests: ReportRequest[] = [];
  readonly peers: string[] = [];
  readonly directives = new Map<string, DirectiveSpec>();
  reportIntervalMs = 0;
  epoch = 1;
  #version = 0;
  /** When set, the handler throws it (a refusal). */
  refuse: Error | undefined;

  /** `id`: the reply's responder id. */
  constructor(readonly id = 'fake') {}

  set(bucket: string, spec: DirectiveSpec): void {
    this.directives.set(bucket, spec);
  }

  readonly handler = (request: ReportRequest, context: ReportContext): ReportResponse => {
    this.requests.push(request);
    this.peers.push(context.peer);
    if (this.refuse) throw this.refuse;
    this.#version++;
    const directives = [...this.directives].map(([bucket, spec]) =>
      directive(bucket, { epoch: this.epoch, version: this.#version, ...spec }),
    );
    return create(ReportResponseSchema, {
      directives,
      reportIntervalMs: this.reportIntervalMs,
      epoch: BigInt(this.epoch),
      responderId: this.id,
    });
  };

  get last(): ReportRequest {
    const request = this.requests.at(-1);
    if (!request) throw new Error('no report received');
    return request;
  }
}

export interface Harness {
  clock: ManualClock;
  network: InMemoryNetwork;
  aggregator: FakeAggregator;
  limiter: GlobalLimiter;
  /** Send a report now and wait (in virtual time) until it settled. */
  flush(): Promise<void>;
}

/** A limiter on a manual clock reporting to one fake aggregator over the in-memory network (no jitter). */
export function harness(options: Partial<GlobalLimiterOptions> = {}, seed = 1): Harness {
  const clock = new ManualClock(1_000_000);
  const network = new InMemoryNetwork({ scheduler: clock });
  const aggregator = new FakeAggregator();
  network.listen('agg-1', aggregator.handler);
  const limiter = createGlobalLimiter({
    reporterId: 'host-1',
    zone: 'z1',
    region: 'r1',
    clients: [network.connect('agg-1', { from: 'host-1' })],
    scheduler: clock,
    random: seededRandom(seed),
    jitterRatio: 0,
    ...options,
  });
  return { clock, network, aggregator, limiter, flush: () => drive(clock, limiter.flush()) };
}
