import { Worker } from 'node:worker_threads';
import type { Cancellable } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';
import type { ControlClient } from './control-transport.js';
import {
  type GrpcControlClientOptions,
  type GrpcReconnectEvent,
  validateReconnectAfterTimeouts,
} from './grpc-control-client.js';

/** The gRPC client options a worker thread can take: everything but the callback. */
export type WorkerControlClientOptions = Omit<GrpcControlClientOptions, 'onReconnect'> & {
  /** Called on the calling thread each time the worker's client replaces a connection; what it throws is ignored. */
  onReconnect?: (event: GrpcReconnectEvent) => void;
  /**
   * Called when the worker thread dies (it is started again for the next report). Reports in flight
   * on it were rejected with ERR_SPILLWAY_STORE_UNAVAILABLE. What it throws is ignored.
   */
  onWorkerError?: (error: Error) => void;
};

/** Messages to the worker. */
export type ToWorker =
  | { type: 'report'; id: number; request: ReportRequest; deadlineMs: number }
  | { type: 'watch'; id: number }
  | { type: 'unwatch'; id: number };

/** Messages from the worker. */
export type FromWorker =
  | { type: 'ready' }
  | { type: 'reply'; id: number; response: ReportResponse }
  | { type: 'failed'; id: number; code: ErrorCode; message: string; details: Record<string, unknown> }
  | { type: 'connected'; id: number }
  | { type: 'reconnect'; event: GrpcReconnectEvent };

/** A ControlClient on a worker thread. */
export interface WorkerControlClient extends ControlClient {
  /**
   * Resolves once the worker thread runs its gRPC client (tens of milliseconds after creation
   * when built; longer from source under tsx). A process can await it before it starts reporting,
   * so that its first report's deadline is not spent starting the thread. Rejects if the thread
   * died first.
   */
  whenReady(): Promise<void>;
  /** For tests: the worker thread now, if one runs. */
  readonly [workerThread]: () => Worker | undefined;
}

/** Key of {@link WorkerControlClient}'s test accessor (to stop the thread and see what follows). */
export const workerThread: unique symbol = Symbol('spillway.workerThread');

/** What the worker is started with (`workerData`). */
export interface WorkerInit {
  target: string;
  options: Omit<GrpcControlClientOptions, 'onReconnect'>;
}

/**
 * How long past a report's deadline the calling thread waits for the worker's answer before it
 * settles the report itself. The worker's gRPC call carries the same deadline and normally answers
 * by then; this only bounds a worker that stopped answering (it never has in tests, but the
 * ControlClient contract is that a report never hangs).
 */
const WORKER_ANSWER_GRACE_MS = 100;

/**
 * A gRPC ControlClient whose client runs on a worker thread: the report's protobuf encoding, the
 * grpc-js call machinery and HTTP/2 framing (about a millisecond of mostly interpreted code a
 * report: it runs once a second, too rarely for the JIT to optimize it) happen off the thread
 * that serves requests. What stays on the calling thread is a structured clone of the report
 * object going out and of the response coming back.
 *
 * The data plane's `allow()` never waits on a report either way; what this removes is the stall a
 * report puts in the event loop, which every request arriving during it waits behind (measured in
 * bench/results/edge.md and docs/proxy.md). Worth it in a process that serves requests (proxy,
 * host, middleware); an aggregator has nothing to protect and reports from its own thread.
 *
 * Same contract and options as {@link createGrpcControlClient} (it is what runs in the worker):
 * errors arrive as SpillwayErrors with the same code, message and details (not the grpc-js error
 * as `cause`); `onReconnect` is called on this thread. The worker thread is started at once (a
 * few tens of milliseconds, in the background), does not keep the process alive, and is started
 * again for the next report if it dies.
 */
