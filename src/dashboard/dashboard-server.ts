import type { IncomingMessage, ServerResponse } from 'node:http';
import { z } from 'zod';
import type { ControllerSnapshot, ControllerSnapshotOptions } from '../control/controller.js';
import { assertKnownOptions, optionNames } from '../core/validate.js';
import type { Logger } from '../ops/logger.js';
import { type ClientFailure, requestHeadFault } from '../server/http-client-error.js';
import { createHttpServer } from '../server/http-server.js';
import type { RawResponse } from '../server/raw-response.js';
import type { AdminActions, AdminActor } from './admin-actions.js';
import type { AdminOverrides } from './admin-overrides.js';
import { checkBearer } from './admin-token.js';
import { ApiError, ApiErrorCode } from './api-error.js';
import { createBucketHistory } from './bucket-history.js';
import { buildDashboardView, type DashboardView, type ViewLimits } from './dashboard-view.js';
import { createEventStream } from './event-stream.js';
import { loadStaticAssets, type StaticAsset } from './static-assets.js';
import type { TuningSource } from './tuning-source.js';

export interface DashboardServerOptions {
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port; read the real one from `address`). */
  port?: number;
  /**
   * Names (or IP addresses) besides the listen address that browsers may use in `Host`, e.g. a
   * reverse proxy's public name. Every other `Host` is refused (403, DNS rebinding; see
   * host-allowlist.ts for what is allowed by default).
   */
  allowedHosts?: readonly string[];
  /** Asked for bounded snapshots: the view's buckets and children, no more. */
  controller: { snapshot(options?: ControllerSnapshotOptions): ControllerSnapshot };
  overrides: AdminOverrides;
  admin: AdminActions;
  /** Bearer token for admin actions. Absent: admin actions answer 403, read-only views stay open. */
  adminToken?: string;
  tuning?: TuningSource;
  logger: Logger;
  /** Most concurrent `/api/stream` subscribers. Default 32. */
  maxStreamClients?: number;
  /**
   * Most concurrent `/api/stream` subscribers from one client address (an IPv6 /64 counts as
   * one), so one client cannot take every slot. Default 4. Behind a reverse proxy every viewer
   * has the proxy's address: raise it to `maxStreamClients` there.
   */
  maxStreamClientsPerAddress?: number;
  /** Default 15 s. */
  heartbeatMs?: number;
  /**
   * Node's bound on receiving a request's headers (a client trickling them holds a connection):
   * `408` past it. Default 60 s, Node's; at most Node's `requestTimeout` (300 s).
   */
  headersTimeoutMs?: number;
  /** Ticks kept for `/api/history`. Default 300. */
  historyLength?: number;
  view?: ViewLimits;
  /** Where index.html, app.js and style.css live. Default: the package's `dashboard/`. */
  staticDir?: string;
}

export interface DashboardServer {
  readonly address: string;
  readonly port: number;
  /** `http://host:port/` */
  readonly url: string;
  /**
   * Call after every controller tick: records the history and sends one event to subscribers.
   * Bounded work whatever the bucket count: the view's busiest buckets only, and no children or
   * event unless a page is subscribed.
   */
  onTick(): void;
  close(): Promise<void>;
}

/** Most bytes of JSON an admin action may send: the bodies are a rule name and a number. */
const MAX_BODY_BYTES = 16 * 1024;
/** `Retry-After` on a refused event stream: a slot frees when a subscriber leaves, at no set time. */
const STREAM_RETRY_AFTER_S = 5;
/** Free text in the audit line: short, printable, no way to forge a second log field or line. */
const ACTOR_PATTERN = /^[\w .@:-]{1,64}$/;
/** The API's code for each answer to a request Node gave up on. */
const CLIENT_FAILURE_CODES: Record<ClientFailure['status'], ApiErrorCode> = {
  400: ApiErrorCode.InvalidRequest,
  408: ApiErrorCode.RequestTimeout,
  413: ApiErrorCode.PayloadTooLarge,
  417: ApiErrorCode.ExpectationFailed,
  431: ApiErrorCode.HeadersTooLarge,
  505: ApiErrorCode.HttpVersionNotSupported,
};

