import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/cli/command-line.js';
import { spec as controllerSpec } from '../../src/cli/controller.js';
import { reporterCapFromFlags } from '../../src/cli/reporter-cap-flags.js';
import { isSpillwayError } from '../../src/core/errors.js';

const capOf = (...argv: string[]) =>
  reporterCapFromFlags(parseFlags(controllerSpec, ['--config', 'limits.yaml', ...argv]).values);

describe('reporter cap flags', () => {
  it('builds the cap from the flags given, and none without them', () => {
    assert.equal(capOf(), undefined);
    assert.deepEqual(capOf('--reporter-cap-median', '8', '--reporter-cap-floor-rps', '50'), {
      medianMultiple: 8,
      floorRps: 50,
    });
    assert.deepEqual(capOf('--max-offered-rps-per-reporter', '1000'), { maxRps: 1000 });
  });

  // The floor only bounds the median bound from below (docs/security.md): without
  // --reporter-cap-median it would be ignored in silence, so, as with --tls-ca alone, it is refused.
  it('refuses --reporter-cap-floor-rps without --reporter-cap-median', () => {
    for (const argv of [
      ['--reporter-cap-floor-rps', '50'],
      ['--reporter-cap-floor-rps', '50', '--max-offered-rps-per-reporter', '1000'],
    ]) {
      assert.throws(
        () => capOf(...argv),
        (error) =>
          isSpillwayError(error, 'ERR_SPILLWAY_INVALID_USAGE') &&
          /--reporter-cap-floor-rps needs --reporter-cap-median/.test(error.message),
        argv.join(' '),
      );
    }
  });
});
