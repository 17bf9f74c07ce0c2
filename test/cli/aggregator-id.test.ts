import assert from 'node:assert/strict';
import { hostname } from 'node:os';
import { describe, it } from 'node:test';
import { defaultAggregatorId } from '../../src/cli/aggregator.js';

describe('the aggregator default id', () => {
  it('is the same for every process that listens on the same port of the same machine (a restart)', () => {
    assert.equal(defaultAggregatorId('z1', 7071), `aggregator-z1-${hostname()}-7071`);
    assert.equal(defaultAggregatorId('z1', 7071), defaultAggregatorId('z1', 7071));
    assert.notEqual(defaultAggregatorId('z1', 7071), defaultAggregatorId('z1', 7072));
    assert.notEqual(defaultAggregatorId('z1', 7071), defaultAggregatorId('z2', 7071));
  });

  it('falls back to the process id on an ephemeral port, which no restart keeps', () => {
    assert.equal(defaultAggregatorId('z1', 0), `aggregator-z1-${hostname()}-pid${process.pid}`);
  });
});
