// Pins the Envoy wire: canonical messages encoded by the generated code must equal bytes written
// here by hand from ../shared/envoy-wire-contract.md (tag = field number << 3 | wire type; wire
// type 0 varint, 2 length-delimited), and those bytes must decode back to the same messages. A
// renumbered field, a changed type or a renamed package, service or method fails this file. No
// Envoy binary can run here, so these bytes stand in for one.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { create, type DescMessage, fromBinary, type MessageShape, toBinary } from '@bufbuild/protobuf';
import { DurationSchema, TimestampSchema } from '@bufbuild/protobuf/wkt';
import {
  LocalRateLimitDescriptorSchema,
  RateLimitDescriptorSchema,
  VhRateLimitsOptions,
  XRateLimitHeadersRFCVersion,
} from '../../src/gen/envoy/extensions/common/ratelimit/v3/ratelimit_pb.js';
import {
  BucketIdSchema,
  RateLimitQuotaResponseSchema,
  RateLimitQuotaService,
  RateLimitQuotaUsageReportsSchema,
} from '../../src/gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import {
  RateLimitRequestSchema,
  RateLimitResponse_Code,
  RateLimitResponse_RateLimit_Unit,
  RateLimitResponseSchema,
  RateLimitService,
} from '../../src/gen/envoy/service/ratelimit/v3/rls_pb.js';
import {
  RateLimitStrategy_BlanketRule,
  RateLimitStrategySchema,
} from '../../src/gen/envoy/type/v3/ratelimit_strategy_pb.js';
import { RateLimitUnit } from '../../src/gen/envoy/type/v3/ratelimit_unit_pb.js';
import { TokenBucketSchema } from '../../src/gen/envoy/type/v3/token_bucket_pb.js';

/** The bytes of an ASCII string, spelled out so the byte arrays below stay readable. */
const ascii = (text: string): number[] => [...text].map((c) => c.charCodeAt(0));

function pins<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>, bytes: number[]): void {
  assert.deepEqual([...toBinary(schema, message)], bytes, `${schema.typeName} encodes to the pinned bytes`);
  assert.deepEqual(
    fromBinary(schema, new Uint8Array(bytes)),
    message,
    `${schema.typeName} decodes them back`,
  );
}

