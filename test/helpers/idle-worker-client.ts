// Run as a script by test/transport/worker-control-client.test.ts: reports once through a
// worker-thread client to the address in argv[2], then leaves the client open and returns. The
// process must exit on its own, as it would with the in-thread client.
import { create } from '@bufbuild/protobuf';
import { ReportRequestSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createWorkerControlClient } from '../../src/transport/worker-control-client.js';

const client = createWorkerControlClient(process.argv[2]!);
await client.whenReady();
const response = await client.report(create(ReportRequestSchema, { reporterId: 'idle', zone: 'z1' }), {
  timeoutMs: 5_000,
});
process.stdout.write(`reported ${response.responderId}\n`);
