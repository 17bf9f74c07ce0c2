import { Worker } from 'node:worker_threads';
import type { Cancellable } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';
import type { ControlClient } from './control-transport.js';
import {
  type GrpcControlClientOptions,
  type GrpcReconnectEvent,
  validateGrpcControlClientOptions,
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
  /** `since`: the worker's connection count in the last answer this thread had (see `connections`). */
  | { type: 'watch'; id: number; since: number }
  | { type: 'unwatch'; id: number }
  | { type: 'close' };

/**
 * Messages from the worker. `connections` counts the connections its client has established so
 * far: a watch sent after an answer fires for any connection counted after that answer's, so one
 * established while the watch was on its way between the threads is not missed.
 */
export type FromWorker =
  | { type: 'ready' }
  | { type: 'reply'; id: number; response: ReportResponse; connections: number }
  | {
      type: 'failed';
      id: number;
      code: ErrorCode;
      message: string;
      details: Record<string, unknown>;
      connections: number;
    }
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
 * settles the report itself. The worker's gRPC call carries the same deadline and answers by then;
 * this bounds the hop between threads, and a worker that stopped answering (the ControlClient
 * contract is that a report never hangs).
 */
const WORKER_ANSWER_GRACE_MS = 20;
/** A thread that dies before it is ready is started again no sooner than this, doubling up to the max. */
const START_RETRY_MIN_MS = 1_000;
const START_RETRY_MAX_MS = 30_000;

/**
 * A gRPC ControlClient whose client runs on a worker thread: the report's protobuf encoding, the
 * grpc-js call machinery and HTTP/2 framing (a couple of milliseconds of mostly interpreted code a
 * report: it runs once a second, too rarely for the JIT to optimize it) happen off the thread
 * that serves requests. What stays on the calling thread is a structured clone of the report
 * object going out and of the response coming back.
 *
 * The data plane's `allow()` never waits on a report either way; what this removes is the stall a
 * report puts in the event loop, which every request arriving during it waits behind
 * (bench/results/report-thread.md). Worth it in a process that serves requests (proxy, host,
 * middleware); an aggregator has nothing to protect and reports from its own thread.
 *
 * Same contract and options as {@link createGrpcControlClient} (it is what runs in the worker),
 * and the same synchronous refusal of bad options: errors arrive as SpillwayErrors with the same
 * code, message and details (not the grpc-js error as `cause`); `onReconnect` is called on this
 * thread. A report settles by its deadline plus at most {@link WORKER_ANSWER_GRACE_MS}.
 *
 * The thread is started at once, in the background, and once it runs it does not keep the process
 * alive (a report in flight does, by its deadline). If it dies, the reports it had in flight fail
 * with ERR_SPILLWAY_STORE_UNAVAILABLE, `onWorkerError` is called, and a new thread is started (at
 * once if connections are being watched, else by the next report); watches carry over to it. A
 * thread that dies before it is ready (it cannot load) is started again no sooner than 1 s later,
 * doubling to 30 s, and reports in between fail at once.
 */
export function createWorkerControlClient(
  target: string,
  options: WorkerControlClientOptions = {},
): WorkerControlClient {
  const { onReconnect, onWorkerError, ...grpcOptions } = options;
  // Refused here, synchronously, as createGrpcControlClient would, rather than by the thread.
  validateGrpcControlClientOptions(grpcOptions, 'createWorkerControlClient');
  const init: WorkerInit = { target, options: grpcOptions };

  interface Pending {
    resolve(response: ReportResponse): void;
    reject(error: SpillwayError): void;
    guard: NodeJS.Timeout;
  }
  interface Running {
    thread: Worker;
    ready: Promise<void>;
    resolveReady(): void;
    rejectReady(error: Error): void;
    isReady: boolean;
    /** The worker's connection count in its latest answer. */
    connections: number;
  }
  const pending = new Map<number, Pending>();
  const watchers = new Map<number, () => void>();
  let nextId = 1;
  let closed = false;
  let current: Running | undefined;
  /** After a thread died before it was ready: no new one before `retryAtMs`. */
  let startFailure: { error: SpillwayError; retryAtMs: number } | undefined;
  let startRetryMs = START_RETRY_MIN_MS;

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
    if (closed && pending.size === 0) void current?.thread.terminate();
    return entry;
  };

  const onMessage = (running: Running, message: FromWorker): void => {
    switch (message.type) {
      case 'ready':
        running.isReady = true;
        startRetryMs = START_RETRY_MIN_MS;
        // Listening for its messages referenced the thread; from now on a report in flight keeps
        // the process alive (its guard timer), an idle client does not.
        running.thread.unref();
        running.resolveReady();
        return;
      case 'reply':
        running.connections = message.connections;
        settle(message.id)?.resolve(message.response);
        return;
      case 'failed':
        running.connections = message.connections;
        settle(message.id)?.reject(new SpillwayError(message.code, message.message, message.details));
        return;
      case 'connected': {
        const listener = watchers.get(message.id);
        watchers.delete(message.id);
        if (listener !== undefined && !closed) listener();
        return;
      }
      case 'reconnect':
        if (closed) return;
        try {
          onReconnect?.(message.event);
        } catch {
          // An observer's failure must not disturb reporting.
        }
        return;
    }
  };

  /** The worker's death (an uncaught error, or an exit): what it had in flight fails now. */
  const onDeath = (running: Running, error: Error): void => {
    if (current !== running) return;
    current = undefined;
    running.rejectReady(error);
    for (const id of [...pending.keys()]) {
      settle(id)?.reject(
        unavailable(`report to ${target} failed: its worker thread died: ${error.message}`, error),
      );
    }
    if (closed) return;
    if (!running.isReady) {
      startFailure = {
        error: unavailable(
          `report to ${target} failed: its worker thread did not start: ${error.message}`,
          error,
        ),
        retryAtMs: Date.now() + startRetryMs,
      };
      startRetryMs = Math.min(START_RETRY_MAX_MS, startRetryMs * 2);
    }
    try {
      onWorkerError?.(error);
    } catch {
      // An observer's failure must not disturb reporting.
    }
    // Watches wait for a connection: a new thread makes them, unless it could not start (then the
    // next report's thread takes them over).
    if (watchers.size > 0 && startFailure === undefined) tryRunning();
  };

  const start = (): Running => {
    if (startFailure !== undefined) {
      if (Date.now() < startFailure.retryAtMs) throw startFailure.error;
      startFailure = undefined;
    }
    let resolveReady = () => {};
    let rejectReady = (_: Error) => {};
    const ready = new Promise<void>((resolve, reject) => {
      resolveReady = resolve;
      rejectReady = reject;
    });
    // Nobody need be waiting: a death before readiness is reported through the reports it fails.
    ready.catch(() => {});
    const thread = startWorker(init);
    const running: Running = { thread, ready, resolveReady, rejectReady, isReady: false, connections: 0 };
    thread.on('message', (message: FromWorker) => onMessage(running, message));
    thread.on('error', (error) => onDeath(running, error));
    thread.on('exit', (code) => onDeath(running, new Error(`worker thread exited with code ${code}`)));
    // Every connection of a new thread is made after the watches began.
    for (const id of watchers.keys()) thread.postMessage({ type: 'watch', id, since: 0 } satisfies ToWorker);
    return running;
  };
  /** The thread now, started if none runs; throws while a failed start waits to be retried. */
  const running = (): Running => {
    current ??= start();
    return current;
  };
  const tryRunning = (): void => {
    try {
      running();
    } catch {
      // Waiting to retry a failed start: the next report tries again.
    }
  };
  tryRunning();

  return {
    target,
    whenReady(): Promise<void> {
      if (closed) return Promise.reject(unavailable(`gRPC client for ${target} is closed`));
      try {
        return running().ready;
      } catch (error) {
        return Promise.reject(error);
      }
    },
    [workerThread]: () => current?.thread,
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
          running().thread.postMessage({
            type: 'report',
            id,
            request,
            deadlineMs: Date.now() + budgetMs,
          } satisfies ToWorker);
        } catch (error) {
          // A failed start waiting to be retried, or a report object that cannot be cloned.
          settle(id)?.reject(
            error instanceof SpillwayError
              ? error
              : unavailable(`report to ${target} failed: ${String(error)}`, error),
          );
        }
      });
    },
    whenConnected(listener: () => void): Cancellable {
      if (closed) return { cancel() {} };
      const id = nextId++;
      watchers.set(id, listener);
      if (current !== undefined) {
        current.thread.postMessage({ type: 'watch', id, since: current.connections } satisfies ToWorker);
      } else {
        tryRunning(); // a new thread takes up every watch
      }
      return {
        cancel() {
          if (!watchers.delete(id)) return;
          current?.thread.postMessage({ type: 'unwatch', id } satisfies ToWorker);
        },
      };
    },
    close(): void {
      if (closed) return;
      closed = true;
      watchers.clear();
      if (current === undefined) return;
      // The worker closes its client as createGrpcControlClient's close() does; reports in flight
      // get their answers (each has its deadline), and the thread goes with the last of them.
      current.thread.postMessage({ type: 'close' } satisfies ToWorker);
      if (pending.size === 0) void current.thread.terminate();
    },
  };
}