describe('RLS wire (envoy.service.ratelimit.v3)', () => {
  it('names the service and its unary method as Envoy calls them', () => {
    assert.equal(RateLimitService.typeName, 'envoy.service.ratelimit.v3.RateLimitService');
    const method = RateLimitService.method.shouldRateLimit;
    assert.equal(
      `/${RateLimitService.typeName}/${method.name}`,
      '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit',
    );
    assert.equal(method.methodKind, 'unary');
    assert.equal(method.input.typeName, 'envoy.service.ratelimit.v3.RateLimitRequest');
    assert.equal(method.output.typeName, 'envoy.service.ratelimit.v3.RateLimitResponse');
    assert.equal(
      RateLimitDescriptorSchema.typeName,
      'envoy.extensions.common.ratelimit.v3.RateLimitDescriptor',
    );
  });

  it('RateLimitRequest: domain 1, descriptors 2 (entries 1, limit 2, hits_addend 3), hits_addend 3', () => {
    const message = create(RateLimitRequestSchema, {
      domain: 'envoy',
      descriptors: [
        {
          entries: [{ key: 'k', value: 'v' }],
          limit: { requestsPerUnit: 10, unit: RateLimitUnit.MINUTE },
          hitsAddend: 3n,
        },
      ],
      hitsAddend: 5,
    });
    // biome-ignore format: one line per field, as the contract lists them
    const bytes = [
      0x0a, 0x05, ...ascii('envoy'), // 1 domain, LEN
      0x12, 0x12, // 2 descriptors, LEN 18
      0x0a, 0x06, 0x0a, 0x01, ...ascii('k'), 0x12, 0x01, ...ascii('v'), // 1 entries {1 key, 2 value}
      0x12, 0x04, 0x08, 0x0a, 0x10, 0x02, // 2 limit {1 requests_per_unit 10, 2 unit MINUTE}
      0x1a, 0x02, 0x08, 0x03, // 3 hits_addend UInt64Value {1 value 3}
      0x18, 0x05, // 3 hits_addend, varint
    ];
    pins(RateLimitRequestSchema, message, bytes);
  });

  it('a descriptor hits_addend of 0 is present on the wire (check only), unlike an absent one', () => {
    const zero = create(RateLimitDescriptorSchema, {
      entries: [{ key: 'k', value: '' }],
      hitsAddend: 0n,
    });
    pins(RateLimitDescriptorSchema, zero, [0x0a, 0x03, 0x0a, 0x01, ...ascii('k'), 0x1a, 0x00]);
  });

  it('RateLimitResponse: fields 1 to 7, DescriptorStatus 1 to 5, RateLimit 1 to 3', () => {
    const message = create(RateLimitResponseSchema, {
      overallCode: RateLimitResponse_Code.OVER_LIMIT,
      statuses: [
        {
          code: RateLimitResponse_Code.OVER_LIMIT,
          currentLimit: { name: 'n', requestsPerUnit: 10, unit: RateLimitResponse_RateLimit_Unit.WEEK },
          limitRemaining: 4,
          durationUntilReset: create(DurationSchema, { seconds: 30n }),
          quota: {
            requests: 1,
            expirationSpecifier: { case: 'validUntil', value: create(TimestampSchema, { seconds: 1n }) },
            id: 'q',
          },
        },
      ],
      responseHeadersToAdd: [{ key: 'a', value: 'b', rawValue: new Uint8Array([0xff]) }],
      requestHeadersToAdd: [{ key: 'c', value: 'd' }],
      rawBody: new Uint8Array(ascii('x')),
      // protobuf-es holds a google.protobuf.Struct field as the JSON object it stands for.
      dynamicMetadata: { k: true },
      quota: { requests: 2 },
    });
    // biome-ignore format: one line per field, as the contract lists them
    const bytes = [
      0x08, 0x02, // 1 overall_code OVER_LIMIT
      0x12, 0x1c, // 2 statuses, LEN 28
      0x08, 0x02, // 1 code OVER_LIMIT
      0x12, 0x07, 0x08, 0x0a, 0x10, 0x07, 0x1a, 0x01, ...ascii('n'), // 2 current_limit {1 rpu 10, 2 unit WEEK=7, 3 name}
      0x18, 0x04, // 3 limit_remaining 4
      0x22, 0x02, 0x08, 0x1e, // 4 duration_until_reset {1 seconds 30}
      0x2a, 0x09, 0x08, 0x01, 0x12, 0x02, 0x08, 0x01, 0x1a, 0x01, ...ascii('q'), // 5 quota {1, 2 valid_until, 3 id}
      0x1a, 0x09, 0x0a, 0x01, ...ascii('a'), 0x12, 0x01, ...ascii('b'), 0x1a, 0x01, 0xff, // 3 response_headers_to_add
      0x22, 0x06, 0x0a, 0x01, ...ascii('c'), 0x12, 0x01, ...ascii('d'), // 4 request_headers_to_add
      0x2a, 0x01, ...ascii('x'), // 5 raw_body
      0x32, 0x09, 0x0a, 0x07, 0x0a, 0x01, ...ascii('k'), 0x12, 0x02, 0x20, 0x01, // 6 dynamic_metadata Struct
      0x3a, 0x02, 0x08, 0x02, // 7 quota {1 requests 2}
    ];
    pins(RateLimitResponseSchema, message, bytes);
  });

  it('Code and both unit enums carry the contract numbers (WEEK is 7 in RateLimit.Unit only)', () => {
    assert.deepEqual(
      [RateLimitResponse_Code.UNKNOWN, RateLimitResponse_Code.OK, RateLimitResponse_Code.OVER_LIMIT],
      [0, 1, 2],
    );
    const U = RateLimitResponse_RateLimit_Unit;
    assert.deepEqual(
      [U.UNKNOWN, U.SECOND, U.MINUTE, U.HOUR, U.DAY, U.MONTH, U.YEAR, U.WEEK],
      [0, 1, 2, 3, 4, 5, 6, 7],
    );
    const T = RateLimitUnit;
    assert.deepEqual([T.UNKNOWN, T.SECOND, T.MINUTE, T.HOUR, T.DAY, T.MONTH, T.YEAR], [0, 1, 2, 3, 4, 5, 6]);
    assert.equal(Object.keys(T).includes('WEEK'), false);
    assert.deepEqual([XRateLimitHeadersRFCVersion.OFF, XRateLimitHeadersRFCVersion.DRAFT_VERSION_03], [0, 1]);
    assert.deepEqual(
      [VhRateLimitsOptions.OVERRIDE, VhRateLimitsOptions.INCLUDE, VhRateLimitsOptions.IGNORE],
      [0, 1, 2],
    );
  });

  it('LocalRateLimitDescriptor: entries 1, token_bucket 2, shadow_mode 3', () => {
    const message = create(LocalRateLimitDescriptorSchema, {
      entries: [{ key: 'k', value: 'v' }],
      tokenBucket: { maxTokens: 1 },
      shadowMode: true,
    });
    // biome-ignore format: one line per field, as the contract lists them
    const bytes = [
      0x0a, 0x06, 0x0a, 0x01, ...ascii('k'), 0x12, 0x01, ...ascii('v'), // 1 entries {1 key, 2 value}
      0x12, 0x02, 0x08, 0x01, // 2 token_bucket {1 max_tokens 1}
      0x18, 0x01, // 3 shadow_mode true
    ];
    pins(LocalRateLimitDescriptorSchema, message, bytes);
  });
});

