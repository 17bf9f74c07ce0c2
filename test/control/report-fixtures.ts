import { create } from '@bufbuild/protobuf';
import type { ManualClock } from '../../src/core/clock.js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  Tier,
} from '../../src/gen/spillway/v1/control_pb.js';
import type { ReportHandler } from '../../src/transport/control-transport.js';

/** Test helpers shared by the control-plane tests: report builders and a synchronous call. */
export interface UsageSpec {
  bucket: string;
  offered: number;
  admitted?: number;
  wouldDrop?: number;
  /** Epoch of the ratio the reporter's hosts apply (default 0n: none). */
  heldEpoch?: bigint;
}

export function hostReport(options: {
  id: string;
  sequence: number;
  endMs: number;
  windowMs?: number;
  zone?: string;
  tier?: Tier;
  hostCount?: number;
  /** The receiver that acknowledged the sender's last acknowledged report, and its window end. */
  acknowledgedBy?: string;
  acknowledgedEndMs?: number;
  buckets: UsageSpec[];
}): ReportRequest {
  const windowMs = options.windowMs ?? 1000;
  return create(ReportRequestSchema, {
    reporterId: options.id,
    tier: options.tier ?? Tier.HOST,
    zone: options.zone ?? 'z1',
    sequence: BigInt(options.sequence),
    windowStartMs: BigInt(Math.round(options.endMs - windowMs)),
    windowEndMs: BigInt(Math.round(options.endMs)),
    hostCount: options.hostCount ?? 1,
    acknowledgedBy: options.acknowledgedBy ?? '',
    acknowledgedWindowEndMs: BigInt(Math.round(options.acknowledgedEndMs ?? 0)),
    buckets: options.buckets.map((b) => ({
      bucket: b.bucket,
      offered: b.offered,
      admitted: b.admitted ?? b.offered,
      wouldDrop: b.wouldDrop ?? 0,
      heldEpoch: b.heldEpoch ?? 0n,
    })),
  });
}

/** Call a handler that must answer synchronously (controller and aggregator both do). */
export function call(handler: ReportHandler, request: ReportRequest): ReportResponse {
  const response = handler(request, { peer: 'test' });
  if (response instanceof Promise) throw new Error('expected a synchronous reply');
  return response;
}

/** Advance virtual time in steps, letting promise callbacks (transport deliveries) run between them. */
export async function advance(clock: ManualClock, ms: number, stepMs = 10): Promise<void> {
  for (let done = 0; done < ms; done += stepMs) {
    clock.advance(Math.min(stepMs, ms - done));
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** Poll `check` while advancing virtual time, up to `maxMs` of it. */
export async function advanceUntil(clock: ManualClock, check: () => boolean, maxMs: number): Promise<void> {
  for (let done = 0; done <= maxMs; done += 10) {
    if (check()) return;
    await advance(clock, 10);
  }
  throw new Error(`condition not met within ${maxMs} ms of virtual time`);
}
