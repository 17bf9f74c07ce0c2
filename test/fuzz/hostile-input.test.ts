import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { fromBinary, toBinary } from '@bufbuild/protobuf';
import fc from 'fast-check';
import { stringify } from 'yaml';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { isSpillwayError, type SpillwayError } from '../../src/core/errors.js';
import { ReportRequestSchema } from '../../src/gen/spillway/v1/control_pb.js';
import { createClientAddressResolver } from '../../src/http/client-address.js';
import { formatRateLimit, formatRateLimitPolicy } from '../../src/http/rate-limit-headers.js';
import { validateReport } from '../../src/protocol/validate-report.js';
import { decodeReportRequest } from '../../src/transport/report-codec.js';

// Whatever arrives from outside (report bytes, a limits file, HTTP headers) ends in a valid value
// or a SpillwayError with the stable code for that input, never another exception, and never a
// value outside its documented shape.

const RUNS = 2_000;

/** Bytes that are mostly a valid report, mutated: reaches deeper than uniform noise. */
const mutatedReport = fc
  .record({
    reporterId: fc.string({ maxLength: 40 }),
    zone: fc.string({ maxLength: 8 }),
    sequence: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
    start: fc.bigInt({ min: -(1n << 40n), max: 1n << 40n }),
    windowMs: fc.bigInt({ min: -10n, max: 100_000n }),
    acknowledgedBy: fc.oneof(fc.constant(''), fc.string({ maxLength: 300 })),
    acknowledgedWindowEndMs: fc.bigInt({ min: -(1n << 63n), max: (1n << 63n) - 1n }),
    buckets: fc.array(
      fc.record({
        bucket: fc.string({ maxLength: 20 }),
        offered: fc.double(),
        admitted: fc.double(),
        wouldDrop: fc.double(),
      }),
      { maxLength: 6 },
    ),
    flips: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
    cut: fc.nat(),
  })
  .map(({ start, windowMs, flips, cut, ...fields }) => {
    const bytes = toBinary(ReportRequestSchema, {
      $typeName: 'spillway.v1.ReportRequest',
      tier: 1,
      region: '',
      hostCount: 1,
      authToken: '',
      windowStartMs: start,
      windowEndMs: start + windowMs,
      ...fields,
      buckets: fields.buckets.map((b) => ({
        $typeName: 'spillway.v1.BucketUsage' as const,
        heldEpoch: 0n,
        ...b,
      })),
    });
    for (const [at, value] of flips) if (bytes.length > 0) bytes[at % bytes.length] = value;
    return cut % 4 === 0 ? bytes.subarray(0, cut % (bytes.length + 1)) : bytes;
  });

function decodesOrRefuses(bytes: Uint8Array): void {
  let request: ReturnType<typeof decodeReportRequest>;
  try {
    request = decodeReportRequest(bytes);
  } catch (error) {
    assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'), `decode threw ${String(error)}`);
    return;
  }
  try {
    validateReport(request);
  } catch (error) {
    assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'), `validate threw ${String(error)}`);
    assert.equal(typeof (error as SpillwayError).details?.field, 'string', 'the refusal names a field');
    return;
  }
  // Valid: every count finite, non-negative and ordered, the window positive.
  assert.ok(request.windowEndMs > request.windowStartMs);
  for (const b of request.buckets) {
    assert.ok(Number.isFinite(b.offered) && b.offered >= 0 && b.wouldDrop >= 0);
  }
}

describe('hostile input: report bytes', () => {
  it('random bytes: the hand-written decoder decodes or refuses with ERR_SPILLWAY_INVALID_REPORT', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 512 }), decodesOrRefuses), { numRuns: RUNS });
  });

  it('mutated valid reports: decode and validate refuse with a stable code or yield a valid report', () => {
    fc.assert(fc.property(mutatedReport, decodesOrRefuses), { numRuns: RUNS });
  });

  it('protobuf-es fromBinary (the gRPC server path) never hangs; its throw is mapped to INVALID_ARGUMENT', () => {
    // fromBinary throws plain Errors (the gRPC server answers INVALID_ARGUMENT for any of them);
    // what matters here is that it returns or throws, and that what it returns validates or not.
    fc.assert(
      fc.property(fc.oneof(fc.uint8Array({ maxLength: 512 }), mutatedReport), (bytes) => {
        let request: ReturnType<typeof decodeReportRequest>;
        try {
          request = fromBinary(ReportRequestSchema, bytes);
        } catch (error) {
          assert.ok(error instanceof Error);
          return;
        }
        try {
          validateReport(request);
        } catch (error) {
          assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT'));
        }
      }),
      { numRuns: RUNS },
    );
  });
});

function parsesOrRefuses(text: string): void {
  try {
    const config = parseLimitsConfig(text, 'fuzz.yaml');
    assert.equal(config.version, 1);
    for (const rule of config.buckets) assert.ok(Number.isFinite(rule.limitRps) && rule.limitRps >= 0);
  } catch (error) {
    assert.ok(isSpillwayError(error, 'ERR_SPILLWAY_INVALID_CONFIG'), `threw ${String(error)}`);
    assert.ok(
      (error as Error).message.startsWith('fuzz.yaml'),
      `names the file: ${(error as Error).message}`,
    );
  }
}