describe('RLQS wire (envoy.service.rate_limit_quota.v3)', () => {
  it('names the service and its bidirectional streaming method as Envoy calls them', () => {
    assert.equal(RateLimitQuotaService.typeName, 'envoy.service.rate_limit_quota.v3.RateLimitQuotaService');
    const method = RateLimitQuotaService.method.streamRateLimitQuotas;
    assert.equal(
      `/${RateLimitQuotaService.typeName}/${method.name}`,
      '/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas',
    );
    assert.equal(method.methodKind, 'bidi_streaming');
    assert.equal(method.input.typeName, 'envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports');
    assert.equal(method.output.typeName, 'envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse');
  });

  it('RateLimitQuotaUsageReports: domain 1, usages 2 (bucket_id 1, time_elapsed 2, allowed 3, denied 4)', () => {
    const message = create(RateLimitQuotaUsageReportsSchema, {
      domain: 'd',
      bucketQuotaUsages: [
        {
          bucketId: { bucket: { n: 'v' } },
          timeElapsed: create(DurationSchema, { seconds: 1n, nanos: 500_000_000 }),
          numRequestsAllowed: 7n,
          numRequestsDenied: 300n,
        },
      ],
    });
    // biome-ignore format: one line per field, as the contract lists them
    const bytes = [
      0x0a, 0x01, ...ascii('d'), // 1 domain
      0x12, 0x19, // 2 bucket_quota_usages, LEN 25
      0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, ...ascii('n'), 0x12, 0x01, ...ascii('v'), // 1 bucket_id {1 map entry}
      0x12, 0x08, 0x08, 0x01, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01, // 2 time_elapsed {1 s, 2 nanos 5e8}
      0x18, 0x07, // 3 num_requests_allowed
      0x20, 0xac, 0x02, // 4 num_requests_denied 300
    ];
    pins(RateLimitQuotaUsageReportsSchema, message, bytes);
  });

  it('RateLimitQuotaResponse: actions 1 (bucket_id 1, assignment 2 {ttl 2, strategy 3}, abandon 3)', () => {
    const bucketId = create(BucketIdSchema, { bucket: { n: 'v' } });
    const idBytes = [0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, ...ascii('n'), 0x12, 0x01, ...ascii('v')];
    const message = create(RateLimitQuotaResponseSchema, {
      bucketAction: [
        {
          bucketId,
          bucketAction: {
            case: 'quotaAssignmentAction',
            value: {
              assignmentTimeToLive: create(DurationSchema, { seconds: 2n }),
              rateLimitStrategy: {
                strategy: {
                  case: 'tokenBucket',
                  value: {
                    maxTokens: 10,
                    tokensPerFill: 5,
                    fillInterval: create(DurationSchema, { seconds: 1n }),
                  },
                },
              },
            },
          },
        },
        { bucketId, bucketAction: { case: 'abandonAction', value: {} } },
      ],
    });
    // biome-ignore format: one line per field, as the contract lists them
    const bytes = [
      0x0a, 0x1e, ...idBytes, // 1 bucket_action, LEN 30; its 1 bucket_id
      0x12, 0x12, // 2 quota_assignment_action, LEN 18
      0x12, 0x02, 0x08, 0x02, // 2 assignment_time_to_live {1 seconds 2}
      0x1a, 0x0c, 0x1a, 0x0a, // 3 rate_limit_strategy {3 token_bucket, LEN 10}
      0x08, 0x0a, 0x12, 0x02, 0x08, 0x05, 0x1a, 0x02, 0x08, 0x01, // {1 max_tokens 10, 2 tokens_per_fill {5}, 3 fill_interval {1 s}}
      0x0a, 0x0c, ...idBytes, 0x1a, 0x00, // 1 bucket_action: bucket_id, 3 abandon_action (empty)
    ];
    pins(RateLimitQuotaResponseSchema, message, bytes);
  });

  it('RateLimitStrategy: blanket_rule 1 (ALLOW_ALL 0 still on the wire), requests_per_time_unit 2, token_bucket 3', () => {
    pins(
      RateLimitStrategySchema,
      create(RateLimitStrategySchema, {
        strategy: { case: 'blanketRule', value: RateLimitStrategy_BlanketRule.ALLOW_ALL },
      }),
      [0x08, 0x00],
    );
    pins(
      RateLimitStrategySchema,
      create(RateLimitStrategySchema, {
        strategy: { case: 'blanketRule', value: RateLimitStrategy_BlanketRule.DENY_ALL },
      }),
      [0x08, 0x01],
    );
    pins(
      RateLimitStrategySchema,
      create(RateLimitStrategySchema, {
        strategy: {
          case: 'requestsPerTimeUnit',
          value: { requestsPerTimeUnit: 100n, timeUnit: RateLimitUnit.MINUTE },
        },
      }),
      [0x12, 0x04, 0x08, 0x64, 0x10, 0x02],
    );
    pins(
      TokenBucketSchema,
      create(TokenBucketSchema, { maxTokens: 4294967295 }),
      [0x08, 0xff, 0xff, 0xff, 0xff, 0x0f],
    );
  });
});
