import { ErrorCode, SpillwayError } from '../core/errors.js';
import type { Directive, ReportRequest, ReportResponse } from '../gen/spillway/v1/control_pb.js';

/**
 * Hand-written protobuf codec for the two messages a receiving tier handles per report: decoding a
 * `ReportRequest` and encoding a `ReportResponse`. Byte-for-byte the same wire format as
 * protobuf-es's reflective `fromBinary` / `toBinary` (test/control/report-codec.test.ts proves it on
 * random messages), and faster, because an aggregator spends most of its time here
 * (bench/results/control.md). Transports may use either; proto/spillway/v1/control.proto stays the
 * single source of the format. Unknown fields are skipped, as proto3 requires.
 */

const textDecoder = new TextDecoder();
const textEncoder = new TextEncoder();

class Reader {
  pos = 0;
  readonly view: DataView;
  constructor(readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** A varint as a number; exact up to 2^53, which every uint32/enum/length is. */
  varint(): number {
    let result = 0;
    let multiplier = 1;
    for (let i = 0; i < 10; i++) {
      const byte = this.byte();
      result += (byte & 0x7f) * multiplier;
      if (byte < 0x80) return result;
      multiplier *= 128;
    }
    throw malformed('varint longer than 10 bytes');
  }

  /**
   * A varint's low 32 bits, as protobuf reads a uint32 (or, `| 0`, an int32 or enum) from a varint of
   * any length: a negative enum is sent as ten bytes, which `varint()` could not hold exactly. The
   * low 32 bits are all in the first five bytes.
   */
  uint32(): number {
    let result = 0;
    for (let i = 0; i < 10; i++) {
      const byte = this.byte();
      if (i < 5) result = (result | ((byte & 0x7f) << (7 * i))) >>> 0;
      if (byte < 0x80) return result;
    }
    throw malformed('varint longer than 10 bytes');
  }

  /** A varint as a 64-bit two's complement value. */
  varint64(signed: boolean): bigint {
    const start = this.pos;
    let small = 0;
    let multiplier = 1;
    for (let i = 0; i < 7; i++) {
      const byte = this.byte();
      small += (byte & 0x7f) * multiplier;
      if (byte < 0x80) return BigInt(small);
      multiplier *= 128;
    }
    this.pos = start;
    let result = 0n;
    let shift = 0n;
    for (let i = 0; i < 10; i++) {
      const byte = this.byte();
      result |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return signed ? BigInt.asIntN(64, result) : BigInt.asUintN(64, result);
      shift += 7n;
    }
    throw malformed('varint longer than 10 bytes');
  }

  byte(): number {
    if (this.pos >= this.bytes.length) throw malformed('truncated message');
    return this.bytes[this.pos++]!;
  }

  double(): number {
    if (this.pos + 8 > this.bytes.length) throw malformed('truncated double');
    const value = this.view.getFloat64(this.pos, true);
    this.pos += 8;
    return value;
  }

  /** The end offset of a length-delimited field starting here. */
  lengthEnd(): number {
    const length = this.varint();
    const end = this.pos + length;
    if (end > this.bytes.length) throw malformed('truncated length-delimited field');
    return end;
  }

  string(): string {
    const end = this.lengthEnd();
    const bytes = this.bytes;
    let out = '';
    if (end - this.pos <= 64) {
      let ascii = true;
      for (let i = this.pos; i < end; i++) {
        const byte = bytes[i]!;
        if (byte >= 0x80) {
          ascii = false;
          break;
        }
        out += String.fromCharCode(byte);
      }
      if (ascii) {
        this.pos = end;
        return out;
      }
    }
    out = textDecoder.decode(bytes.subarray(this.pos, end));
    this.pos = end;
    return out;
  }

  /** Skips one field's value; `field` closes a group (wire type 3) as protobuf-es does. */
  skip(wireType: number, field = 0): void {
    switch (wireType) {
      case 3:
        // A group (proto2's, never in this protocol): skip its fields up to its end tag.
        for (;;) {
          const tag = this.varint();
          if ((tag & 7) === 4) {
            if (Math.floor(tag / 8) !== field) throw malformed('mismatched end of group');
            return;
          }
          this.skip(tag & 7, Math.floor(tag / 8));
        }
      case 0:
        this.varint64(false);
        return;
      case 1:
        this.pos += 8;
        break;
      case 2:
        this.pos = this.lengthEnd();
        return;
      case 5:
        this.pos += 4;
        break;
      default:
        throw malformed(`unsupported wire type ${wireType}`);
    }
    if (this.pos > this.bytes.length) throw malformed('truncated field');
  }
}

function malformed(reason: string): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidReport, `report could not be decoded: ${reason}`, {
    field: 'bytes',
  });
}

/**
 * A request's `auth_token` (field 10; the last one, as proto3 merges), read without decoding
 * anything else, so a receiver can refuse a stranger before spending work on the rest. Throws
 * ERR_SPILLWAY_INVALID_REPORT on malformed bytes.
 */