export function createWorkerControlClient(
  target: string,
  options: WorkerControlClientOptions = {},
): WorkerControlClient {
  const { onReconnect, onWorkerError, ...grpcOptions } = options;
  // Refused here, synchronously, as createGrpcControlClient would, rather than by the thread.
  validateReconnectAfterTimeouts(grpcOptions);
  const init: WorkerInit = { target, options: grpcOptions };

  interface Pending {
    resolve(response: ReportResponse): void;
    reject(error: SpillwayError): void;
    guard: NodeJS.Timeout;
  }
  const pending = new Map<number, Pending>();
  const watchers = new Map<number, () => void>();
  let nextId = 1;
  let closed = false;
  let worker: Worker | undefined;
  /** Settles when the current worker says it is ready, or dies first. */
  let ready: { promise: Promise<void>; resolve(): void; reject(error: Error): void } | undefined;

  const unavailable = (message: string, cause?: unknown) =>
    new SpillwayError(
      ErrorCode.StoreUnavailable,
      message,
      { target },
      cause === undefined ? undefined : { cause },
    );

  const settle = (id: number): Pending | undefined => {
    const entry = pending.get(id);
    if (entry === undefined) return undefined;
    pending.delete(id);
    clearTimeout(entry.guard);
    if (closed && pending.size === 0) void worker?.terminate();
    return entry;
  };

  const onMessage = (message: FromWorker): void => {
    switch (message.type) {
      case 'ready':
        ready?.resolve();
        return;
      case 'reply':
        settle(message.id)?.resolve(message.response);
        return;
      case 'failed':
        settle(message.id)?.reject(new SpillwayError(message.code, message.message, message.details));
        return;
      case 'connected': {
        const listener = watchers.get(message.id);
        watchers.delete(message.id);
        if (listener !== undefined && !closed) listener();
        return;
      }
      case 'reconnect':
        try {
          onReconnect?.(message.event);
        } catch {
          // An observer's failure must not disturb reporting.
        }
        return;
    }
  };

  /** The worker's death (an uncaught error, or an exit): what it had in flight fails now. */
  const onDeath = (dead: Worker, error: Error): void => {
    if (worker !== dead) return;
    worker = undefined;
    ready?.reject(error);
    for (const id of [...pending.keys()]) {
      settle(id)?.reject(
        unavailable(`report to ${target} failed: its worker thread died: ${error.message}`, error),
      );
    }
    // A watcher waits for a connection the dead worker can no longer see; the next report's new
    // worker tells again (the reporter watches after each failed report).
    watchers.clear();
    if (closed) return;
    try {
      onWorkerError?.(error);
    } catch {
      // An observer's failure must not disturb reporting.
    }
  };

  const start = (): Worker => {
    let resolve = () => {};
    let reject = (_: Error) => {};
    const promise = new Promise<void>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // Nobody need be waiting: a death before readiness is reported through the reports it fails.
    promise.catch(() => {});
    ready = { promise, resolve, reject };
    const started = startWorker(init);
    started.unref();
    started.on('message', onMessage);
    started.on('error', (error) => onDeath(started, error));
    started.on('exit', (code) => onDeath(started, new Error(`worker thread exited with code ${code}`)));
    return started;
  };
  const running = (): Worker => {
    worker ??= start();
    return worker;
  };
  running();

  return {
    target,
    whenReady(): Promise<void> {
      if (closed) return Promise.reject(unavailable(`gRPC client for ${target} is closed`));
      running();
      // running() started a worker, and with it `ready`.
      return ready!.promise;
    },
    [workerThread]: () => worker,
    report(request: ReportRequest, { timeoutMs }: { timeoutMs: number }): Promise<ReportResponse> {
      return new Promise<ReportResponse>((resolve, reject) => {
        if (closed) {
          reject(unavailable(`gRPC client for ${target} is closed`));
          return;
        }
        const id = nextId++;
        const budgetMs = Math.max(0, timeoutMs);
        const guard = setTimeout(() => {
          settle(id)?.reject(
            new SpillwayError(
              ErrorCode.StoreTimeout,
              `report to ${target} timed out (no answer from its worker thread)`,
              {
                target,
                grpcStatus: 'DEADLINE_EXCEEDED',
                remoteMessage: 'worker thread did not answer',
              },
            ),
          );
        }, budgetMs + WORKER_ANSWER_GRACE_MS);
        pending.set(id, { resolve, reject, guard });
        try {
          // The deadline is absolute (both threads share the wall clock): time spent reaching the
          // worker counts against it, as it would on this thread.
          running().postMessage({
            type: 'report',
            id,
            request,
            deadlineMs: Date.now() + budgetMs,
          } satisfies ToWorker);
        } catch (error) {
          // A report object that cannot be cloned (not a ReportRequest).
          settle(id)?.reject(unavailable(`report to ${target} failed: ${String(error)}`, error));
        }
      });
    },
    whenConnected(listener: () => void): Cancellable {
      if (closed) return { cancel() {} };
      const id = nextId++;
      watchers.set(id, listener);
      running().postMessage({ type: 'watch', id } satisfies ToWorker);
      return {
        cancel() {
          if (!watchers.delete(id)) return;
          worker?.postMessage({ type: 'unwatch', id } satisfies ToWorker);
        },
      };
    },
    close(): void {
      if (closed) return;
      closed = true;
      watchers.clear();
      // Reports in flight get their answers (each has its deadline); the worker goes with the last.
      if (pending.size === 0) void worker?.terminate();
    },
  };
}

/**
 * Starts the worker's entry, beside this file. Built, it is `control-client-worker.js`. Running from
 * source under tsx (tests, `--import tsx`), it is the `.ts` file, and Node 20 does not apply the
 * main thread's module hooks to worker threads: the worker registers tsx's hooks first.
 */
function startWorker(workerData: WorkerInit): Worker {
  if (!import.meta.url.endsWith('.ts')) {
    return new Worker(new URL('./control-client-worker.js', import.meta.url), { workerData });
  }
  const entry = new URL('./control-client-worker.ts', import.meta.url).href;
  const tsx = import.meta.resolve('tsx/esm/api');
  const bootstrap = `import(${JSON.stringify(tsx)}).then((api) => { api.register(); return import(${JSON.stringify(entry)}); });`;
  return new Worker(bootstrap, { eval: true, workerData });
}
