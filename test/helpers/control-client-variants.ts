import type { ControlClient } from '../../src/transport/control-transport.js';
import {
  createGrpcControlClient,
  type GrpcControlClientOptions,
} from '../../src/transport/grpc-control-client.js';
import { createWorkerControlClient } from '../../src/transport/worker-control-client.js';

/**
 * The two ways a process runs its gRPC ControlClient: on its own thread, or on a worker thread
 * (the data plane's default in the CLI). Transport tests run against both: same contract.
 */
export interface ControlClientVariant {
  name: string;
  /** A client for `target`, as its factory returns it (it throws what the factory throws). */
  create(target: string, options?: GrpcControlClientOptions): ControlClient;
  /** A client for `target`, ready to report (the worker thread started). */
  connect(target: string, options?: GrpcControlClientOptions): Promise<ControlClient>;
}

export const CONTROL_CLIENT_VARIANTS: readonly ControlClientVariant[] = [
  {
    name: 'in this thread',
    create: createGrpcControlClient,
    connect: async (target, options) => createGrpcControlClient(target, options),
  },
  {
    name: 'on a worker thread',
    create: createWorkerControlClient,
    async connect(target, options) {
      const client = createWorkerControlClient(target, options);
      await client.whenReady();
      return client;
    },
  },
];