export function readReportAuthToken(bytes: Uint8Array): string {
  const reader = new Reader(bytes);
  let token = '';
  while (reader.pos < bytes.length) {
    const tag = reader.varint();
    if (tag === AUTH_TOKEN_TAG) token = reader.string();
    else reader.skip(tag & 7, Math.floor(tag / 8));
  }
  return token;
}

/** Field 10, wire type 2 (length-delimited). */
const AUTH_TOKEN_TAG = (10 << 3) | 2;

/**
 * Decode a ReportRequest. Throws ERR_SPILLWAY_INVALID_REPORT on malformed bytes, and on more than
 * `maxBuckets` buckets as soon as the next one is met: a 4 MiB request of empty entries would
 * otherwise become two million objects before any bound could refuse it. The result is a plain
 * protobuf-es message object (usable with `toBinary`, `create`...), without `$unknown`.
 */
export function decodeReportRequest(bytes: Uint8Array, maxBuckets = Number.POSITIVE_INFINITY): ReportRequest {
  const reader = new Reader(bytes);
  const request: ReportRequest = {
    $typeName: 'spillway.v1.ReportRequest',
    reporterId: '',
    tier: 0,
    zone: '',
    region: '',
    sequence: 0n,
    windowStartMs: 0n,
    windowEndMs: 0n,
    buckets: [],
    hostCount: 0,
    authToken: '',
    acknowledgedBy: '',
    acknowledgedWindowEndMs: 0n,
  };
  while (reader.pos < bytes.length) {
    const tag = reader.varint();
    const field = Math.floor(tag / 8);
    const wireType = tag & 7;
    switch (wireType === 2 || wireType === 0 ? field : 0) {
      case 1:
        if (wireType !== 2) break;
        request.reporterId = reader.string();
        continue;
      case 2:
        if (wireType !== 0) break;
        request.tier = reader.uint32() | 0;
        continue;
      case 3:
        if (wireType !== 2) break;
        request.zone = reader.string();
        continue;
      case 4:
        if (wireType !== 2) break;
        request.region = reader.string();
        continue;
      case 5:
        if (wireType !== 0) break;
        request.sequence = reader.varint64(false);
        continue;
      case 6:
        if (wireType !== 0) break;
        request.windowStartMs = reader.varint64(true);
        continue;
      case 7:
        if (wireType !== 0) break;
        request.windowEndMs = reader.varint64(true);
        continue;
      case 8:
        if (wireType !== 2) break;
        if (request.buckets.length >= maxBuckets) {
          throw new SpillwayError(ErrorCode.InvalidReport, `report has more than ${maxBuckets} buckets`, {
            field: 'buckets',
            maxBuckets,
          });
        }
        request.buckets.push(decodeBucketUsage(reader, reader.lengthEnd()));
        continue;
      case 9:
        if (wireType !== 0) break;
        request.hostCount = reader.uint32();
        continue;
      case 10:
        if (wireType !== 2) break;
        request.authToken = reader.string();
        continue;
      case 11:
        if (wireType !== 2) break;
        request.acknowledgedBy = reader.string();
        continue;
      case 12:
        if (wireType !== 0) break;
        request.acknowledgedWindowEndMs = reader.varint64(true);
        continue;
    }
    reader.skip(wireType, field);
  }
  return request;
}

function decodeBucketUsage(reader: Reader, end: number): ReportRequest['buckets'][number] {
  const usage: ReportRequest['buckets'][number] = {
    $typeName: 'spillway.v1.BucketUsage',
    bucket: '',
    offered: 0,
    admitted: 0,
    wouldDrop: 0,
    heldEpoch: 0n,
  };
  while (reader.pos < end) {
    const tag = reader.varint();
    const field = Math.floor(tag / 8);
    const wireType = tag & 7;
    if (field === 1 && wireType === 2) usage.bucket = reader.string();
    else if (field === 2 && wireType === 1) usage.offered = reader.double();
    else if (field === 3 && wireType === 1) usage.admitted = reader.double();
    else if (field === 4 && wireType === 1) usage.wouldDrop = reader.double();
    else if (field === 5 && wireType === 0) usage.heldEpoch = reader.varint64(false);
    else reader.skip(wireType, field);
  }
  if (reader.pos !== end) throw malformed('bucket usage overruns its length');
  return usage;
}

class Writer {
  pos = 0;
  readonly bytes: Uint8Array;
  readonly view: DataView;
  constructor(size: number) {
    this.bytes = new Uint8Array(size);
    this.view = new DataView(this.bytes.buffer);
  }

  varint(value: number): void {
    while (value >= 0x80) {
      this.bytes[this.pos++] = (value % 128) | 0x80;
      value = Math.floor(value / 128);
    }
    this.bytes[this.pos++] = value;
  }

  varint64(value: bigint): void {
    let v = BigInt.asUintN(64, value);
    while (v >= 0x80n) {
      this.bytes[this.pos++] = Number(v & 0x7fn) | 0x80;
      v >>= 7n;
    }
    this.bytes[this.pos++] = Number(v);
  }

