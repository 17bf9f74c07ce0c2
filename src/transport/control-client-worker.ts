// The worker thread behind createWorkerControlClient: one gRPC ControlClient, driven by messages.
import { parentPort, workerData } from 'node:worker_threads';
import type { Cancellable } from '../core/clock.js';
import { ErrorCode, isSpillwayError } from '../core/errors.js';
import { createGrpcControlClient } from './grpc-control-client.js';
import type { FromWorker, ToWorker, WorkerInit } from './worker-control-client.js';

const port = parentPort;
if (port === null)
  throw new Error('control-client-worker.ts runs as a worker thread (createWorkerControlClient)');
const { target, options } = workerData as WorkerInit;
const post = (message: FromWorker): void => port.postMessage(message);

const client = createGrpcControlClient(target, {
  ...options,
  onReconnect: (event) => post({ type: 'reconnect', event }),
});
const watches = new Map<number, Cancellable>();

/** Connections established so far, sent with every answer (see FromWorker). */
let connections = 0;
const countConnections = (): void => {
  client.whenConnected?.(() => {
    connections++;
    countConnections();
  });
};
countConnections();
post({ type: 'ready' });

port.on('message', (message: ToWorker) => {
  switch (message.type) {
    case 'report': {
      const { id } = message;
      client.report(message.request, { timeoutMs: message.deadlineMs - Date.now() }).then(
        (response) => post({ type: 'reply', id, response, connections }),
        (error: unknown) => {
          const known = isSpillwayError(error);
          post({
            type: 'failed',
            id,
            code: known ? error.code : ErrorCode.StoreUnavailable,
            message: known ? error.message : `report to ${target} failed: ${String(error)}`,
            // Details are strings and numbers (target, grpcStatus, remoteMessage): clonable.
            details: known ? { ...error.details } : { target },
            connections,
          });
        },
      );
      return;
    }
    case 'watch': {
      const { id } = message;
      if (connections > message.since) {
        // Established after the answer the caller last had, before this watch arrived: it counts.
        setImmediate(() => post({ type: 'connected', id }));
        return;
      }
      watches.set(
        id,
        client.whenConnected?.(() => {
          watches.delete(id);
          post({ type: 'connected', id });
        }) ?? { cancel() {} },
      );
      return;
    }
    case 'unwatch':
      watches.get(message.id)?.cancel();
      watches.delete(message.id);
      return;
    case 'close':
      for (const watch of watches.values()) watch.cancel();
      watches.clear();
      client.close();
      return;
  }
});
