import assert from 'node:assert/strict';
import { SpillwayError } from '../../src/core/errors.js';

/** The SpillwayError `promise` rejects with; fails the test if it resolves or rejects with anything else. */
export async function rejection(promise: Promise<unknown>): Promise<SpillwayError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof SpillwayError, `expected a SpillwayError, got ${String(error)}`);
    return error;
  }
  assert.fail('expected a rejection');
}
