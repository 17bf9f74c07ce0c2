import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isSpillwayError } from '../../src/core/errors.js';
import { createMetrics } from '../../src/ops/metrics.js';
import { type HealthReport, startOpsServer } from '../../src/ops/ops-server.js';
import { clientErrorSuite, SUITE_HEADERS_TIMEOUT_MS } from '../helpers/client-error-suite.js';
import { rawExchange } from '../helpers/raw-http.js';

// The ops endpoint answers what Node gives up on in plain text, as its other errors: what a scraper
// logs or `curl` prints is a sentence, not an empty 400.

clientErrorSuite({
  name: 'ops server',
  async start() {
    let release = () => {};
    const held = new Promise<HealthReport>((resolve) => {
      release = () => resolve({ ok: true });
    });
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    const ops = await startOpsServer({
      registry: metrics.registry,
      health: () => held,
      headersTimeoutMs: SUITE_HEADERS_TIMEOUT_MS,
    });
    return {
      port: ops.port,
      served: 'GET /metrics HTTP/1.1',
      // `/healthz` and `/metrics` answer after an await; a 404 comes at once.
      answeredAtOnce: 'GET /nope HTTP/1.1',
      answeredLater: 'GET /healthz HTTP/1.1',
      release,
      close: () => ops.close(),
    };
  },
  errorMessage(answer, status) {
    assert.equal(answer.status, status, JSON.stringify(answer));
    assert.equal(answer.headers['content-type'], 'text/plain; charset=utf-8');
    assert.equal(Number(answer.headers['content-length']), Buffer.byteLength(answer.body));
    assert.ok(answer.body.endsWith('\n'));
    return answer.body.slice(0, -1);
  },
});

describe('ops server: options', () => {
  it("headersTimeoutMs outside 1 ms … 300 s is refused with ERR_SPILLWAY_INVALID_OPTION, not Node's RangeError", async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    for (const headersTimeoutMs of [0, 300_001, 1.5, Number.NaN]) {
      await assert.rejects(
        startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }), headersTimeoutMs }),
        (e) => isSpillwayError(e, 'ERR_SPILLWAY_INVALID_OPTION'),
        String(headersTimeoutMs),
      );
    }
  });
});

describe('ops server: requests without Host', () => {
  // As the dashboard: no Host names no host the endpoint serves (the DNS-rebinding guard,
  // ops-host-check.test.ts). Prometheus and kubelet probes speak HTTP/1.1 and always send one.
  it('HTTP/1.0 without Host: 403, it names no host served here', async () => {
    const metrics = createMetrics({ component: 'host', id: 'h1', processMetrics: false });
    const ops = await startOpsServer({ registry: metrics.registry, health: () => ({ ok: true }) });
    try {
      for (const path of ['/healthz', '/metrics']) {
        const { answers } = await rawExchange(ops.port, `GET ${path} HTTP/1.0\r\n\r\n`);
        assert.equal(answers[0]?.status, 403, path);
        assert.match(answers[0]!.body, /^forbidden: the request has no Host header/, path);
      }
      // With one, HTTP/1.0 is served as before.
      const { answers } = await rawExchange(ops.port, 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n');
      assert.equal(answers[0]?.status, 200);
      assert.deepEqual(JSON.parse(answers[0]!.body), { ok: true });
    } finally {
      await ops.close();
    }
  });
});