/**
 * Starts the worker's entry, beside this file. Built, it is `control-client-worker.js`. Running from
 * source under tsx (tests, `--import tsx`), it is the `.ts` file, and Node 20 does not apply the
 * main thread's module hooks to worker threads: the worker registers tsx's hooks first.
 */
function startWorker(workerData: WorkerInit): Worker {
  const execArgv = workerExecArgv();
  if (!import.meta.url.endsWith('.ts')) {
    return new Worker(new URL('./control-client-worker.js', import.meta.url), {
      workerData,
      ...(execArgv ? { execArgv } : {}),
    });
  }
  const entry = new URL('./control-client-worker.ts', import.meta.url);
  let tsx: string;
  try {
    tsx = import.meta.resolve('tsx/esm/api');
  } catch {
    // Not under tsx: a runtime that loads TypeScript itself (Node 22 type stripping) may manage.
    return new Worker(entry, { workerData, ...(execArgv ? { execArgv } : {}) });
  }
  const bootstrap = `import(${JSON.stringify(tsx)}).then((api) => { api.register(); return import(${JSON.stringify(entry.href)}); });`;
  return new Worker(bootstrap, { eval: true, workerData, ...(execArgv ? { execArgv } : {}) });
}

/**
 * A worker inherits the process's Node options, `--input-type` included, which applies to the
 * process's `-e` code only: a worker given it refuses its entry file (ERR_INPUT_TYPE_NOT_ALLOWED),
 * e.g. under `node --input-type=module -e "..."`. Such a worker gets no options (the thread needs
 * none: from source it registers tsx itself); others inherit as usual (an explicit list may not
 * carry process-wide flags such as `--expose-gc`, which inheriting skips).
 */
function workerExecArgv(): string[] | undefined {
  return process.execArgv.some((arg) => arg === '--input-type' || arg.startsWith('--input-type='))
    ? []
    : undefined;
}
