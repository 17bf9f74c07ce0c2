import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatDemoSummary } from '../../../src/cli/demo/summary.js';
import type { DashboardView } from '../../../src/dashboard/dashboard-view.js';

describe('demo summary table', () => {
  it('prints control characters in bucket keys escaped: a key cannot rewrite the terminal', () => {
    const view = {
      controller: { ticks: 3 },
      children: [],
      buckets: [
        {
          key: 'api:caller=\x1b[2J\x1b]0;owned\x07x',
          mode: 'enforce',
          overridden: false,
          offeredRps: 10,
          admittedRps: 8,
          limitRps: 8,
          dropRatio: 0.2,
          wouldDropRps: 0,
        },
      ],
    } as unknown as DashboardView;
    const text = formatDemoSummary(view, { elapsedS: 5, phase: 'steady' });
    const raw = [...text].filter((c) => c !== '\n' && (c < ' ' || (c >= '\x7f' && c <= '\x9f')));
    assert.deepEqual(raw, [], 'no raw control character but newlines');
    assert.match(text, /api:caller=\\x1b\[2J\\x1b\]0;owned\\x07x/);
  });
});