const ruleName = z.string().min(1).max(512);
const modeBody = z.strictObject({ rule: ruleName, mode: z.enum(['enforce', 'shadow']) });
const limitBody = z.strictObject({
  rule: ruleName,
  limitRps: z.number().refine(Number.isFinite, 'must be a finite number').pipe(z.number().min(0).max(1e9)),
});
const clearBody = z.strictObject({ rule: ruleName });
const acceptBody = z.strictObject({ id: z.string().min(1).max(256) });

/**
 * The controller's web page and its JSON API (docs/dashboard.md). Plain node:http: a handful of
 * routes. Read-only routes are open (bind to loopback, or put it behind your own access control);
 * admin routes need the bearer token and are audited.
 */
const DASHBOARD_SERVER_OPTIONS = optionNames<DashboardServerOptions>({
  host: true,
  port: true,
  allowedHosts: true,
  controller: true,
  overrides: true,
  admin: true,
  adminToken: true,
  tuning: true,
  logger: true,
  maxStreamClients: true,
  maxStreamClientsPerAddress: true,
  heartbeatMs: true,
  headersTimeoutMs: true,
  historyLength: true,
  view: true,
  staticDir: true,
});

export async function startDashboardServer(options: DashboardServerOptions): Promise<DashboardServer> {
  assertKnownOptions(options, DASHBOARD_SERVER_OPTIONS, 'startDashboardServer');
  const { controller, overrides, admin, tuning, logger } = options;
  const adminToken = options.adminToken || undefined;
  // Requests Node's parser rejects or its timeouts expire: the dashboard's error shape, not Node's
  // bare status line.
  const http = createHttpServer({
    host: options.host,
    port: options.port,
    allowedHosts: options.allowedHosts ?? [],
    headersTimeoutMs: options.headersTimeoutMs,
    clientErrors: { respond: clientFailureResponse },
    handle: (request, response) => {
      route(request, response).catch((error: unknown) => failed(request, response, error));
    },
  });
  const assets: Map<string, StaticAsset> = loadStaticAssets(options.staticDir);
  const history = createBucketHistory({ capacity: options.historyLength ?? 300 });
  const stream = createEventStream({
    maxClients: options.maxStreamClients ?? 32,
    maxClientsPerAddress: options.maxStreamClientsPerAddress ?? 4,
    heartbeatMs: options.heartbeatMs ?? 15_000,
  });
  let lastTicks = -1;

  const maxBuckets = options.view?.maxBuckets ?? 100;
  const maxChildren = options.view?.maxChildren ?? 200;
  /** `children: false`: for the history alone, which keeps bucket series only. */
  const view = ({ children = true } = {}): DashboardView =>
    buildDashboardView(
      controller.snapshot({ maxBuckets, maxChildren: children ? maxChildren : 0 }),
      overrides.rules(),
      adminToken !== undefined,
      options.view,
    );

  async function route(request: IncomingMessage, response: ServerResponse): Promise<void> {
    // RFC 9112 §3.2 asks for a 400, not the Host check's 403: the request is malformed, whatever it
    // names. An HTTP/1.0 request may omit Host, and gets the 403 below.
    const headFault = requestHeadFault(request);
    if (headFault !== undefined) {
      throw new ApiError(headFault.status, CLIENT_FAILURE_CODES[headFault.status], headFault.message);
    }
    // Before anything else, admin routes included (their token stays required): a rebound name's
    // page must not read a byte, nor take an event-stream slot.
    const hostHeader = request.headers.host;
    if (!http.servesHost(hostHeader)) {
      throw new ApiError(
        403,
        ApiErrorCode.HostNotAllowed,
        hostHeader === undefined
          ? 'the request has no Host header: it names no host the dashboard serves'
          : 'this Host is not one the dashboard serves (DNS-rebinding guard); allow a name with --dashboard-allowed-host',
        { host: hostHeader === undefined ? null : hostHeader.slice(0, 256) },
      );
    }
    let path: string;
    try {
      path = new URL(request.url ?? '/', 'http://dashboard').pathname;
    } catch {
      // `GET http://[` and the like: the client's mistake, not the server's (a 500 logged an error).
      throw new ApiError(400, ApiErrorCode.InvalidRequest, 'the request target is not a valid URL');
    }
    const method = request.method ?? 'GET';

    const asset = assets.get(path === '/index.html' ? '/' : path);
    if (asset) {
      allow(method, ['GET', 'HEAD']);
      response.writeHead(200, {
        'content-type': asset.contentType,
        'content-length': asset.body.length,
        'cache-control': 'no-cache',
        ...securityHeaders(),
      });
      response.end(method === 'HEAD' ? undefined : asset.body);
      return;
    }

    switch (path) {
      case '/api/snapshot':
        allow(method, ['GET']);
        sendJson(response, 200, view());
        return;
      case '/api/history':
        allow(method, ['GET']);
        sendJson(response, 200, history.columns());
        return;
      case '/api/tuning':
        allow(method, ['GET']);
        sendJson(response, 200, {
          engine: tuning?.name ?? null,
          suggestions: tuning ? await tuning.suggestions() : [],
        });
        return;
      case '/api/stream':
        allow(method, ['GET']);
        switch (stream.accept(request, response)) {
          case 'full':
            throw new ApiError(503, ApiErrorCode.CapacityExceeded, 'too many event-stream subscribers', {
              maxClients: options.maxStreamClients ?? 32,
            });
          case 'address-full':
            throw new ApiError(
              429,
              ApiErrorCode.TooManyStreams,
              'this client has as many event streams open as one client may: close one (another tab?)',
              { maxClientsPerAddress: options.maxStreamClientsPerAddress ?? 4 },
            );
        }
        // The page draws at once instead of waiting up to an interval for the next tick. Its own
        // event name: it is the view now, not a tick (charts plot ticks only).
        response.write(`event: snapshot\ndata: ${JSON.stringify(view())}\n\n`);
        return;
      case '/api/admin/check':
        allow(method, ['GET']);
        sendJson(response, 200, { ok: true, actor: authorize(request).name });
        return;
      case '/api/admin/mode': {
        const { actor, body } = await adminRequest(request, method, modeBody);
        sendJson(response, 200, admin.setMode(actor, body.rule, body.mode));
        return;
      }
      case '/api/admin/limit': {
        const { actor, body } = await adminRequest(request, method, limitBody);
        sendJson(response, 200, admin.setLimit(actor, body.rule, body.limitRps));
        return;
      }
      case '/api/admin/clear-override': {
        const { actor, body } = await adminRequest(request, method, clearBody);
        sendJson(response, 200, admin.clearOverride(actor, body.rule));
        return;
      }
      case '/api/admin/tuning/accept': {
        const { actor, body } = await adminRequest(request, method, acceptBody);
        sendJson(response, 200, await admin.acceptSuggestion(actor, body.id));
        return;
      }
      default:
        throw new ApiError(404, ApiErrorCode.NotFound, `no such path: ${path}`);
    }
  }

  /** A request `route` threw for: its `ApiError` answered, anything else logged and a 500. */
  function failed(request: IncomingMessage, response: ServerResponse, error: unknown): void {
    if (error instanceof ApiError) {
      const headers: Record<string, string> = error.status === 401 ? authChallenge() : {};
      if (error.code === ApiErrorCode.TooManyStreams || error.code === ApiErrorCode.CapacityExceeded)
        headers['retry-after'] = String(STREAM_RETRY_AFTER_S);
      if (error.status === 405)
        headers.allow = ((error.details?.allow as string[] | undefined) ?? []).join(', ');
      sendJson(response, error.status, error.toJSON(), headers);
      return;
    }
    // Its body cut short and its connection gone: the client left, or sent a body Node could not
    // parse (answered by `answerClientErrors`). Nobody to answer, and nothing failed here.
    if (!request.complete && !request.socket.writable) return;
    logger.error({ err: String(error), path: request.url }, 'dashboard request failed');
    if (!response.headersSent)
      sendJson(response, 500, { error: { code: 'ERR_INTERNAL', message: 'internal error' } });
    else response.destroy();
  }

  /** An admin action's request: POST, then the bearer token, then a JSON body of `schema`'s shape. */
  async function adminRequest<T>(
    request: IncomingMessage,
    method: string,
    schema: z.ZodType<T>,
  ): Promise<{ actor: AdminActor; body: T }> {
    allow(method, ['POST']);
    const actor = authorize(request);
    return { actor, body: parseBody(schema, await readJson(request)) };
  }

  function authorize(request: IncomingMessage): AdminActor {
    if (adminToken === undefined) {
      throw new ApiError(
        403,
        ApiErrorCode.AdminDisabled,
        'admin actions are disabled: start the controller with --admin-token or SPILLWAY_ADMIN_TOKEN',
      );
    }
    const check = checkBearer(request.headers.authorization, adminToken);
    if (check === 'missing') {
      throw new ApiError(
        401,
        ApiErrorCode.Unauthenticated,
        'admin actions need Authorization: Bearer <token>',
      );
    }
    if (check === 'invalid') throw new ApiError(401, ApiErrorCode.Unauthenticated, 'wrong admin token');
    const given = request.headers['x-spillway-actor'];
    const name = typeof given === 'string' && given !== '' ? given : 'admin';
    if (!ACTOR_PATTERN.test(name)) {
      throw new ApiError(
        400,
        ApiErrorCode.InvalidRequest,
        'x-spillway-actor must be 1-64 letters, digits, spaces or . @ : _ -',
      );
    }
    return { name, remote: request.socket.remoteAddress ?? 'unknown' };
  }

  const { address, port } = await http.listen();

  let closing: Promise<void> | undefined;
  return {
    address,
    port,
    url: `http://${address}/`,
    onTick() {
      // The history is kept with nobody watching (a page opened later starts with minutes of
      // charts): the busiest `maxBuckets` of the controller, never its every bucket.
      const watched = stream.clients > 0;
      const current = view({ children: watched });
      // One event per controller tick, however many timers fire.
      if (current.controller.ticks === lastTicks) return;
      lastTicks = current.controller.ticks;
      history.add(current);
      if (watched) stream.publish('tick', current);
    },
    close() {
      if (closing === undefined) {
        stream.close();
        closing = http.close();
      }
      return closing;
    },
  };
}

