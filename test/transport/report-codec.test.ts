import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import fc from 'fast-check';
import { isSpillwayError } from '../../src/core/errors.js';
import {
  DirectiveSchema,
  ReportRequestSchema,
  ReportResponseSchema,
} from '../../src/gen/spillway/v1/control_pb.js';
import {
  decodeReportRequest,
  encodeReportResponse,
  readReportAuthToken,
} from '../../src/transport/report-codec.js';

const text = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 20 }),
  fc.constant(''),
);
const double = fc.oneof(
  fc.double(),
  fc.constant(0),
  fc.constant(-0),
  fc.double({ min: 0, max: 1e9, noNaN: true }),
);
const int64 = fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n });
const uint64 = fc.oneof(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), fc.bigInt({ min: 0n, max: 2n ** 40n }));

const requestArb = fc.record({
  reporterId: text,
  tier: fc.integer({ min: 0, max: 3 }),
  zone: text,
  region: text,
  sequence: uint64,
  windowStartMs: int64,
  windowEndMs: int64,
  hostCount: fc.nat({ max: 2 ** 32 - 1 }),
  authToken: text,
  acknowledgedBy: text,
  acknowledgedWindowEndMs: int64,
  buckets: fc.array(
    fc.record({ bucket: text, offered: double, admitted: double, wouldDrop: double, heldEpoch: uint64 }),
    {
      maxLength: 8,
    },
  ),
});

const responseArb = fc.record({
  reportIntervalMs: fc.nat({ max: 2 ** 32 - 1 }),
  epoch: uint64,
  responderId: text,
  directives: fc.array(
    fc.record({
      bucket: text,
      dropRatio: double,
      mode: fc.integer({ min: -3, max: 5 }),
      limitRps: double,
      offeredRps: double,
      epoch: uint64,
      version: uint64,
      ttlMs: fc.nat({ max: 2 ** 32 - 1 }),
    }),
    { maxLength: 8 },
  ),
});

describe('report codec (hand-written, wire-identical to protobuf-es)', () => {
  it('decodeReportRequest reads what toBinary writes, as fromBinary does', () => {
    fc.assert(
      fc.property(requestArb, (init) => {
        const bytes = toBinary(ReportRequestSchema, create(ReportRequestSchema, init));
        const ours = decodeReportRequest(bytes);
        const theirs = fromBinary(ReportRequestSchema, bytes);
        // Compare by re-encoding: NaN-safe and exact for -0.
        assert.deepEqual(toBinary(ReportRequestSchema, ours), toBinary(ReportRequestSchema, theirs));
        assert.equal(ours.buckets.length, theirs.buckets.length);
        assert.equal(ours.sequence, theirs.sequence);
        assert.equal(ours.windowStartMs, theirs.windowStartMs);
        assert.equal(ours.acknowledgedWindowEndMs, theirs.acknowledgedWindowEndMs);
        assert.equal(readReportAuthToken(bytes), theirs.authToken);
        if (theirs.buckets.length > 0) {
          assert.throws(
            () => decodeReportRequest(bytes, theirs.buckets.length - 1),
            (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'),
          );
        }
        assert.equal(decodeReportRequest(bytes, theirs.buckets.length).buckets.length, theirs.buckets.length);
      }),
      { numRuns: 500 },
    );
  });

  it('encodeReportResponse writes the same bytes as toBinary', () => {
    fc.assert(
      fc.property(responseArb, (init) => {
        const message = create(ReportResponseSchema, {
          ...init,
          directives: init.directives.map((d) => create(DirectiveSchema, d)),
        });
        assert.deepEqual(encodeReportResponse(message), toBinary(ReportResponseSchema, message));
      }),
      { numRuns: 500 },
    );
  });

  it('reads valid but unusual encodings as protobuf-es does: 10-byte enums, over-long uint32, groups', () => {
    const tenBytes = (low: number) => [low, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    const cases: number[][] = [
      [0x10, ...tenBytes(0xff)], // tier = -1, as every int32 enum below zero is sent
      [0x48, ...tenBytes(0x85)], // host_count: uint32 keeps the low 32 bits
      [0xa3, 0x01, 0xa4, 0x01, 0x0a, 0x01, 0x68], // an empty group as unknown field 20, then reporter_id
      [0xa3, 0x01, 0x08, 0x05, 0xab, 0x01, 0xac, 0x01, 0xa4, 0x01, 0x0a, 0x01, 0x68], // nested groups
    ];
    for (const bytes of cases) {
      const wire = new Uint8Array(bytes);
      const ours = decodeReportRequest(wire);
      const theirs = fromBinary(ReportRequestSchema, wire);
      assert.equal(ours.tier, theirs.tier, String(bytes));
      assert.equal(ours.hostCount, theirs.hostCount, String(bytes));
      assert.equal(ours.reporterId, theirs.reporterId, String(bytes));
    }
    // A group closed by another field's end tag is malformed, as protobuf-es says too.
    const mismatched = new Uint8Array([0xa3, 0x01, 0xac, 0x01]);
    assert.throws(() => fromBinary(ReportRequestSchema, mismatched));
    assert.throws(
      () => decodeReportRequest(mismatched),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'),
    );
  });

  it('skips unknown fields and refuses truncated bytes with ERR_SPILLWAY_INVALID_REPORT', () => {
    const bytes = toBinary(
      ReportRequestSchema,
      create(ReportRequestSchema, { reporterId: 'h', buckets: [{ bucket: 'a', offered: 1 }] }),
    );
    // Field 15 (varint 7) and field 16 (LEN "xy") appended: unknown to this schema version.
    const withUnknown = new Uint8Array([...bytes, 0x78, 0x07, 0x82, 0x01, 0x02, 0x78, 0x79]);
    const decoded = decodeReportRequest(withUnknown);
    assert.equal(decoded.reporterId, 'h');
    assert.equal(decoded.buckets[0]!.offered, 1);
    assert.throws(
      () => decodeReportRequest(bytes.subarray(0, bytes.length - 3)),
      (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'),
    );
  });
});
