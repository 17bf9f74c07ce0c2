import { z } from 'zod';
import type { LocatedIssue } from '../../config/located-yaml.js';

/**
 * The `server` section of the proxy's rules file: how the proxy treats its clients (timeouts,
 * request bodies, upgrades). docs/proxy.md is the reference.
 */

const timeoutMs = z.number().int().min(0).max(86_400_000);

/**
 * A protocol as the `Upgrade` field names it (RFC 9110 §7.8): `name` or `name/version`, each a
 * token.
 */
const upgradeProtocol = z
  .string()
  .regex(
    /^[!#$%&'*+.^_`|~0-9A-Za-z-]+(?:\/[!#$%&'*+.^_`|~0-9A-Za-z-]+)?$/,
    'must be a protocol as the Upgrade header names it: a token, or token/version',
  );

export const serverSchema = z.strictObject({
  /** Idle keep-alive connections from clients are closed after this long. */
  keepAliveTimeoutMs: timeoutMs.default(5_000),
  /** Bound on receiving a whole request (0: none, so long uploads stream). */
  requestTimeoutMs: timeoutMs.default(0),
  /** Bound on receiving request headers (slow-loris guard). */
  headersTimeoutMs: timeoutMs.default(60_000),
  /**
   * A request body that sends no bytes for this long while the proxy waits for them: the upstream
   * request is aborted, the client gets a 408 (or a cut response once one started). Pauses only
   * count while the proxy is ready to read, never while the upstream is slow to take the body.
   * 60 s, as nginx's client_body_timeout and `headersTimeoutMs` here: a live client does not stop
   * mid-body for a minute, and a stalled one no longer holds a pooled upstream connection for
   * ever. 0 disables.
   */
  bodyTimeoutMs: timeoutMs.default(60_000),
  /**
   * The slowest a request body may come on average, counted over the time the proxy waited for it
   * (ready to read, as for `bodyTimeoutMs`), after a grace of `bodyMinRateGraceMs`: a body may take
   * that grace + its bytes / this of such waiting, then it gets a 408 (Apache's mod_reqtimeout
   * `MinRate`). `bodyTimeoutMs` bounds pauses, not pace: without this a client sending a byte
   * every few seconds holds its connection and a pooled upstream connection for ever. Absent: 500
   * bytes/s (4 kbit/s, slower than any live link), or 0 when `bodyTimeoutMs` is 0 (no bound on
   * bodies at all). 0 disables. Resolved in `resolveServerConfig`.
   */
  bodyMinBytesPerSec: z.number().int().min(0).max(1_000_000_000).optional(),
  /**
   * How long a request body may take to start before `bodyMinBytesPerSec` judges it: the rate
   * applies from the first second, not after a minute of grace, so a trickled upload is cut
   * within a second or two (a live client's first bytes come within a round trip).
   */
  bodyMinRateGraceMs: z.number().int().min(1).max(86_400_000).default(1_000),
  /**
   * A request body of at most this many bytes is read whole before the request takes a pooled
   * upstream connection (nginx's `proxy_request_buffering`, in memory): a client slow to send it
   * holds no upstream connection. A larger body (declared, or a chunked one that passes it)
   * streams to the upstream as it comes. 0: every body streams.
   */
  bufferBodyBytes: z
    .number()
    .int()
    .min(0)
    .max(16 * 1024 * 1024)
    .default(64 * 1024),
  /**
   * Request bodies one client (the client address key, as `{client}` renders it) may have in
   * progress at once, buffered or streaming; past it, 429 `too_many_uploads` before anything is
   * read or decided. Bounds the pooled upstream connections (and buffer memory) slow uploads from
   * one client can hold. 0: no bound.
   */
  maxUploadsPerClient: z.number().int().min(0).max(1_000_000).default(16),
  /**
   * A client that takes no response bytes for this long while the proxy has some for it: the
   * response is cut and its upstream request aborted. 60 s, as nginx's send_timeout: without it a
   * client that asks for large responses and never reads them holds a pooled upstream connection
   * each, for ever (undici's body timeout does not run while the proxy has the upstream paused).
   * 0 disables.
   */
  sendTimeoutMs: timeoutMs.default(60_000),
  /**
   * An upgraded connection (WebSocket) with no bytes either way for this long is closed, both
   * sides: peers that vanished without a FIN would otherwise hold it for good. 60 s, as nginx's
   * proxy_read_timeout and a cloud load balancer's idle timeout, which WebSocket applications
   * already ping within. 0 disables.
   */
  upgradeIdleTimeoutMs: timeoutMs.default(60_000),
  /**
   * The protocols an upgrade may switch to (compared without letter case; `name` also admits
   * `name/version`). Any other upgrade is refused 501 `upgrade_refused`, never forwarded: an
   * upgraded connection is a tunnel the buckets decided once, so a protocol that carries requests
   * (h2c) would carry them past the limits. `[]` refuses every upgrade.
   */
  upgradeProtocols: z.array(upgradeProtocol).max(32).default(['websocket']),
});

export type ServerConfig = Omit<z.output<typeof serverSchema>, 'bodyMinBytesPerSec' | 'upgradeProtocols'> & {
  /** Resolved: 0 when disabled. */
  bodyMinBytesPerSec: number;
  /** In lower case. */
  upgradeProtocols: readonly string[];
};

/** `server.bodyMinBytesPerSec` when the file does not set it (and `bodyTimeoutMs` is not 0). */
export const DEFAULT_BODY_MIN_BYTES_PER_SEC = 500;

/**
 * Protocols that carry HTTP requests: tunnelled, each request inside would reach the upstream
 * undecided. `h2c` is HTTP/2 over cleartext (RFC 7540 §3.2), `h2` its TLS name, `http/…` the
 * older spellings (`HTTP/2.0`).
 */
const REQUEST_CARRYING = /^(?:h2c|h2|http)(?:\/|$)/;

export function resolveServerConfig(
  raw: z.output<typeof serverSchema>,
): { value: ServerConfig } | { issue: LocatedIssue } {
  const upgradeProtocols = raw.upgradeProtocols.map((protocol) => protocol.toLowerCase());
  const carrying = upgradeProtocols.findIndex((protocol) => REQUEST_CARRYING.test(protocol));
  if (carrying !== -1) {
    return {
      issue: {
        path: ['server', 'upgradeProtocols', carrying],
        message: `"${raw.upgradeProtocols[carrying]}" cannot be tunnelled: an upgraded connection would carry HTTP requests the buckets never decide`,
      },
    };
  }
  const { bodyMinBytesPerSec, bodyTimeoutMs } = raw;
  return {
    value: {
      ...raw,
      bodyMinBytesPerSec: bodyMinBytesPerSec ?? (bodyTimeoutMs > 0 ? DEFAULT_BODY_MIN_BYTES_PER_SEC : 0),
      upgradeProtocols,
    },
  };
}
