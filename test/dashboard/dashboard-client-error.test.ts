import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import { pino } from 'pino';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { createController } from '../../src/control/controller.js';
import { createAdminActions } from '../../src/dashboard/admin-actions.js';
import { createAdminOverrides } from '../../src/dashboard/admin-overrides.js';
import { ApiErrorCode } from '../../src/dashboard/api-error.js';
import { type DashboardServer, startDashboardServer } from '../../src/dashboard/dashboard-server.js';
import type { TuningSuggestion } from '../../src/dashboard/tuning-source.js';
import { clientErrorSuite, SUITE_HEADERS_TIMEOUT_MS } from '../helpers/client-error-suite.js';
import { type RawAnswer, rawExchange } from '../helpers/raw-http.js';

// The dashboard answers what Node gives up on in its API's error shape, `{ error: { code, message } }`,
// with the stable codes of docs/dashboard.md.

const LIMITS = 'version: 1\nintervalMs: 1000\nbuckets:\n  - key: a\n    limitRps: 100\n';
const TOKEN = 'client-error-test-token-0123456789';

const CODES: Record<number, string> = {
  400: ApiErrorCode.InvalidRequest,
  408: ApiErrorCode.RequestTimeout,
  413: ApiErrorCode.PayloadTooLarge,
  417: ApiErrorCode.ExpectationFailed,
  431: ApiErrorCode.HeadersTooLarge,
  505: ApiErrorCode.HttpVersionNotSupported,
};

/**
 * A dashboard whose `/api/tuning` answers once `release()` is called; `logged` holds its log lines
 * at `warn` and above.
 */
async function startDashboard(): Promise<{ server: DashboardServer; release(): void; logged: string[] }> {
  const overrides = createAdminOverrides(parseLimitsConfig(LIMITS));
  const controller = createController({ id: 'ctl', config: overrides.effective() });
  const logged: string[] = [];
  const logger = pino(
    { level: 'warn' },
    new Writable({
      write(chunk, _encoding, done) {
        logged.push(String(chunk));
        done();
      },
    }),
  );
  let release = () => {};
  const held = new Promise<TuningSuggestion[]>((resolve) => {
    release = () => resolve([]);
  });
  const server = await startDashboardServer({
    controller,
    overrides,
    admin: createAdminActions({ overrides, controller, logger }),
    tuning: { name: 'held', suggestions: () => held },
    adminToken: TOKEN,
    logger,
    headersTimeoutMs: SUITE_HEADERS_TIMEOUT_MS,
  });
  return { server, release, logged };
}

function errorBody(answer: RawAnswer): { error: { code: string; message: string } } {
  assert.equal(answer.headers['content-type'], 'application/json; charset=utf-8');
  assert.equal(answer.headers['x-content-type-options'], 'nosniff');
  assert.equal(Number(answer.headers['content-length']), Buffer.byteLength(answer.body));
  return JSON.parse(answer.body);
}

clientErrorSuite({
  name: 'dashboard server',
  async start() {
    const { server, release } = await startDashboard();
    return {
      port: server.port,
      served: 'GET /api/snapshot HTTP/1.1',
      answeredAtOnce: 'GET /api/snapshot HTTP/1.1',
      answeredLater: 'GET /api/tuning HTTP/1.1',
      release,
      close: () => server.close(),
    };
  },
  errorMessage(answer, status) {
    assert.equal(answer.status, status, JSON.stringify(answer));
    const { error } = errorBody(answer);
    assert.equal(error.code, CODES[status]);
    return error.message;
  },
});

describe('dashboard server: requests without Host', () => {
  it('HTTP/1.1 gets 400 ERR_SPILLWAY_INVALID_REQUEST, HTTP/1.0 the Host check 403; the connection serves on', async () => {
    const { server } = await startDashboard();
    try {
      // Both on one connection: the 400 leaves an HTTP/1.1 connection open, as the API's other errors.
      const { answers } = await rawExchange(
        server.port,
        'GET /api/snapshot HTTP/1.1\r\n\r\n',
        'GET /api/snapshot HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n',
      );
      assert.deepEqual(
        answers.map((answer) => answer.status),
        [400, 200],
      );
      assert.deepEqual(errorBody(answers[0]!), {
        error: {
          code: 'ERR_SPILLWAY_INVALID_REQUEST',
          message: 'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)',
        },
      });
      const old = await rawExchange(server.port, 'GET /api/snapshot HTTP/1.0\r\n\r\n');
      assert.equal(old.answers[0]?.status, 403);
      assert.deepEqual(errorBody(old.answers[0]!), {
        error: {
          code: 'ERR_SPILLWAY_HOST_NOT_ALLOWED',
          message: 'the request has no Host header: it names no host the dashboard serves',
          details: { host: null },
        },
      });
    } finally {
      await server.close();
    }
  });
});

describe('dashboard server: an admin body Node cannot parse', () => {
  it('gets the 400 in the API shape, and is no server error in the log', async () => {
    const { server, logged } = await startDashboard();
    try {
      const { answers } = await rawExchange(
        server.port,
        'POST /api/admin/mode HTTP/1.1\r\nHost: localhost\r\n' +
          `Authorization: Bearer ${TOKEN}\r\nContent-Type: application/json\r\n` +
          'Transfer-Encoding: chunked\r\n\r\n5\r\n{"rul\r\nzz\r\n',
      );
      assert.equal(answers.length, 1);
      assert.equal(answers[0]!.status, 400);
      assert.equal(answers[0]!.headers.connection, 'close');
      const { error } = errorBody(answers[0]!);
      assert.equal(error.code, 'ERR_SPILLWAY_INVALID_REQUEST');
      assert.match(error.message, /\(HPE_INVALID_CHUNK_SIZE\)$/);
      // The handler reading the body sees it cut; a logged error would page someone for a client's bytes.
      const health = await rawExchange(
        server.port,
        'GET /api/snapshot HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n',
      );
      assert.equal(health.answers[0]?.status, 200);
      assert.deepEqual(logged, []);
    } finally {
      await server.close();
    }
  });
});