const yamlish = fc
  .array(
    fc.oneof(
      fc.constantFrom(
        'version: 1',
        'buckets:',
        '  - key: a',
        '    limitRps: 5',
        '  - template: "x:*"',
        'intervalMs: 0',
        '&a',
        '*a',
        '<<: *a',
        '- ',
        ': ',
        '"',
        "'",
        '{',
        '[',
        '!!binary',
        '---',
        '...',
        '\t',
      ),
      fc.string({ maxLength: 20 }),
    ),
    { maxLength: 20 },
  )
  .map((lines) => lines.join('\n'));

const structure = fc.record(
  {
    version: fc.oneof(fc.constant(1), fc.anything()),
    intervalMs: fc.oneof(fc.integer(), fc.double(), fc.anything()),
    buckets: fc.oneof(
      fc.array(
        fc.record(
          {
            key: fc.oneof(fc.string({ maxLength: 300 }), fc.anything()),
            template: fc.string({ maxLength: 20 }),
            limitRps: fc.oneof(fc.double(), fc.integer(), fc.anything()),
            mode: fc.oneof(fc.constantFrom('enforce', 'shadow'), fc.string()),
            scope: fc.constantFrom('global', 'zone', 'x'),
          },
          { requiredKeys: [] },
        ),
        { maxLength: 5 },
      ),
      fc.anything(),
    ),
  },
  { requiredKeys: [] },
);

describe('hostile input: limits files', () => {
  it('YAML-ish text: a config or ERR_SPILLWAY_INVALID_CONFIG naming the file', () => {
    fc.assert(fc.property(fc.oneof(yamlish, fc.string({ maxLength: 200 })), parsesOrRefuses), {
      numRuns: RUNS,
    });
  });

  it('random structures: a config or ERR_SPILLWAY_INVALID_CONFIG', () => {
    fc.assert(
      fc.property(structure, (value) => {
        let text: string;
        try {
          text = stringify(value);
        } catch {
          return; // not representable as YAML (a cycle, a symbol): nothing to feed
        }
        parsesOrRefuses(text);
      }),
      { numRuns: RUNS },
    );
  });

  it('a billion-laughs alias bomb is refused, not expanded', () => {
    const bomb = [
      'a: &a ["x","x","x","x","x","x","x","x","x","x"]',
      ...Array.from(
        { length: 9 },
        (_, i) =>
          `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(10)
            .fill(`*${String.fromCharCode(97 + i)}`)
            .join(',')}]`,
      ),
      'version: 1',
      'buckets: *j',
    ].join('\n');
    const startedMs = performance.now();
    parsesOrRefuses(bomb);
    assert.ok(performance.now() - startedMs < 2_000, 'refused quickly');
  });
});

describe('hostile input: HTTP headers', () => {
  const resolve = createClientAddressResolver({ trustedProxies: ['loopback', 'private'] });
  const keyShape = /^(unknown|[0-9.]+(\/\d+)?|[0-9a-f:]+(\/\d+)?)$/;

  it('X-Forwarded-For: any header yields a bounded, well-formed key, never an exception', () => {
    const header = fc.oneof(
      fc.string({ maxLength: 300 }),
      fc
        .array(fc.oneof(fc.ipV4(), fc.ipV6(), fc.string({ maxLength: 20 })), { maxLength: 40 })
        .map((a) => a.join(', ')),
      fc.array(fc.string({ maxLength: 40 }), { maxLength: 5 }),
    );
    const peer = fc.oneof(
      fc.ipV4(),
      fc.ipV6(),
      fc.constantFrom('127.0.0.1', '::1', '10.1.2.3', '::ffff:10.0.0.1', ''),
      fc.string({ maxLength: 30 }),
    );
    fc.assert(
      fc.property(peer, fc.option(header, { nil: undefined }), (peerAddress, forwardedFor) => {
        const key = resolve(peerAddress, forwardedFor);
        assert.equal(typeof key, 'string');
        assert.ok(key.length <= 64, `key too long: ${key}`);
        assert.match(key, keyShape);
      }),
      { numRuns: RUNS },
    );
  });

  it('RateLimit headers: any names and numbers format to header-safe text', () => {
    const name = fc.string({ maxLength: 30, unit: 'binary' });
    const number = fc.oneof(fc.double(), fc.integer(), fc.constantFrom(Number.NaN, -1, 1e300));
    const check = (text: string) => {
      assert.match(text, /^[\x20-\x7e]*$/, 'printable ASCII only (no header injection)');
      assert.ok(!/NaN|Infinity|e\+/.test(text), `a non-integer leaked: ${text}`);
    };
    fc.assert(
      fc.property(
        fc.array(fc.record({ name, limit: number, windowSec: number, remaining: number, resetSec: number }), {
          maxLength: 4,
        }),
        (entries) => {
          check(formatRateLimitPolicy(entries));
          check(formatRateLimit(entries));
        },
      ),
      { numRuns: RUNS },
    );
  });
});
