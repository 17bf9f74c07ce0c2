// One suite, run against every Spillway HTTP server (test/dashboard/dashboard-client-error.test.ts,
// test/ops/ops-client-error.test.ts, test/http/proxy-client-error.test.ts): requests Node's HTTP
// server gives up on (unparsable, headers too large, headers too late, versions other than 1.x)
// and heads it must refuse (HTTP/1.1 without Host, two Host lines) get the server's own answer, in its own error shape, never Node's bare status line;
// nothing is written ahead of an earlier request's answer; the server serves on. Real servers on
// port 0, raw bytes over real sockets.
import assert from 'node:assert/strict';
import { maxHeaderSize } from 'node:http';
import { describe, it } from 'node:test';
import { type RawAnswer, rawExchange } from './raw-http.js';

/** The `headersTimeoutMs` every server under the suite is started with. */
export const SUITE_HEADERS_TIMEOUT_MS = 500;

export interface ServerUnderSuite {
  port: number;
  /** A request line the server answers 2xx: `GET /x HTTP/1.1`. */
  served: string;
  /** A request line the server answers, with any status, before it reads on (no await on the way). */
  answeredAtOnce: string;
  /** A request line whose answer waits until `release()`. */
  answeredLater: string;
  release(): void;
  close(): Promise<void>;
}

export interface ClientErrorSubject {
  name: string;
  /** The server under test, with `headersTimeoutMs: SUITE_HEADERS_TIMEOUT_MS`. */
  start(): Promise<ServerUnderSuite>;
  /** Asserts `answer` is the server's own error answer with `status`, and returns its message. */
  errorMessage(answer: RawAnswer, status: number): string;
}

const GARBAGE = 'THIS IS NOT HTTP\r\n\r\n';
const PARSE_ERROR = /^the request could not be parsed: .+ \(HPE_[A-Z_]+\)$/;

function request(line: string, headers = ''): string {
  return `${line}\r\nHost: 127.0.0.1\r\n${headers}\r\n`;
}

