import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { type ReportRequest, Tier } from '../../src/gen/spillway/v1/control_pb.js';
import { validateReport } from '../../src/protocol/validate-report.js';
import { hostReport } from '../control/report-fixtures.js';

function rejects(request: ReportRequest, field: string, message: RegExp, limits = {}): void {
  assert.throws(
    () => validateReport(request, limits),
    (error) =>
      isSpillwayError(error, 'ERR_SPILLWAY_INVALID_REPORT') &&
      error.details?.field === field &&
      message.test(error.message),
  );
}

const good = () =>
  hostReport({ id: 'h1', sequence: 1, endMs: 10_000, buckets: [{ bucket: 'a', offered: 10, admitted: 8 }] });

describe('validateReport', () => {
  it('accepts a well-formed report', () => {
    validateReport(good());
    validateReport(hostReport({ id: 'h1', sequence: 1, endMs: 10_000, buckets: [] }));
  });

  it('checks the reporter id', () => {
    const r = good();
    r.reporterId = '';
    rejects(r, 'reporterId', /non-empty/);
    r.reporterId = 'x'.repeat(257);
    rejects(r, 'reporterId', /longer than 256 bytes/);
    r.reporterId = 'é'.repeat(129); // 258 bytes in UTF-8, 129 characters
    rejects(r, 'reporterId', /longer than 256 bytes/);
    r.reporterId = 'é'.repeat(128);
    validateReport(r);
  });

  it('checks the acknowledging receiver: bounded as reporter ids are, its window end taken as sent', () => {
    const r = good();
    r.acknowledgedBy = 'x'.repeat(257);
    rejects(r, 'acknowledgedBy', /longer than 256 bytes/);
    r.acknowledgedBy = 'agg-a';
    // After this report's window (the sender's clock stepped back): kept, not a reason to refuse.
    r.acknowledgedWindowEndMs = r.windowEndMs + 5000n;
    validateReport(r);
  });

  it('checks the window: positive and at most 60 s', () => {
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, windowMs: 0, buckets: [] }),
      'windowEndMs',
      /positive/,
    );
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, windowMs: -10, buckets: [] }),
      'windowEndMs',
      /positive/,
    );
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 99_000, windowMs: 60_001, buckets: [] }),
      'windowEndMs',
      /60000/,
    );
    validateReport(hostReport({ id: 'h', sequence: 1, endMs: 99_000, windowMs: 60_000, buckets: [] }));
  });

  it('checks bucket keys: non-empty, bounded, unique within a report', () => {
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: [{ bucket: '', offered: 1 }] }),
      'bucket',
      /non-empty/,
    );
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: [{ bucket: 'k'.repeat(257), offered: 1 }] }),
      'bucket',
      /longer than 256/,
    );
    rejects(
      hostReport({
        id: 'h',
        sequence: 1,
        endMs: 5000,
        buckets: [
          { bucket: 'a', offered: 1 },
          { bucket: 'a', offered: 2 },
        ],
      }),
      'bucket',
      /appears twice/,
    );
  });

  it('caps buckets per report (default 10,000, configurable)', () => {
    const many = Array.from({ length: 10_001 }, (_, i) => ({ bucket: `b${i}`, offered: 1 }));
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: many }),
      'buckets',
      /10001 buckets, over the maximum 10000/,
    );
    validateReport(hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: many.slice(0, 10_000) }));
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: many.slice(0, 3) }),
      'buckets',
      /maximum 2/,
      {
        maxBucketsPerReport: 2,
      },
    );
  });

  it('checks counts: finite, >= 0, admitted <= offered, wouldDrop <= admitted', () => {
    for (const bad of [Number.NaN, -1, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
      rejects(
        hostReport({
          id: 'h',
          sequence: 1,
          endMs: 5000,
          buckets: [{ bucket: 'a', offered: bad, admitted: 0 }],
        }),
        'offered',
        /finite number >= 0/,
      );
      rejects(
        hostReport({
          id: 'h',
          sequence: 1,
          endMs: 5000,
          buckets: [{ bucket: 'a', offered: 5, admitted: bad }],
        }),
        'admitted',
        /finite number >= 0/,
      );
      rejects(
        hostReport({
          id: 'h',
          sequence: 1,
          endMs: 5000,
          buckets: [{ bucket: 'a', offered: 5, admitted: 5, wouldDrop: bad }],
        }),
        'wouldDrop',
        /finite number >= 0/,
      );
    }
    rejects(
      hostReport({ id: 'h', sequence: 1, endMs: 5000, buckets: [{ bucket: 'a', offered: 5, admitted: 6 }] }),
      'admitted',
      /exceeds offered/,
    );
    rejects(
      hostReport({
        id: 'h',
        sequence: 1,
        endMs: 5000,
        buckets: [{ bucket: 'a', offered: 5, admitted: 4, wouldDrop: 5 }],
      }),
      'wouldDrop',
      /exceeds admitted/,
    );
    // Float sums from aggregators may round a hair over: tolerated.
    validateReport(
      hostReport({
        id: 'h',
        sequence: 1,
        endMs: 5000,
        buckets: [{ bucket: 'a', offered: 0.3, admitted: 0.1 + 0.2 }],
      }),
    );
  });

  it('checks the rate a count claims: a finite count over a short window can be an infinite rate', () => {
    const hostile = hostReport({
      id: 'h1',
      sequence: 1,
      endMs: 10_000,
      windowMs: 1,
      buckets: [{ bucket: 'a', offered: 1e306 }],
    });
    assert.equal((hostile.buckets[0]!.offered * 1000) / 1, Number.POSITIVE_INFINITY);
    rejects(hostile, 'offered', /over 1000000000000 per second/);
    // A trillion a second is the default bound; a receiver may set its own.
    validateReport(
      hostReport({ id: 'h1', sequence: 1, endMs: 10_000, buckets: [{ bucket: 'a', offered: 1e12 }] }),
    );
    rejects(good(), 'offered', /over 5 per second/, { maxRatePerSec: 5 });
    // Per host a report speaks for: a zone's sum of honest hosts passes where one host's would not.
    const zone = hostReport({
      id: 'agg',
      sequence: 1,
      endMs: 10_000,
      tier: Tier.AGGREGATOR,
      hostCount: 3,
      buckets: [{ bucket: 'a', offered: 12 }],
    });
    validateReport(zone, { maxRatePerSec: 5 });
    // A host's own claim to speak for three is not believed (trustedHostCount).
    rejects(
      hostReport({
        id: 'h',
        sequence: 1,
        endMs: 10_000,
        hostCount: 3,
        buckets: [{ bucket: 'a', offered: 12 }],
      }),
      'offered',
      /over 5 per second/,
      { maxRatePerSec: 5 },
    );
  });

  it('names the offending bucket in details', () => {
    try {
      validateReport(
        hostReport({
          id: 'h',
          sequence: 1,
          endMs: 5000,
          buckets: [
            { bucket: 'ok', offered: 1 },
            { bucket: 'bad', offered: -1 },
          ],
        }),
      );
      assert.fail('should throw');
    } catch (error) {
      assert.ok(isSpillwayError(error));
      assert.deepEqual(error.details, { field: 'offered', index: 1, bucket: 'bad' });
    }
  });
});
