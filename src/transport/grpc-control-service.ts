import { fromBinary, toBinary } from '@bufbuild/protobuf';
import type { MethodDefinition } from '@grpc/grpc-js';
import {
  type ReportRequest,
  ReportRequestSchema,
  type ReportResponse,
  ReportResponseSchema,
} from '../gen/spillway/v1/control_pb.js';

/**
 * The `spillway.v1.RateControl/Report` method as grpc-js sees it. The wire format is the one in
 * proto/spillway/v1/control.proto, encoded by protobuf-es; grpc-js only moves the bytes.
 */
export const REPORT_METHOD_PATH = '/spillway.v1.RateControl/Report';

/**
 * Largest message either side sends or accepts. A report carries at most a few thousand buckets of
 * ~40 bytes each; 4 MiB leaves room for that and bounds what a hostile peer can make us buffer.
 */
export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/** Client side: typed messages in and out. */
export const reportClientMethod = {
  path: REPORT_METHOD_PATH,
  serialize: (request: ReportRequest): Buffer => Buffer.from(toBinary(ReportRequestSchema, request)),
  deserialize: (bytes: Buffer): ReportResponse => fromBinary(ReportResponseSchema, bytes),
};

/**
 * Server side: raw bytes in and out. The server decodes and encodes itself so that malformed bytes
 * become INVALID_ARGUMENT (grpc-js would answer INTERNAL for a throwing deserializer) and so that a
 * handler returning something unencodable is an INTERNAL error we log, not a grpc-js internal path.
 */
export const reportServerMethod: MethodDefinition<Buffer, Buffer> = {
  path: REPORT_METHOD_PATH,
  requestStream: false,
  responseStream: false,
  requestSerialize: (bytes: Buffer) => bytes,
  requestDeserialize: (bytes: Buffer) => bytes,
  responseSerialize: (bytes: Buffer) => bytes,
  responseDeserialize: (bytes: Buffer) => bytes,
  originalName: 'report',
};
