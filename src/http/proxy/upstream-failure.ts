import type { UpstreamConfig } from '../rules/proxy-rules.js';
import type { ProxyOutcome } from './proxy-metrics.js';

export const CLIENT_GONE = 'the client closed the connection before its response was complete';

/** The reason the proxy aborts an upstream request with (the client left, a deadline passed). */
export class ExchangeAbortError extends Error {
  readonly code = 'SPILLWAY_PROXY_ABORTED';
}

export interface UpstreamFailure {
  status: 502 | 504;
  outcome: Extract<ProxyOutcome, 'upstream_error' | 'upstream_timeout' | 'upstream_queue_timeout'>;
  message: string;
}

/** undici and socket errors as the status a client should see and a message an operator can act on. */
export function describeUpstreamFailure(error: unknown, upstream: UpstreamConfig): UpstreamFailure {
  const code = errorCode(error);
  if (code === 'UND_ERR_HEADERS_TIMEOUT') {
    return {
      status: 504,
      outcome: 'upstream_timeout',
      message: `upstream sent no response headers within ${upstream.headersTimeoutMs} ms`,
    };
  }
  if (code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'ETIMEDOUT') {
    return {
      status: 504,
      outcome: 'upstream_timeout',
      message: `could not connect to the upstream within ${upstream.connectTimeoutMs} ms`,
    };
  }
  const detail = code ?? (error instanceof Error ? error.message : String(error));
  const what =
    code === 'ECONNREFUSED'
      ? 'upstream refused the connection'
      : code === 'ECONNRESET' || code === 'UND_ERR_SOCKET' || code === 'EPIPE'
        ? 'upstream closed the connection'
        : 'upstream request failed';
  return { status: 502, outcome: 'upstream_error', message: `${what} (${detail})` };
}

/**
 * The deadline for an upstream's answer passed: 504 either way, `upstream_queue_timeout` while the
 * request (or upgrade) still waited for a pooled connection, `upstream_timeout` once it had one.
 */
export function headersTimeoutFailure(
  what: 'request' | 'upgrade',
  queued: boolean,
  timeoutMs: number,
  upstream: UpstreamConfig,
): UpstreamFailure {
  return queued
    ? {
        status: 504,
        outcome: 'upstream_queue_timeout',
        message: `the ${what} waited ${timeoutMs} ms for one of the ${upstream.connections} upstream connections`,
      }
    : {
        status: 504,
        outcome: 'upstream_timeout',
        message:
          what === 'request'
            ? `upstream sent no response headers within ${timeoutMs} ms`
            : `upstream answered no upgrade within ${timeoutMs} ms`,
      };
}

function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current instanceof Error; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && code !== 'UND_ERR_CONNECT' && code !== 'UND_ERR') return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}
