import { PerformanceObserver } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import v8 from 'node:v8';
import { median } from './paired-stats.js';

/**
 * The measuring harness shared by the per-decision benchmarks (bench/local.bench.ts,
 * bench/global.bench.ts). Each benchmark keeps its own loop functions, one per case, so every
 * call site inside a loop stays monomorphic; the harness only times whole chunks of calls.
 */
export interface DecisionCaseResult {
  id: string;
  label: string;
  /** Median wall time per decision over the rounds. */
  nsPerCall: number;
  minNs: number;
  maxNs: number;
  /** Median process CPU time per decision (includes V8's helper threads). */
  cpuNsPerCall: number;
  callsPerRound: number;
  rounds: number;
  /** Heap growth over `allocationProbeCalls` calls after a full GC, per call (no GC in between). */
  bytesPerCall: number | null;
  /** Garbage collections observed during `calls` back-to-back calls (0 proves no allocation). */
  gcsDuringRun: number | null;
  note?: string;
}

export interface DecisionHarnessOptions {
  calls: number;
  rounds: number;
  /** Calls per timed chunk; between chunks the harness yields to the event loop. */
  chunk: number;
  /** Pause between chunks (1 ms lets a coarse clock tick as it would between event-loop turns). */
  pauseMs: number;
  allocationProbeCalls: number;
}

export function createDecisionHarness(options: DecisionHarnessOptions) {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('run with --expose-gc (see the header of the benchmark file)');
  const { calls, rounds, chunk, pauseMs, allocationProbeCalls } = options;

  let gcEvents = 0;
  new PerformanceObserver((list) => {
    gcEvents += list.getEntries().length;
  }).observe({ entryTypes: ['gc'] });

  /** Wall time per call, and process CPU time per call (less inflated when other work preempts us). */
  async function timeSync(
    run: (calls: number) => void,
    total: number,
  ): Promise<{ wallNs: number; cpuNs: number }> {
    let wallNs = 0n;
    let cpuUs = 0;
    for (let done = 0; done < total; done += chunk) {
      const size = Math.min(chunk, total - done);
      const cpuStart = process.cpuUsage();
      const start = process.hrtime.bigint();
      run(size);
      wallNs += process.hrtime.bigint() - start;
      const cpu = process.cpuUsage(cpuStart);
      cpuUs += cpu.user + cpu.system;
      await sleep(pauseMs);
    }
    return { wallNs: Number(wallNs) / total, cpuNs: (cpuUs * 1000) / total };
  }

  async function allocation(run: (calls: number) => void): Promise<{ bytesPerCall: number; gcs: number }> {
    gc!();
    gc!();
    const before = v8.getHeapStatistics().used_heap_size;
    run(allocationProbeCalls);
    const after = v8.getHeapStatistics().used_heap_size;
    await sleep(20);
    gcEvents = 0;
    run(calls);
    await sleep(50); // GC entries are delivered asynchronously
    return { bytesPerCall: Math.max(0, after - before) / allocationProbeCalls, gcs: gcEvents };
  }

  /** A synchronous case: warm up, `rounds` timed rounds of `calls`, then (optionally) the allocation probes. */
  async function measureSync(
    id: string,
    label: string,
    run: (calls: number) => void,
    withAllocation: boolean,
  ): Promise<DecisionCaseResult> {
    await timeSync(run, Math.min(calls, 2_000_000)); // warm up: let the JIT settle before timing
    const samples: number[] = [];
    const cpuSamples: number[] = [];
    for (let round = 0; round < rounds; round++) {
      const timing = await timeSync(run, calls);
      samples.push(timing.wallNs);
      cpuSamples.push(timing.cpuNs);
    }
    const probe = withAllocation ? await allocation(run) : undefined;
    const result: DecisionCaseResult = {
      id,
      label,
      nsPerCall: median(samples),
      minNs: Math.min(...samples),
      maxNs: Math.max(...samples),
      cpuNsPerCall: median(cpuSamples),
      callsPerRound: calls,
      rounds,
      bytesPerCall: probe?.bytesPerCall ?? null,
      gcsDuringRun: probe?.gcs ?? null,
    };
    console.log(`${label}: ${result.nsPerCall.toFixed(2)} ns/decision, ${result.gcsDuringRun ?? '-'} GCs`);
    return result;
  }

  /**
   * A promise-based case (rate-limiter-flexible): one awaited call after another. Counts the GCs
   * and the net heap movement of one more run after the timed rounds.
   */
  async function measureAsync(
    id: string,
    label: string,
    run: (calls: number) => Promise<void>,
    asyncCalls: number,
    asyncRounds: number,
    warmupCalls: number,
  ): Promise<DecisionCaseResult & { heapDeltaBytes: number }> {
    await run(warmupCalls);
    const samples: number[] = [];
    const cpuSamples: number[] = [];
    for (let round = 0; round < asyncRounds; round++) {
      const cpuStart = process.cpuUsage();
      const start = process.hrtime.bigint();
      await run(asyncCalls);
      samples.push(Number(process.hrtime.bigint() - start) / asyncCalls);
      const cpu = process.cpuUsage(cpuStart);
      cpuSamples.push(((cpu.user + cpu.system) * 1000) / asyncCalls);
    }
    gc!();
    gc!();
    const before = process.memoryUsage().heapUsed;
    gcEvents = 0;
    await run(asyncCalls);
    await sleep(50);
    const result = {
      id,
      label,
      nsPerCall: median(samples),
      minNs: Math.min(...samples),
      maxNs: Math.max(...samples),
      cpuNsPerCall: median(cpuSamples),
      callsPerRound: asyncCalls,
      rounds: asyncRounds,
      bytesPerCall: null,
      gcsDuringRun: gcEvents,
      heapDeltaBytes: process.memoryUsage().heapUsed - before,
    };
    console.log(`${label}: ${result.nsPerCall.toFixed(2)} ns/decision`);
    return result;
  }

  return { measureSync, measureAsync };
}
