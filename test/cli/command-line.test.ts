import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTargets } from '../../src/cli/command-line.js';
import { isSpillwayError } from '../../src/core/errors.js';

describe('command-line targets', () => {
  it('writes targets out in full: an empty host is 127.0.0.1, as when listening', () => {
    // gRPC cannot resolve an empty host: `:7000` as given timed out every report.
    assert.deepEqual(
      parseTargets('parent', [':7000', ' agg.internal:7001 ', '[::1]:7002', '10.0.0.1:7003']),
      ['127.0.0.1:7000', 'agg.internal:7001', '[::1]:7002', '10.0.0.1:7003'],
    );
  });

  it('refuses port 0 and malformed targets with ERR_SPILLWAY_INVALID_USAGE', () => {
    for (const bad of ['agg:0', 'agg', 'agg:99999', '']) {
      assert.throws(
        () => parseTargets('parent', [bad]),
        (error) => isSpillwayError(error, 'ERR_SPILLWAY_INVALID_USAGE'),
        bad,
      );
    }
  });
});