/** A body of the wrong shape is a 400 naming the first offending field. */
function parseBody<T>(schema: z.ZodType<T>, value: unknown): T {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  const field = issue.path.map(String).join('.');
  const message =
    issue.code === 'unrecognized_keys'
      ? `unknown field "${issue.keys[0]}"`
      : issue.message.replace(/^Invalid input: /, '');
  throw new ApiError(
    400,
    ApiErrorCode.InvalidRequest,
    field ? `${field}: ${message}` : message,
    field ? { field } : undefined,
  );
}

function allow(method: string, methods: string[]): void {
  if (!methods.includes(method)) {
    throw new ApiError(405, ApiErrorCode.MethodNotAllowed, `use ${methods.join(' or ')}`, { allow: methods });
  }
}

async function readJson(request: IncomingMessage): Promise<unknown> {
  const type = (request.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== 'application/json') {
    throw new ApiError(415, ApiErrorCode.UnsupportedMediaType, 'send the body as application/json');
  }
  const declared = Number(request.headers['content-length'] ?? 0);
  if (declared > MAX_BODY_BYTES) {
    throw new ApiError(413, ApiErrorCode.PayloadTooLarge, `bodies are at most ${MAX_BODY_BYTES} bytes`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) {
      throw new ApiError(413, ApiErrorCode.PayloadTooLarge, `bodies are at most ${MAX_BODY_BYTES} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch (error) {
    throw new ApiError(400, ApiErrorCode.InvalidRequest, `body is not JSON: ${(error as Error).message}`);
  }
}

function securityHeaders(): Record<string, string> {
  return {
    'content-security-policy':
      "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
      "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
  };
}

/** A request Node gave up on, in the API's error shape (`answerClientErrors` adds `Connection: close`). */
function clientFailureResponse(failure: ClientFailure): RawResponse {
  const error = new ApiError(failure.status, CLIENT_FAILURE_CODES[failure.status], failure.message);
  return {
    status: failure.status,
    headers: { 'x-content-type-options': 'nosniff' },
    contentType: 'application/json; charset=utf-8',
    body: `${JSON.stringify(error.toJSON())}\n`,
  };
}

function authChallenge(): Record<string, string> {
  return { 'www-authenticate': 'Bearer realm="spillway-admin"' };
}

function sendJson(
  response: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = `${JSON.stringify(body)}\n`;
  response.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    ...headers,
  });
  response.end(text);
}
