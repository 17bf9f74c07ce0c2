// The control transport: the seam every tier talks through, its in-memory implementation (tests,
// the fleet simulator) and gRPC over HTTP/2 (real processes), on the calling thread or a worker.
export type { ControlClient, ControlServer, ReportContext, ReportHandler } from './control-transport.js';
export type { GrpcClientTlsOptions, GrpcControlClientOptions } from './grpc-control-client.js';
export { createGrpcControlClient } from './grpc-control-client.js';
export type {
  GrpcControlServer,
  GrpcControlServerOptions,
  GrpcServerTlsOptions,
  ZoneToken,
} from './grpc-control-server.js';
export { startGrpcControlServer, validateZoneTokens } from './grpc-control-server.js';
export { DEFAULT_MAX_MESSAGE_BYTES, REPORT_METHOD_PATH } from './grpc-control-service.js';
export type { InMemoryNetworkOptions, LinkOptions } from './in-memory-network.js';
export { InMemoryNetwork } from './in-memory-network.js';
export { decodeReportRequest, encodeReportResponse } from './report-codec.js';
export type { WorkerControlClient, WorkerControlClientOptions } from './worker-control-client.js';
export { createWorkerControlClient } from './worker-control-client.js';
