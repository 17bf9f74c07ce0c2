/**
 * Error codes of the dashboard's HTTP API, in every error body as `{ error: { code, message } }`.
 * Like SpillwayError codes they are stable (docs/dashboard.md lists them); messages may improve.
 */
export const ApiErrorCode = {
  /**
   * The body is not JSON, not an object of the expected shape, or a value is out of range; or the
   * request itself is malformed: unparsable HTTP, an HTTP/1.1 request without `Host`, a target that
   * is no URL (400).
   */
  InvalidRequest: 'ERR_SPILLWAY_INVALID_REQUEST',
  /** No `Authorization: Bearer` header, or the token is wrong (401). */
  Unauthenticated: 'ERR_SPILLWAY_UNAUTHENTICATED',
  /** The controller runs without an admin token: admin actions are off, read-only views stay open (403). */
  AdminDisabled: 'ERR_SPILLWAY_ADMIN_DISABLED',
  /** No rule in the limits has that key or template (404). */
  UnknownRule: 'ERR_SPILLWAY_UNKNOWN_RULE',
  /** No current tuning suggestion has that id (404). */
  UnknownSuggestion: 'ERR_SPILLWAY_UNKNOWN_SUGGESTION',
  /**
   * The request's `Host` is not one the dashboard serves (403): the guard against DNS rebinding
   * (host-allowlist.ts). Add the name with `--dashboard-allowed-host`.
   */
  HostNotAllowed: 'ERR_SPILLWAY_HOST_NOT_ALLOWED',
  /** No such path (404). */
  NotFound: 'ERR_SPILLWAY_NOT_FOUND',
  /** The path exists but not for this method (405, with `allow`). */
  MethodNotAllowed: 'ERR_SPILLWAY_METHOD_NOT_ALLOWED',
  /** The body is larger than the API accepts, or its chunk extensions are larger than Node's parser takes (413). */
  PayloadTooLarge: 'ERR_SPILLWAY_PAYLOAD_TOO_LARGE',
  /** The request headers are larger than Node's `http.maxHeaderSize` (431); the connection is closed. */
  HeadersTooLarge: 'ERR_SPILLWAY_HEADERS_TOO_LARGE',
  /**
   * The request was not all in in time: its headers within `headersTimeoutMs` (60 s), or all of it
   * within Node's `requestTimeout` (300 s) (408); the connection is closed.
   */
  RequestTimeout: 'ERR_SPILLWAY_REQUEST_TIMEOUT',
  /** An `Expect` header other than `100-continue` (417); the connection is closed. */
  ExpectationFailed: 'ERR_SPILLWAY_EXPECTATION_FAILED',
  /** The request line names a version other than HTTP/1.1 or HTTP/1.0 (505). */
  HttpVersionNotSupported: 'ERR_SPILLWAY_HTTP_VERSION_NOT_SUPPORTED',
  /** Admin actions take `application/json` only (415). */
  UnsupportedMediaType: 'ERR_SPILLWAY_UNSUPPORTED_MEDIA_TYPE',
  /**
   * The client's address has its share of event streams open already (429, with `Retry-After`):
   * one client cannot take every slot.
   */
  TooManyStreams: 'ERR_SPILLWAY_TOO_MANY_STREAMS',
  /** Every event-stream slot is taken (503, with `Retry-After`); the same code as other full bounded tables. */
  CapacityExceeded: 'ERR_SPILLWAY_CAPACITY_EXCEEDED',
} as const;

export type ApiErrorCode = (typeof ApiErrorCode)[keyof typeof ApiErrorCode];

export class ApiError extends Error {
  readonly status: number;
  readonly code: ApiErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(status: number, code: ApiErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.details = details;
  }

  toJSON(): { error: { code: ApiErrorCode; message: string; details?: Record<string, unknown> } } {
    return {
      error: { code: this.code, message: this.message, ...(this.details ? { details: this.details } : {}) },
    };
  }
}