export function clientErrorSuite(subject: ClientErrorSubject): void {
  /** The server's own answer to a request Node gave up on: its shape, and the connection closed. */
  function assertClientError(answer: RawAnswer | undefined, status: number): string {
    assert.ok(answer !== undefined, 'an answer');
    assert.equal(answer.headers.connection, 'close', JSON.stringify(answer));
    return subject.errorMessage(answer, status);
  }

  async function assertServes(server: ServerUnderSuite): Promise<void> {
    const { answers } = await rawExchange(server.port, request(server.served, 'Connection: close\r\n'));
    assert.equal(answers.length, 1);
    assert.equal(answers[0]!.status, 200, JSON.stringify(answers[0]));
  }

  async function withServer(test: (server: ServerUnderSuite) => Promise<void>): Promise<void> {
    const server = await subject.start();
    try {
      await test(server);
      await assertServes(server);
    } finally {
      server.release();
      await server.close();
    }
  }

  describe(`${subject.name}: its own answer to requests Node gives up on`, { timeout: 30_000 }, () => {
    for (const [what, text] of [
      ['a garbage request line', GARBAGE],
      ['a header name with a space', request('GET / HTTP/1.1', 'Bad Header: y\r\n')],
    ] as const) {
      it(`${what}: 400, the connection closed`, () =>
        withServer(async (server) => {
          const { answers } = await rawExchange(server.port, text);
          assert.equal(answers.length, 1);
          assert.match(assertClientError(answers[0], 400), PARSE_ERROR);
        }));
    }

    it('headers over http.maxHeaderSize: 431', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(
          server.port,
          request('GET / HTTP/1.1', `X-Big: ${'a'.repeat(maxHeaderSize + 1024)}\r\n`),
        );
        assert.equal(
          assertClientError(answers[0], 431),
          `the request headers are larger than ${maxHeaderSize} bytes`,
        );
      }));

    it('a request line and then nothing: 408 once headersTimeoutMs has passed', () =>
      withServer(async (server) => {
        const { answers, elapsedMs } = await rawExchange(server.port, 'GET / HTTP/1.1\r\n');
        assert.equal(
          assertClientError(answers[0], 408),
          `no complete request headers within ${SUITE_HEADERS_TIMEOUT_MS} ms`,
        );
        // Node sweeps its timeouts once a second (TIMEOUT_SWEEP_MS).
        assert.ok(
          elapsedMs >= SUITE_HEADERS_TIMEOUT_MS - 50 && elapsedMs < SUITE_HEADERS_TIMEOUT_MS + 2_000,
          `answered after ${elapsedMs} ms`,
        );
      }));

    it('an HTTP/1.1 request without Host: 400 (RFC 9112 §3.2)', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(server.port, 'GET / HTTP/1.1\r\nConnection: close\r\n\r\n');
        assert.equal(answers.length, 1);
        assert.equal(
          subject.errorMessage(answers[0]!, 400),
          'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)',
        );
      }));

    it('two Host lines: 400 (RFC 9112 §3.2), whichever a server would take', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(
          server.port,
          'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nhost: evil.example\r\nConnection: close\r\n\r\n',
        );
        assert.equal(answers.length, 1);
        assert.equal(
          subject.errorMessage(answers[0]!, 400),
          'the request has more than one Host header (RFC 9112 §3.2)',
        );
      }));

    for (const [line, version] of [
      ['GET / HTTP/2.0', '2.0'],
      ['GET /', '0.9'],
    ] as const) {
      it(`a request line read as HTTP/${version} (${JSON.stringify(line)}): 505`, () =>
        withServer(async (server) => {
          const { answers } = await rawExchange(server.port, request(line, 'Connection: close\r\n'));
          assert.equal(answers.length, 1);
          assert.equal(
            subject.errorMessage(answers[0]!, 505),
            `HTTP/${version} is not supported: send HTTP/1.1 or HTTP/1.0`,
          );
        }));
    }

    it("a version Node's parser refuses (HTTP/1.2): 505, the connection closed", () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(server.port, request('GET / HTTP/1.2'));
        assert.equal(answers.length, 1);
        assert.equal(
          assertClientError(answers[0], 505),
          'the request line names an HTTP version other than 1.1 or 1.0',
        );
      }));

    it('a malformed request after an answered one on the same connection: that answer whole, then 400', () =>
      withServer(async (server) => {
        // The second piece is written once the first answer is in.
        const { answers } = await rawExchange(server.port, request(server.served), GARBAGE);
        assert.equal(answers.length, 2, JSON.stringify(answers));
        assert.equal(answers[0]!.status, 200, JSON.stringify(answers[0]));
        assert.equal(Buffer.byteLength(answers[0]!.body), Number(answers[0]!.headers['content-length']));
        assert.match(assertClientError(answers[1], 400), PARSE_ERROR);
      }));

    it('pipelined in one write behind a request answered at once: that answer whole, then 400', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(server.port, request(server.answeredAtOnce) + GARBAGE);
        assert.equal(answers.length, 2, JSON.stringify(answers));
        assert.equal(Buffer.byteLength(answers[0]!.body), Number(answers[0]!.headers['content-length']));
        assert.match(assertClientError(answers[1], 400), PARSE_ERROR);
      }));

    it('pipelined behind an unanswered request: nothing written ahead of its answer, the connection closed', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(server.port, request(server.answeredLater) + GARBAGE);
        assert.deepEqual(answers, []);
      }));

    it('bytes after a request with Connection: close are ignored (RFC 9112 §9.6): its answer, then the close', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(
          server.port,
          request(server.answeredAtOnce, 'Connection: close\r\n') + GARBAGE,
        );
        assert.equal(answers.length, 1, JSON.stringify(answers));
        assert.equal(answers[0]!.headers.connection, 'close');
        assert.equal(Buffer.byteLength(answers[0]!.body), Number(answers[0]!.headers['content-length']));
      }));

    it('the same behind a request answered later: that request is still answered, then the close', () =>
      withServer(async (server) => {
        const exchange = rawExchange(
          server.port,
          request(server.answeredLater, 'Connection: close\r\n') + GARBAGE,
        );
        // On loopback those bytes are at the server once written; a whole exchange on another
        // connection, begun after them, ends only once the server has polled (and read) both.
        await assertServes(server);
        server.release();
        const { answers } = await exchange;
        assert.equal(answers.length, 1, JSON.stringify(answers));
        assert.equal(answers[0]!.status, 200, JSON.stringify(answers[0]));
      }));

    it('Expect: 100-continue without Host: no 100 Continue, the 400, the connection closed', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(
          server.port,
          'POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n',
        );
        assert.equal(answers.length, 1, JSON.stringify(answers));
        assert.equal(answers[0]!.headers.connection, 'close');
        assert.equal(
          subject.errorMessage(answers[0]!, 400),
          'an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)',
        );
      }));

    it('an Expect other than 100-continue: 417, the connection closed', () =>
      withServer(async (server) => {
        const { answers } = await rawExchange(
          server.port,
          request(server.served, 'Expect: something-else\r\n'),
        );
        assert.equal(answers.length, 1, JSON.stringify(answers));
        assert.equal(
          assertClientError(answers[0], 417),
          'the request expects something other than 100-continue (Expect), which is not supported',
        );
      }));

    it('serves on while all of them arrive at once', () =>
      withServer(async (server) => {
        const exchanges = await Promise.all([
          rawExchange(server.port, 'GET / HTTP/1.1\r\n'),
          rawExchange(server.port, GARBAGE),
          rawExchange(server.port, request('GET / HTTP/1.1', `X-Big: ${'a'.repeat(maxHeaderSize + 1)}\r\n`)),
          rawExchange(server.port, 'GET / HTTP/1.1\r\nConnection: close\r\n\r\n'),
          rawExchange(server.port, request(server.served, 'Connection: close\r\n')),
        ]);
        assert.deepEqual(
          exchanges.map(({ answers }) => answers[0]?.status),
          [408, 400, 431, 400, 200],
        );
      }));
  });
}