  double(value: number): void {
    this.view.setFloat64(this.pos, value, true);
    this.pos += 8;
  }

  string(value: string, byteLength: number): void {
    this.varint(byteLength);
    if (byteLength === value.length) {
      for (let i = 0; i < value.length; i++) this.bytes[this.pos++] = value.charCodeAt(i);
    } else {
      textEncoder.encodeInto(value, this.bytes.subarray(this.pos, this.pos + byteLength));
      this.pos += byteLength;
    }
  }
}

function varintSize(value: number): number {
  let size = 1;
  while (value >= 0x80) {
    value = Math.floor(value / 128);
    size++;
  }
  return size;
}

function varint64Size(value: bigint): number {
  let v = BigInt.asUintN(64, value);
  let size = 1;
  while (v >= 0x80n) {
    v >>= 7n;
    size++;
  }
  return size;
}

function utf8Length(text: string): number {
  let length = text.length;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x80) continue;
    if (code < 0x800) length += 1;
    else if (code >= 0xd800 && code <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        length += 2;
        i++;
      } else length += 2;
    } else length += 2;
  }
  return length;
}

/** Field sizes of one directive, proto3 implicit presence (defaults are not written). */
function directiveSize(d: Directive, bucketBytes: number): number {
  let size = 0;
  if (d.bucket !== '') size += 1 + varintSize(bucketBytes) + bucketBytes;
  if (d.dropRatio !== 0) size += 9;
  if (d.mode !== 0) size += 1 + (d.mode < 0 ? 10 : varintSize(d.mode));
  if (d.limitRps !== 0) size += 9;
  if (d.offeredRps !== 0) size += 9;
  if (d.epoch !== 0n) size += 1 + varint64Size(d.epoch);
  if (d.version !== 0n) size += 1 + varint64Size(d.version);
  if (d.ttlMs !== 0) size += 1 + varintSize(d.ttlMs >>> 0);
  return size;
}

/** Encode a ReportResponse exactly as `toBinary(ReportResponseSchema, response)` does. */
export function encodeReportResponse(response: ReportResponse): Uint8Array {
  const directives = response.directives;
  const bucketBytes = new Array<number>(directives.length);
  const sizes = new Array<number>(directives.length);
  let total = 0;
  for (let i = 0; i < directives.length; i++) {
    const d = directives[i]!;
    bucketBytes[i] = utf8Length(d.bucket);
    const size = directiveSize(d, bucketBytes[i]!);
    sizes[i] = size;
    total += 1 + varintSize(size) + size;
  }
  if (response.reportIntervalMs !== 0) total += 1 + varintSize(response.reportIntervalMs >>> 0);
  if (response.epoch !== 0n) total += 1 + varint64Size(response.epoch);
  const responderBytes = utf8Length(response.responderId);
  if (response.responderId !== '') total += 1 + varintSize(responderBytes) + responderBytes;

  const w = new Writer(total);
  for (let i = 0; i < directives.length; i++) {
    const d = directives[i]!;
    w.bytes[w.pos++] = 0x0a; // field 1, LEN
    w.varint(sizes[i]!);
    if (d.bucket !== '') {
      w.bytes[w.pos++] = 0x0a;
      w.string(d.bucket, bucketBytes[i]!);
    }
    if (d.dropRatio !== 0) {
      w.bytes[w.pos++] = 0x11; // field 2, I64
      w.double(d.dropRatio);
    }
    if (d.mode !== 0) {
      w.bytes[w.pos++] = 0x18; // field 3, VARINT
      if (d.mode < 0) w.varint64(BigInt(d.mode));
      else w.varint(d.mode);
    }
    if (d.limitRps !== 0) {
      w.bytes[w.pos++] = 0x21; // field 4, I64
      w.double(d.limitRps);
    }
    if (d.offeredRps !== 0) {
      w.bytes[w.pos++] = 0x29; // field 5, I64
      w.double(d.offeredRps);
    }
    if (d.epoch !== 0n) {
      w.bytes[w.pos++] = 0x30; // field 6, VARINT
      w.varint64(d.epoch);
    }
    if (d.version !== 0n) {
      w.bytes[w.pos++] = 0x38; // field 7, VARINT
      w.varint64(d.version);
    }
    if (d.ttlMs !== 0) {
      w.bytes[w.pos++] = 0x40; // field 8, VARINT
      w.varint(d.ttlMs >>> 0);
    }
  }
  if (response.reportIntervalMs !== 0) {
    w.bytes[w.pos++] = 0x10; // field 2, VARINT
    w.varint(response.reportIntervalMs >>> 0);
  }
  if (response.epoch !== 0n) {
    w.bytes[w.pos++] = 0x18; // field 3, VARINT
    w.varint64(response.epoch);
  }
  if (response.responderId !== '') {
    w.bytes[w.pos++] = 0x22; // field 4, LEN
    w.string(response.responderId, responderBytes);
  }
  return w.bytes;
}
