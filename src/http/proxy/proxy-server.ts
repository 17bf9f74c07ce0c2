import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { type Dispatcher, Pool } from 'undici';
import type { Decision } from '../../core/decision.js';
import {
  answerClientErrors,
  type ClientFailure,
  requestHeadFault,
  TIMEOUT_SWEEP_MS,
} from '../../server/http-client-error.js';
import { type RawResponse, writeRawResponse } from '../../server/raw-response.js';
import { createClientAddressResolver, createTrustedProxyMatcher } from '../client-address.js';
import type { EdgeLimiter } from '../limiter-adapter.js';
import { type RateLimitPolicy, rateLimitHeaders } from '../rate-limit-headers.js';
import { rateLimitedBody } from '../rate-limited-response.js';
import {
  type MatchedBucket,
  matchBuckets,
  type RequestFacts,
  repeatedKeyHeader,
} from '../rules/match-buckets.js';
import type { ProxyBucket, ProxyRules, UpstreamConfig } from '../rules/proxy-rules.js';
import { type PathRewrites, requestPathReadings } from '../rules/route-pattern.js';
import { clientResponseHeaders, upstreamRequestHeaders } from './forward-headers.js';
import { lingeringClose } from './lingering-close.js';
import type { ProxyBackend } from './proxy-backend.js';
import {
  type DecisionResult,
  noProxyMetrics,
  type ProxyMetrics,
  type ProxyOutcome,
} from './proxy-metrics.js';
import { assertProxyServerOptionNames } from './proxy-options.js';
import { addRateLimitFields } from './rate-limit-merge.js';
import { type BodyOwner, RequestBody } from './request-body.js';
import { joinTunnel, type Tunnel } from './tunnel.js';
import { UpstreamHealth, type UpstreamHealthReport } from './upstream-health.js';
import { type PoolTurn, UpstreamQueue } from './upstream-queue.js';
import { switchingProtocolsHead, type UpgradeAnswer, UpstreamUpgrade } from './upstream-upgrade.js';

export interface ProxyLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export interface ProxyServerOptions {
  rules: ProxyRules;
  backend: ProxyBackend;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port; read `port`). */
  port?: number;
  metrics?: ProxyMetrics;
  logger?: ProxyLogger;
}

export interface ProxyServer {
  /** `host:port` actually bound. */
  readonly address: string;
  readonly port: number;
  /** Requests and upgraded connections being served. */
  readonly inFlight: number;
  readonly draining: boolean;
  /**
   * The queue for pooled upstream connections (`UpstreamQueue`): `waiting`, requests and upgrades
   * that still want one (at most `upstream.maxQueued`); `held`, the entries it holds, those
   * answered or abandoned while they waited included (swept out once they are half of it).
   */
  readonly upstreamQueue: { readonly waiting: number; readonly held: number };
  /** Whether the upstream answers, as the proxy last found it (upstream-health.ts). */
  readonly upstreamHealth: UpstreamHealthReport;
  /**
   * Apply new rules to requests that arrive from now on (in-flight ones finish under the old).
   * Throws (and changes nothing) when a bucket's limiter cannot be built. Upstream URL, pool size
   * and connect timeout changes need a restart; the other timeouts and everything else apply.
   */
  setRules(rules: ProxyRules): void;
  /**
   * Graceful stop: refuse new connections, let in-flight requests finish, close idle keep-alive
   * connections as they go idle, leave tunnels (upgraded connections) open until either side
   * closes them. After `drainTimeoutMs`, remaining connections and tunnels are cut. Resolves with
   * how many client connections had to be cut (a tunnel is one).
   */
  close(options?: { drainTimeoutMs?: number }): Promise<{ forcedConnections: number }>;
}

interface ActiveRules {
  rules: ProxyRules;
  limiters: Map<ProxyBucket, EdgeLimiter>;
  resolveClient: (peer: string, forwardedFor: string | string[] | undefined) => string;
  isTrustedPeer: (peer: string) => boolean;
}

interface BucketOutcome {
  bucket: ProxyBucket;
  decision: Decision | undefined;
  result: DecisionResult;
}

interface Verdict {
  allowed: boolean;
  visible: { policy: RateLimitPolicy; decision: Decision }[];
  rejectedBy: string[];
  /** Set when a key header came on several lines: the request is answered 400, no bucket decided. */
  repeatedHeader?: string;
}

const LOG_INTERVAL_MS = 10_000;

/** What the proxy takes and forwards: the standard methods but CONNECT (others are forwarded too). */
const FORWARDED_METHODS = 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE';

/** Shared, never mutated: most requests match no bucket or carry no RateLimit fields. */
const NO_HEADERS: Record<string, string> = Object.freeze({}) as Record<string, string>;
const ALLOW_UNLIMITED: Verdict = Object.freeze({ allowed: true, visible: [], rejectedBy: [] });

/**
 * What bucket matching reads from a request, each computed on first use: a rule set whose keys
 * and matches need neither the path readings nor the client address never computes them.
 */
class LazyRequestFacts implements RequestFacts {
  readonly method: string;
  private pathReadings: readonly string[] | undefined = undefined;
  private clientKey: string | undefined = undefined;
  /** Called detached (`context.header(name)` in key templates), so it does not read `this`. */
  readonly header: (name: string) => string | undefined;

  constructor(
    private readonly req: IncomingMessage,
    private readonly resolveClient: ActiveRules['resolveClient'],
    private readonly routing: PathRewrites,
  ) {
    this.method = req.method ?? 'GET';
    this.header = (name) => headerValue(req, name);
  }

  get paths(): readonly string[] {
    if (this.pathReadings === undefined) this.pathReadings = requestPathReadings(this.req.url, this.routing);
    return this.pathReadings;
  }

  /**
   * From `rawHeaders`, as `headers` joins repeated lines (or keeps only the first, for
   * `authorization` and the like). One pass over the lines, no allocation; none at all for a
   * request without the header.
   */
  headerRepeated(name: string): boolean {
    if (this.req.headers[name] === undefined) return false;
    const raw = this.req.rawHeaders;
    let seen = false;
    for (let i = 0; i < raw.length; i += 2) {
      if (!sameHeaderName(raw[i]!, name)) continue;
      if (seen) return true;
      seen = true;
    }
    return false;
  }

  get client(): string {
    if (this.clientKey === undefined) {
      this.clientKey = this.resolveClient(
        this.req.socket.remoteAddress ?? '',
        this.req.headers['x-forwarded-for'],
      );
    }
    return this.clientKey;
  }
}

/**
 * The sidecar reverse proxy: each request is decided against every matching bucket BEFORE it is
 * forwarded; allowed requests stream to the upstream through a pooled undici client and the
 * response streams back, with RateLimit fields added; rejected ones get a 429 from here.
 * See docs/proxy.md.
 */
export async function startProxyServer(options: ProxyServerOptions): Promise<ProxyServer> {
  assertProxyServerOptionNames(options);
  const metrics = options.metrics ?? noProxyMetrics;
  const logger = options.logger;
  const backend = options.backend;
  let active = activate(options.rules, backend);
  const upstreamConfig = options.rules.upstream;
  let upstream: UpstreamConfig = upstreamConfig;
  const pool = new Pool(upstreamConfig.url, {
    connections: upstreamConfig.connections,
    connectTimeout: upstreamConfig.connectTimeoutMs,
    headersTimeout: upstreamConfig.headersTimeoutMs,
    bodyTimeout: upstreamConfig.bodyTimeoutMs,
    keepAliveTimeout: 4_000,
  });
  const queue = new UpstreamQueue(upstreamConfig.connections);
  const upstreamHealth = new UpstreamHealth(logger);
  metrics.watchQueue(() => queue.depth);
  const queueFullMessage = () =>
    `all ${upstreamConfig.connections} upstream connections are busy and ${upstream.maxQueued} requests wait for one`;
  let inFlight = 0;
  let draining = false;
  const tunnels = new Set<Tunnel>();
  /**
   * Client connections Node handed over for an upgrade, until they close: being decided, waiting
   * for the upstream's 101, or tunnels. `closeAllConnections` no longer reaches them.
   */
  const upgradeSockets = new Set<Duplex>();
  /** Set while a graceful stop waits for the last tunnel to close. */
  let lastTunnelClosed: (() => void) | undefined;
  /** What the proxy keeps per client connection, from its first request on. */
  interface ClientConnection {
    /** The last request the proxy was handed: whose a `clientError` is. */
    last: Exchange;
    /**
     * Exchanges not yet closed. A pipelined request waiting behind another has a response with
     * no socket yet, which never closes if the connection does: its in-flight count stayed up for
     * good and it was counted nowhere (found by a review). The connection's `close` closes what
     * is left.
     */
    open: Set<Exchange>;
    /**
     * Set when the `clientError` listener cut the connection while a request on it was in the
     * proxy's hands: that request counts this outcome rather than `client_abort`.
     */
    cut?: ClientErrorOutcome;
  }
  const connections = new WeakMap<Duplex, ClientConnection>();
  let lastLimiterErrorLogMs = 0;

  // An HTTP/1.1 request without Host is answered and counted by `serve` (`requestHeadFault`), not
  // with Node's bare 400 before the request event.
  const server: Server = createServer({
    keepAlive: true,
    connectionsCheckingInterval: TIMEOUT_SWEEP_MS,
    requireHostHeader: false,
  });
  applyServerTimeouts(server, options.rules);
  // Requests Node's parser rejects or its timeout sweep expires: answered and counted here, as
  // the proxy's other answers, instead of Node's bare status lines (see http-client-error.ts). A
  // request the proxy was handed counts the outcome its connection was cut for, not `client_abort`.
  answerClientErrors(server, {
    respond: (failure) =>
      rawJson(failure.status, {}, { error: clientErrorOutcome(failure), message: failure.message }),
    lastExchange: (socket) => connections.get(socket)?.last,
    failed: (failure) => metrics.request(clientErrorOutcome(failure)),
    cut: (socket, failure) => {
      const connection = connections.get(socket);
      if (connection) connection.cut = clientErrorOutcome(failure);
    },
  });
  server.on('request', (req: IncomingMessage, res: ServerResponse) => serve(req, res, false));
  // Decide before telling a client to send its body: a rejected upload is never transferred.
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => serve(req, res, true));
  server.on(
    'upgrade',
    (req: IncomingMessage, socket: Duplex, head: Buffer) => void serveUpgrade(req, socket, head),
  );
  // Node hands CONNECT to 'connect', never to 'request' (with no listener it just drops the
  // connection): a reverse proxy opens no tunnels to arbitrary hosts. A 405 must list what is
  // allowed (RFC 9110 §15.5.6).
  server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    socket.on('error', () => socket.destroy());
    metrics.request('bad_request');
    sendRawJson(
      socket,
      405,
      { allow: FORWARDED_METHODS },
      {
        error: 'bad_request',
        message: 'CONNECT is not supported by this reverse proxy',
      },
    );
  });

  /** The outcome of a request whose client went away: `client_abort`, unless its connection was cut. */
  function goneOutcome(req: IncomingMessage): ProxyOutcome {
    return connections.get(req.socket)?.cut ?? 'client_abort';
  }

  function track(delta: number): void {
    inFlight += delta;
    metrics.inFlight(delta);
  }

  function serve(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): void {
    // Pipelined behind a connection's last response, read while its body is dropped
    // (`lingeringClose`): never answered, the connection closes.
    if (req.socket.writableEnded) return;
    track(1);
    const exchange = new Exchange(req, res, active, expectContinue);
    // The one `close` listener of a request: in-flight count, and a client leaving mid-forward.
    res.on('close', () => exchange.closed());
    let connection = connections.get(req.socket);
    if (connection) connection.last = exchange;
    else {
      const open = new Set<Exchange>();
      connection = { last: exchange, open };
      connections.set(req.socket, connection);
      req.socket.once('close', () => {
        for (const left of open) left.closed();
      });
    }
    connection.open.add(exchange);
    try {
      if (draining) res.setHeader('connection', 'close');
      // A refusal before any body is read: the connection closes rather than read megabytes of a
      // body nobody wants (one waiting for `100 Continue` is not sent, and gets none).
      const refuseBody = () => {
        if (hasBody(req) && !expectContinue) res.setHeader('connection', 'close');
      };
      const headFault = requestHeadFault(req);
      if (headFault !== undefined) {
        metrics.request('bad_request');
        refuseBody();
        sendJson(res, headFault.status, { error: 'bad_request', message: headFault.message });
        return;
      }
      if (req.url === '*' && req.method === 'OPTIONS') {
        answerServerOptions(req, res);
        return;
      }
      const target = requestTarget(req);
      if (target === undefined) {
        metrics.request('bad_request');
        refuseBody();
        sendJson(res, 400, {
          error: 'bad_request',
          message: 'the request target must be an origin-form path',
        });
        return;
      }
      exchange.target = target;
      const verdict = decide(exchange.rules, req);
      if (verdict instanceof Promise) {
        verdict.then((decided) => exchange.proceed(decided)).catch((error) => exchange.failed(error));
        return;
      }
      exchange.proceed(verdict);
    } catch (error) {
      exchange.failed(error);
    }
  }

  /**
   * `OPTIONS *` (asterisk form, RFC 9112 §3.2.4) asks about the server as a whole, not a resource;
   * RFC 9110 §9.3.7 calls it useful only as a ping or to test a server's capabilities. The proxy is
   * the server its clients talk to, so it answers itself: 200, and in `Allow` the methods it takes
   * and forwards. It cannot forward the question: undici sends only origin-form and absolute-form
   * targets (its request validation refuses `*`), and a side channel around the pool would escape
   * `upstream.connections` and the queue. nginx answers 400 and Envoy refuses it too, which fails
   * clients and monitors that ping with it; IIS answers 200 with `Allow`, as here. No bucket is
   * decided: nothing reaches the upstream.
   */
  function answerServerOptions(req: IncomingMessage, res: ServerResponse): void {
    metrics.request('answered_locally');
    // A body (none is defined for it) is not read: the connection closes instead.
    if (hasBody(req)) res.setHeader('connection', 'close');
    res.writeHead(200, { allow: FORWARDED_METHODS, 'content-length': 0 });
    res.end();
  }

  function decide(rules: ActiveRules, req: IncomingMessage): Verdict | Promise<Verdict> {
    if (rules.rules.buckets.length === 0) return ALLOW_UNLIMITED;
    const facts = new LazyRequestFacts(req, rules.resolveClient, rules.rules.routing);
    const matched = matchBuckets(rules.rules.buckets, facts);
    if (matched.length === 0) return ALLOW_UNLIMITED;
    const repeatedHeader = repeatedKeyHeader(matched, facts);
    if (repeatedHeader !== undefined) return { allowed: false, visible: [], rejectedBy: [], repeatedHeader };
    const outcomes: (BucketOutcome | Promise<BucketOutcome>)[] = [];
    let pending = false;
    for (const match of matched) {
      const outcome = decideBucket(rules, match);
      if (outcome instanceof Promise) pending = true;
      outcomes.push(outcome);
    }
    if (!pending) return combine(outcomes as BucketOutcome[]);
    return Promise.all(outcomes).then(combine);
  }

  /** One bucket; a limiter that throws admits (logged, counted as `error`): the proxy fails open. */
  function decideBucket(rules: ActiveRules, match: MatchedBucket): BucketOutcome | Promise<BucketOutcome> {
    const limiter = rules.limiters.get(match.bucket)!;
    const cost = match.bucket.config.cost;
    try {
      if (limiter.kind === 'sync') return classify(match.bucket, limiter.limit(match.key, cost));
      return limiter.limit(match.key, cost).then(
        (decision) => classify(match.bucket, decision),
        (error: unknown) => limiterFailed(match, error),
      );
    } catch (error) {
      return limiterFailed(match, error);
    }
  }

  function limiterFailed(match: MatchedBucket, error: unknown): BucketOutcome {
    const nowMs = Date.now();
    if (nowMs - lastLimiterErrorLogMs >= LOG_INTERVAL_MS) {
      lastLimiterErrorLogMs = nowMs;
      logger?.warn(
        { bucket: match.bucket.config.name, err: error instanceof Error ? error.message : String(error) },
        'proxy: limiter failed; request admitted',
      );
    }
    metrics.decision(match.bucket.config.name, 'error');
    return { bucket: match.bucket, decision: undefined, result: 'error' };
  }

  function classify(bucket: ProxyBucket, decision: Decision): BucketOutcome {
    let result: DecisionResult;
    if (decision.reason === 'fail-open') result = 'fail_open';
    else if (decision.reason === 'fail-closed') result = bucket.shadow ? 'would_drop' : 'fail_closed';
    else if (decision.reason === 'shadow' || (bucket.shadow && !decision.allowed)) result = 'would_drop';
    else result = decision.allowed ? 'allowed' : 'rejected';
    metrics.decision(bucket.config.name, result);
    return { bucket, decision, result };
  }

  function combine(outcomes: BucketOutcome[]): Verdict {
    const visible: Verdict['visible'] = [];
    const rejectedBy: string[] = [];
    for (const { bucket, decision, result } of outcomes) {
      // Shadow buckets and undecided ones (limiter error, fail-open with no real count) stay invisible.
      if (decision === undefined || bucket.shadow || result === 'fail_open') continue;
      if (result === 'rejected' || result === 'fail_closed') rejectedBy.push(bucket.config.name);
      visible.push({
        policy: bucket.policy,
        decision: result === 'would_drop' ? { ...decision, allowed: true } : decision,
      });
    }
    return { allowed: rejectedBy.length === 0, visible, rejectedBy };
  }

  /**
   * An upgrade waiting in the queue: until its upstream answers 101 (undici then detaches the
   * socket from the pool), an upgrade holds a pooled connection like any request, so it waits for
   * one in the same queue, under the same deadline.
   */
  class UpgradeTurn implements PoolTurn {
    readonly granted: Promise<void>;
    queued = false;
    private grant: () => void = () => {};
    private readonly startedMs = performance.now();

    /** `timeoutMs`: its deadline, running since now (0: none). */
    constructor(
      private readonly signal: AbortSignal,
      private readonly timeoutMs: number,
    ) {
      this.granted = new Promise((resolve) => {
        this.grant = resolve;
      });
      signal.addEventListener(
        'abort',
        () => {
          if (this.queued) queue.abandon();
        },
        { once: true },
      );
    }

    /** Its client left or its deadline passed while it waited: it takes no connection. */
    get wanted(): boolean {
      return !this.signal.aborted;
    }

    takeTurn(): void {
      // Its deadline is due, its timer not yet run: it would be aborted as it gets its connection.
      if (this.timeoutMs > 0 && performance.now() - this.startedMs >= this.timeoutMs - 1) return;
      queue.take();
      this.grant();
    }
  }

  /**
   * One request, from its arrival to its `close`. When it is forwarded, this is also the undici
   * dispatch handler of its upstream request: response headers go out with `writeHead`, each
   * body chunk with `res.write` (the upstream socket paused while `res` is over its high-water
   * mark, resumed on `drain`), and the outcome is counted once. No response stream, promise or
   * AbortController per request: the client leaving (`closed`) aborts through the controller.
   *
   * Waiting for the upstream is bounded by one deadline, `upstream.headersTimeoutMs`, from the
   * forward: time waiting for a connection (in `queue`) counts (undici's own headers timeout
   * starts only once the request is on a connection, so a saturated pool would hold requests for
   * ever).
   * It is suspended while the request body is sent, whose pace is the client's (bounded by
   * `server.bodyTimeoutMs` per pause, see `RequestBody`), and resumes with what is left of it once
   * the body is sent. One timer per forwarded request, set and cleared: a fraction of a
   * microsecond against the tens a proxied request costs.
   */
  class Exchange implements Dispatcher.DispatchHandler, BodyOwner, PoolTurn {
    target = '';
    headers: Record<string, string | string[]> = NO_HEADERS;
    /** Handed to the pool and not yet finished there (holding one of `queue`'s connections). */
    inPool = false;
    /** Waiting in `queue` for a pooled connection. */
    queued = false;
    limitHeaders: Record<string, string> = NO_HEADERS;
    /** Set once forwarded: the outcome counted for it (at most once). */
    forwarded = false;
    outcome: ProxyOutcome | undefined = undefined;
    controller: Dispatcher.DispatchController | undefined = undefined;
    /** The client left before its response was complete. */
    clientGone = false;
    /** Upstream response headers arrived, or the deadline for them passed. */
    headersTimed = false;
    /** The upstream response ended (`res.end()` called). */
    upstreamEnded = false;
    startedMs = 0;
    /** When the request got an upstream connection (`onRequestStart`); 0 while queued. */
    connectedMs = 0;
    /** When the upstream had the whole request: its body sent, or its connection taken if it has none. */
    sentMs = 0;
    /** `upstream.headersTimeoutMs` when the request was forwarded (0: no deadline). */
    headersTimeoutMs = 0;
    /** The headers deadline, while it runs. */
    deadline: NodeJS.Timeout | undefined = undefined;
    body: RequestBody | null = null;

    constructor(
      readonly req: IncomingMessage,
      readonly res: ServerResponse,
      readonly rules: ActiveRules,
      readonly expectContinue: boolean,
    ) {}

    /** The verdict is in: answer 429, or forward; nothing when the client left while it was pending. */
    proceed(verdict: Verdict): void {
      const { req, res } = this;
      if (this.clientGone) {
        metrics.request(goneOutcome(req));
        return;
      }
      if (verdict.repeatedHeader !== undefined) {
        metrics.request('bad_request');
        if (hasBody(req) && !this.expectContinue) res.setHeader('connection', 'close');
        sendJson(res, 400, repeatedHeaderBody(verdict.repeatedHeader));
        return;
      }
      const limitHeaders = verdict.visible.length === 0 ? NO_HEADERS : rateLimitHeaders(verdict.visible);
      if (!verdict.allowed) {
        metrics.request('limited');
        // A body we will not read: close the connection instead of draining megabytes.
        if (hasBody(req) && !this.expectContinue) res.setHeader('connection', 'close');
        const retryAfter = limitHeaders['Retry-After'] ?? '1';
        sendJson(res, 429, rateLimitedBody(verdict.rejectedBy, Number(retryAfter)), limitHeaders);
        return;
      }
      if (this.expectContinue) res.writeContinue();
      this.forward(limitHeaders);
    }

    forward(limitHeaders: Record<string, string>): void {
      const { req, rules } = this;
      const peer = req.socket.remoteAddress;
      const headers = upstreamRequestHeaders(req.headers, {
        peerAddress: peer,
        peerTrusted: peer !== undefined && rules.isTrustedPeer(peer),
        protocol: 'http',
        preserveHost: upstream.preserveHost,
      });
      this.body = hasBody(req)
        ? new RequestBody(
            req,
            this,
            rules.rules.server.bodyTimeoutMs,
            upstream.sendTimeoutMs,
            rules.rules.server.bodyMinBytesPerSec,
          )
        : null;
      this.limitHeaders = limitHeaders;
      this.forwarded = true;
      this.startedMs = performance.now();
      this.headersTimeoutMs = upstream.headersTimeoutMs;
      if (this.headersTimeoutMs > 0) this.deadline = setTimeout(headersDeadline, this.headersTimeoutMs, this);
      this.headers = headers;
      if (queue.hasRoom()) this.dispatch();
      else if (queue.isFull(upstream.maxQueued)) this.refuseQueueFull();
      else queue.wait(this);
    }

    /** Not answered (timed out, client gone) while it waited in `queue`. */
    get wanted(): boolean {
      return this.outcome === undefined;
    }

    /** Its turn at the pool, out of `queue`: dispatched. */
    takeTurn(): void {
      // Its deadline is due, its timer not yet run (timers due together run one after another, and
      // this runs between them): dispatched, it would be aborted as it gets its connection.
      if (this.headersTimeoutMs > 0 && performance.now() - this.startedMs >= this.headersTimeoutMs - 1) {
        clearTimeout(this.deadline);
        this.headersTimedOut();
        return;
      }
      this.dispatch();
    }

    /** To the pool, which has a connection free for it (or is opening one). */
    dispatch(): void {
      queue.take();
      this.inPool = true;
      try {
        pool.dispatch(
          {
            path: this.target,
            method: this.req.method as Dispatcher.HttpMethod,
            headers: this.headers,
            // Dispatcher.md lists async iterables among request bodies; the type declarations do not.
            body: this.body as unknown as Dispatcher.DispatchOptions['body'],
            headersTimeout: this.headersTimeoutMs,
            bodyTimeout: upstream.bodyTimeoutMs,
          },
          this,
        );
      } catch (error) {
        // undici reports failures through onResponseError; a throw here is a bug: a 500, not a crash.
        this.leftPool();
        this.settle('upstream_error');
        this.failed(error);
      }
    }

    /** Every pooled connection busy and the queue full: 503, the request never sent. */
    refuseQueueFull(): void {
      this.settle('upstream_queue_full');
      this.closeAfterResponse();
      sendJson(
        this.res,
        503,
        { error: 'upstream_queue_full', message: queueFullMessage() },
        this.limitHeaders,
      );
    }

    /** undici is done with the request (ended, failed or aborted): its connection takes the next one waiting. */
    leftPool(): void {
      if (!this.inPool) return;
      this.inPool = false;
      queue.release();
    }

    /** The headers deadline passed: 504, whether the request is still queued or on a connection. */
    headersTimedOut(): void {
      this.deadline = undefined;
      if (this.outcome !== undefined || this.headersTimed) return;
      const queued = this.controller === undefined;
      // Time queued is the pool's, not the upstream's: not a headers wait.
      if (queued) this.headersTimed = true;
      else this.recordHeadersWait();
      const failure: UpstreamFailure = queued
        ? {
            status: 504,
            outcome: 'upstream_queue_timeout',
            message: `the request waited ${this.headersTimeoutMs} ms for one of the ${upstream.connections} upstream connections`,
          }
        : {
            status: 504,
            outcome: 'upstream_timeout',
            message: `upstream sent no response headers within ${this.headersTimeoutMs} ms`,
          };
      this.settle(failure.outcome);
      // Still in `queue`: skipped there. Handed to the pool but not yet on a connection (one being
      // opened): dropped in onRequestStart, before anything is written, at the cost of that connection.
      this.controller?.abort(new ExchangeAbortError(failure.message));
      this.closeAfterResponse();
      sendJson(
        this.res,
        failure.status,
        { error: failure.outcome, message: failure.message },
        this.limitHeaders,
      );
    }

    /** The request body was sent whole: the wait for headers resumes with what is left of the deadline. */
    bodySent(): void {
      this.sentMs = performance.now();
      if (this.outcome !== undefined || this.headersTimed || this.headersTimeoutMs === 0) return;
      const leftMs = this.headersTimeoutMs - (this.connectedMs - this.startedMs);
      this.deadline = setTimeout(headersDeadline, Math.max(1, leftMs), this);
    }

    /** No request body bytes for `timeoutMs` while undici waited for them: 408, or a cut response. */
    bodyIdle(timeoutMs: number): void {
      // The client is the stalled side: nothing to read and drop after the answer.
      this.bodyStalled('client_timeout', 408, `no request body bytes for ${timeoutMs} ms`, false);
    }

    /** The request body came slower than `server.bodyMinBytesPerSec`: 408, or a cut response. */
    bodyTooSlow(receivedBytes: number, waitedMs: number, minBytesPerSec: number): void {
      this.bodyStalled(
        'client_timeout',
        408,
        `the request body came slower than ${minBytesPerSec} bytes/s: ${receivedBytes} bytes in ${Math.round(waitedMs)} ms`,
        false,
      );
    }

    /** The upstream took no request body bytes for `timeoutMs`: 504, or a cut response. */
    bodyStuckUpstream(timeoutMs: number): void {
      this.bodyStalled(
        'upstream_timeout',
        504,
        `upstream took no request body bytes for ${timeoutMs} ms`,
        true,
      );
    }

    /**
     * The request body stalled on one side: the upstream request is aborted and the client gets
     * `status` with `Connection: close`, or a cut response once one started. `drainRest`: the rest
     * of the body is read and dropped after the answer (`closeAfterResponse`).
     */
    bodyStalled(
      outcome: 'client_timeout' | 'upstream_timeout',
      status: 408 | 504,
      message: string,
      drainRest: boolean,
    ): void {
      if (this.outcome !== undefined) return;
      this.settle(outcome);
      const res = this.res;
      if (res.headersSent) {
        res.destroy();
      } else {
        if (drainRest) this.closeAfterResponse();
        else res.setHeader('connection', 'close');
        sendJson(res, status, { error: outcome, message }, this.limitHeaders);
      }
      this.controller?.abort(new ExchangeAbortError(message));
    }

    /**
     * This response is the connection's last (`Connection: close`). When the request body is not
     * all read, the rest is read and dropped after the response, bounded (`lingeringClose`), so
     * the connection neither stalls on an unread upload nor resets before the client has read
     * the response.
     */
    closeAfterResponse(): void {
      const { req, res } = this;
      if (!res.headersSent) res.setHeader('connection', 'close');
      if (this.body !== null && !req.complete) lingeringClose(req, this.rules.rules.server.bodyTimeoutMs);
    }

    /**
     * `spillway_proxy_upstream_headers_seconds`: how long the upstream took to answer, from the
     * whole request sent (the connection taken, when it answers before the body is all sent) to
     * its headers or its deadline. Neither time queued for a connection nor the client's upload
     * pace counts, and a request that fails otherwise (client gone, body timeout, upstream
     * error) records nothing.
     */
    recordHeadersWait(): void {
      this.headersTimed = true;
      const fromMs = this.sentMs === 0 ? this.connectedMs : this.sentMs;
      metrics.upstreamHeadersSeconds((performance.now() - fromMs) / 1000);
    }

    /** Deciding or forwarding threw: a 500, or a cut response once headers are out. */
    failed(error: unknown): void {
      logger?.error({ err: error instanceof Error ? error.message : String(error) }, 'proxy: request failed');
      if (!this.res.headersSent)
        sendJson(this.res, 500, { error: 'internal_error', message: 'the proxy failed' });
      else this.res.destroy();
    }

    settle(outcome: ProxyOutcome): void {
      if (this.outcome !== undefined) return;
      this.outcome = outcome;
      metrics.request(outcome);
      clearTimeout(this.deadline);
      if (this.queued) queue.abandon();
      this.body?.stop();
    }

    /**
     * `res` closed: the response is complete, or the client went away: before its verdict (then
     * `proceed` forwards nothing) or while forwarded (abort upstream).
     */
    closed(): void {
      if (!connections.get(this.req.socket)?.open.delete(this)) return;
      track(-1);
      if (this.outcome !== undefined) return;
      if (this.res.writableFinished) {
        if (this.forwarded) this.settle('forwarded');
        return;
      }
      this.clientGone = true;
      if (!this.forwarded) return;
      // Not yet on a connection: skipped in `queue`, or aborted in onRequestStart when it gets one.
      if (!this.upstreamEnded) this.controller?.abort(new ExchangeAbortError(CLIENT_GONE));
      this.settle(goneOutcome(this.req));
    }

    onRequestStart(controller: Dispatcher.DispatchController): void {
      this.controller = controller;
      // Answered while it was queued (the client left, or the deadline passed): never sent.
      if (this.outcome !== undefined) {
        controller.abort(new ExchangeAbortError(`answered while queued (${this.outcome})`));
        return;
      }
      this.connectedMs = performance.now();
      if (this.body === null) this.sentMs = this.connectedMs;
      else clearTimeout(this.deadline);
    }

    onResponseStart(
      controller: Dispatcher.DispatchController,
      statusCode: number,
      headers: IncomingHttpHeaders,
    ): void {
      // 1xx informational responses are not relayed (Node answers the client's 100-continue itself).
      if (statusCode < 200) return;
      clearTimeout(this.deadline);
      upstreamHealth.answered();
      this.recordHeadersWait();
      this.body?.responseStarted();
      const res = this.res;
      const responseHeaders = clientResponseHeaders(headers);
      addRateLimitFields(responseHeaders, this.limitHeaders);
      // The upstream answers before it has the whole body (a 413, a 401, an echo): the rest of
      // the upload has to be read before this connection could carry another request.
      if (this.body !== null && !this.req.complete) this.closeAfterResponse();
      try {
        res.writeHead(statusCode, responseHeaders);
      } catch (error) {
        // An upstream header Node refuses to send (invalid characters): a broken upstream reply.
        this.settle('upstream_error');
        controller.abort(error as Error);
        sendJson(res, 502, {
          error: 'upstream_error',
          message: `invalid upstream response: ${(error as Error).message}`,
        });
      }
    }

    onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
      if (this.outcome !== undefined) return;
      if (!this.res.write(chunk)) {
        controller.pause();
        const timeoutMs = this.rules.rules.server.sendTimeoutMs;
        const stalled = timeoutMs > 0 ? setTimeout(responseStalledFired, timeoutMs, this) : undefined;
        this.res.once('drain', () => {
          clearTimeout(stalled);
          controller.resume();
        });
      }
    }

    /** The client took no response bytes for `server.sendTimeoutMs`: the response is cut. */
    responseStalled(): void {
      if (this.outcome !== undefined) return;
      this.settle('client_timeout');
      this.res.destroy();
      this.controller?.abort(new ExchangeAbortError('the client stopped reading the response'));
    }

    onResponseEnd(): void {
      this.leftPool();
      this.upstreamEnded = true;
      if (this.outcome === undefined) this.res.end();
    }

    onResponseError(_controller: Dispatcher.DispatchController | undefined, error: Error): void {
      this.leftPool();
      if (this.outcome !== undefined) return;
      const res = this.res;
      if (this.clientGone || res.destroyed || this.req.destroyed) {
        this.settle(goneOutcome(this.req));
        return;
      }
      if (res.headersSent) {
        // The upstream body failed mid-way: the client sees a cut response.
        this.settle('upstream_error');
        res.destroy();
        return;
      }
      const failure = describeUpstreamFailure(error, upstream);
      upstreamHealth.failed(failure);
      this.settle(failure.outcome);
      this.closeAfterResponse();
      sendJson(res, failure.status, { error: failure.outcome, message: failure.message }, this.limitHeaders);
    }
  }

  async function serveUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    track(1);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      upgradeSockets.delete(socket);
      track(-1);
    };
    upgradeSockets.add(socket);
    socket.once('close', release);
    socket.on('error', () => socket.destroy());
    // A client that leaves before the tunnel is joined: server sockets are half-open, so one that
    // goes away may only end its side; 'end' is seen only while the socket is read. `read(0)`
    // consumes nothing: bytes the client sends after its request stay buffered for the tunnel.
    const abort = new AbortController();
    const leave = () => abort.abort(new ExchangeAbortError(CLIENT_GONE));
    const watch = () => socket.read(0);
    socket.on('readable', watch);
    socket.once('end', leave);
    socket.once('close', leave);
    const stopWatching = () => {
      socket.off('readable', watch);
      socket.off('end', leave);
      socket.off('close', leave);
    };
    const rules = active;
    try {
      // Pipelined behind a request still unanswered on this connection: any answer now would pass
      // for that request's (Node hands an upgrade over at once). Nothing is written, the connection
      // closes, as for a parse error there (`answerClientErrors`); that request counts client_abort.
      const open = connections.get(socket)?.open;
      if (open !== undefined && [...open].some((earlier) => !earlier.res.writableFinished)) {
        metrics.request('bad_request');
        socket.destroy();
        return;
      }
      const target = requestTarget(req);
      if (draining || target === undefined) {
        metrics.request(draining ? 'draining' : 'bad_request');
        sendRawJson(socket, draining ? 503 : 400, {}, { error: draining ? 'draining' : 'bad_request' });
        return;
      }
      // Node never required it of an upgrade (`requireHostHeader` checks plain requests only).
      const headFault = requestHeadFault(req);
      if (headFault !== undefined) {
        metrics.request('bad_request');
        sendRawJson(socket, headFault.status, {}, { error: 'bad_request', message: headFault.message });
        return;
      }
      const verdictOrPromise = decide(rules, req);
      const verdict = verdictOrPromise instanceof Promise ? await verdictOrPromise : verdictOrPromise;
      if (abort.signal.aborted) {
        metrics.request('client_abort');
        socket.destroy();
        return;
      }
      if (verdict.repeatedHeader !== undefined) {
        metrics.request('bad_request');
        sendRawJson(socket, 400, {}, repeatedHeaderBody(verdict.repeatedHeader));
        return;
      }
      const limitHeaders = rateLimitHeaders(verdict.visible);
      if (!verdict.allowed) {
        metrics.request('limited');
        sendRawJson(
          socket,
          429,
          limitHeaders,
          rateLimitedBody(verdict.rejectedBy, Number(limitHeaders['Retry-After'] ?? '1')),
        );
        return;
      }
      const peer = req.socket.remoteAddress;
      const headers = upstreamRequestHeaders(req.headers, {
        peerAddress: peer,
        peerTrusted: peer !== undefined && rules.isTrustedPeer(peer),
        protocol: 'http',
        preserveHost: upstream.preserveHost,
      });
      // One deadline for a pooled connection and the upstream's answer, as for any request.
      const headersTimeoutMs = upstream.headersTimeoutMs;
      let timedOut = false;
      const deadline =
        headersTimeoutMs > 0
          ? setTimeout(() => {
              timedOut = true;
              abort.abort(new ExchangeAbortError('upgrade deadline'));
            }, headersTimeoutMs)
          : undefined;
      // undici acts on the abort only once the upgrade has a connection (one being opened may
      // take a while): the client's answer cannot wait for it.
      const abandoned = new Promise<undefined>((resolve) =>
        abort.signal.addEventListener('abort', () => resolve(undefined), { once: true }),
      );
      let holdsConnection = false;
      if (queue.hasRoom()) {
        queue.take();
        holdsConnection = true;
      } else if (queue.isFull(upstream.maxQueued)) {
        clearTimeout(deadline);
        stopWatching();
        metrics.request('upstream_queue_full');
        sendRawJson(socket, 503, limitHeaders, {
          error: 'upstream_queue_full',
          message: queueFullMessage(),
        });
        return;
      } else {
        const turn = new UpgradeTurn(abort.signal, headersTimeoutMs);
        queue.wait(turn);
        await Promise.race([turn.granted.then(() => (holdsConnection = true)), abandoned]);
      }
      let upgrading: UpstreamUpgrade | undefined;
      let answer: UpgradeAnswer | undefined;
      let failure: unknown;
      if (holdsConnection && !abort.signal.aborted) {
        upgrading = new UpstreamUpgrade(socket, limitHeaders, abort.signal, rules.rules.server.sendTimeoutMs);
        // Upgraded (detached), answered whole or failed, undici is done with the pooled connection.
        upgrading.finished.then(() => queue.release());
        pool.dispatch(
          {
            path: target,
            method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
            headers,
            upgrade: headerValue(req, 'upgrade') ?? 'websocket',
            // Ours runs from the decision, queue time included (above).
            headersTimeout: 0,
            bodyTimeout: upstream.bodyTimeoutMs,
          },
          upgrading,
        );
        try {
          answer = await Promise.race([upgrading.answer, abandoned]);
        } catch (error) {
          failure = error;
        }
      } else if (holdsConnection) {
        // Its turn came as it was abandoned: the connection goes to the next one waiting.
        queue.release();
      }
      clearTimeout(deadline);
      stopWatching();
      if (abort.signal.aborted) {
        // An upgrade that succeeds after all is closed at once (UpstreamUpgrade sees the abort).
        if (timedOut) {
          // Still queued, or handed to the pool with its connection still being opened.
          const queued = upgrading === undefined || !upgrading.connected;
          const outcome = queued ? 'upstream_queue_timeout' : 'upstream_timeout';
          metrics.request(outcome);
          sendRawJson(socket, 504, limitHeaders, {
            error: outcome,
            message: queued
              ? `the upgrade waited ${headersTimeoutMs} ms for one of the ${upstream.connections} upstream connections`
              : `upstream answered no upgrade within ${headersTimeoutMs} ms`,
          });
        } else {
          metrics.request('client_abort');
          socket.destroy();
        }
        return;
      }
      if (answer === undefined) {
        const described = describeUpstreamFailure(failure, upstream);
        metrics.request(described.outcome);
        sendRawJson(socket, described.status, limitHeaders, {
          error: described.outcome,
          message: described.message,
        });
        return;
      }
      metrics.request('forwarded');
      // Another answer is on its way to the client (UpstreamUpgrade relays it, then closes).
      if (answer.kind === 'answered') return;
      const upstreamSocket = answer.socket;
      // Header bytes as undici read them (latin1), not re-encoded as UTF-8.
      socket.write(switchingProtocolsHead(answer.headers, limitHeaders), 'latin1');
      if (head.length > 0) upstreamSocket.write(head);
      const tunnel = joinTunnel(socket, upstreamSocket, rules.rules.server.upgradeIdleTimeoutMs, () => {
        tunnels.delete(tunnel);
        if (tunnels.size === 0) lastTunnelClosed?.();
      });
      tunnels.add(tunnel);
    } catch (error) {
      logger?.error({ err: error instanceof Error ? error.message : String(error) }, 'proxy: upgrade failed');
      socket.destroy();
      release();
    }
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  const address =
    bound.family === 'IPv6' ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`;

  return {
    address,
    port: bound.port,
    get inFlight() {
      return inFlight;
    },
    get draining() {
      return draining;
    },
    get upstreamQueue() {
      return { waiting: queue.depth, held: queue.held };
    },
    get upstreamHealth() {
      return upstreamHealth.report();
    },
    setRules(rules) {
      const next = activate(rules, backend);
      const { url, connections, connectTimeoutMs } = rules.upstream;
      if (
        url !== upstream.url ||
        connections !== upstream.connections ||
        connectTimeoutMs !== upstream.connectTimeoutMs
      ) {
        logger?.warn(
          { url, connections, connectTimeoutMs },
          'proxy: upstream url, connections and connectTimeoutMs apply after a restart; keeping the current ones',
        );
      }
      // The pool was built with these: they stay, and so do the messages that quote them.
      upstream = {
        ...rules.upstream,
        url: upstream.url,
        connections: upstream.connections,
        connectTimeoutMs: upstream.connectTimeoutMs,
      };
      applyServerTimeouts(server, rules);
      active = next;
      // Requests still deciding under the old rules hold their limiters; only the backend lets go.
      backend.keepOnly(new Set(rules.buckets.map((bucket) => bucket.config.name)));
    },
    async close({ drainTimeoutMs = 10_000 } = {}) {
      draining = true;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      // Keep-alive connections go idle as their last response completes; close each as it does.
      const idleSweep = setInterval(() => server.closeIdleConnections(), 50);
      let timer: NodeJS.Timeout | undefined;
      const deadline = new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), drainTimeoutMs);
      });
      // Tunnels stay open through the drain: the proxy cannot say goodbye inside a protocol it
      // only relays, the upstream can (a WebSocket close frame; in a sidecar pod it is stopping
      // too). The drain ends as soon as the last one closes, from either side, or idles out.
      const tunnelsClosed = new Promise<void>((resolve) => {
        if (tunnels.size === 0) resolve();
        else lastTunnelClosed = resolve;
      });
      const finished = await Promise.race([
        Promise.all([closed, tunnelsClosed]).then(() => 'drained' as const),
        deadline,
      ]);
      clearInterval(idleSweep);
      clearTimeout(timer);
      let forcedConnections = 0;
      if (finished === 'timeout') {
        // Client connections the server still holds, a tunnel's client side among them: each
        // tunnel counts once (its upstream side is not a client connection).
        forcedConnections = countConnections(server);
        server.closeAllConnections();
        for (const socket of upgradeSockets) socket.destroy();
        for (const tunnel of tunnels) tunnel.destroy();
        await closed;
        await pool.destroy();
      } else {
        await pool.close();
      }
      return { forcedConnections };
    },
  };
}

function activate(rules: ProxyRules, backend: ProxyBackend): ActiveRules {
  const limiters = new Map<ProxyBucket, EdgeLimiter>();
  for (const bucket of rules.buckets) limiters.set(bucket, backend.limiterFor(bucket));
  return {
    rules,
    limiters,
    resolveClient: createClientAddressResolver(rules.clientAddress),
    isTrustedPeer: createTrustedProxyMatcher(rules.clientAddress.trustedProxies),
  };
}

function applyServerTimeouts(server: Server, rules: ProxyRules): void {
  server.keepAliveTimeout = rules.server.keepAliveTimeoutMs;
  server.requestTimeout = rules.server.requestTimeoutMs;
  server.headersTimeout = rules.server.headersTimeoutMs;
}

function countConnections(server: Server): number {
  // `getConnections` is async and callback-based; the sockets the server still tracks suffice here.
  const connections = (server as unknown as { _connections?: number })._connections;
  return typeof connections === 'number' ? connections : 0;
}

/** The origin-form target to forward, or undefined for `*` and unparsable absolute forms. */
function requestTarget(req: IncomingMessage): string | undefined {
  const url = req.url;
  if (url === undefined || url === '') return undefined;
  if (url.startsWith('/')) return url;
  try {
    const parsed = new URL(url);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return undefined;
    return `${parsed.pathname}${parsed.search}`;
  } catch {
    return undefined;
  }
}

function hasBody(req: IncomingMessage): boolean {
  const length = req.headers['content-length'];
  if (length !== undefined) return length !== '0';
  return req.headers['transfer-encoding'] !== undefined;
}

function repeatedHeaderBody(name: string): { error: string; message: string; header: string } {
  return {
    error: 'repeated_key_header',
    message: `the ${name} header is part of a rate limit key and must be sent once; it came on several lines`,
    header: name,
  };
}

/** `raw` (as sent) is `lowerCaseName` ignoring ASCII letter case; allocates nothing. */
function sameHeaderName(raw: string, lowerCaseName: string): boolean {
  if (raw.length !== lowerCaseName.length) return false;
  for (let i = 0; i < raw.length; i++) {
    let code = raw.charCodeAt(i);
    if (code >= 0x41 && code <= 0x5a) code += 0x20;
    if (code !== lowerCaseName.charCodeAt(i)) return false;
  }
  return true;
}

function headerValue(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  if (typeof value === 'string') return value;
  // Not `undefined` alone: `req.headers` is a plain object, whose `__proto__` is no header.
  return Array.isArray(value) ? value.join(', ') : undefined;
}

const CLIENT_GONE = 'the client closed the connection before its response was complete';

/** The reason the proxy aborts an upstream request with (the client left, a deadline passed). */
class ExchangeAbortError extends Error {
  readonly code = 'SPILLWAY_PROXY_ABORTED';
}

function headersDeadline(exchange: { headersTimedOut(): void }): void {
  exchange.headersTimedOut();
}

function responseStalledFired(exchange: { responseStalled(): void }): void {
  exchange.responseStalled();
}

/** What the proxy answers on a socket no `ServerResponse` writes to: a JSON body, as `sendJson`. */
function sendRawJson(
  socket: Duplex,
  status: number,
  headers: Record<string, string>,
  body: Record<string, unknown>,
): void {
  writeRawResponse(socket, rawJson(status, headers, body));
}

function rawJson(
  status: number,
  headers: Record<string, string>,
  body: Record<string, unknown>,
): RawResponse {
  return {
    status,
    headers,
    contentType: 'application/json; charset=utf-8',
    body: `${JSON.stringify(body)}\n`,
  };
}

/** What a request Node's server gave up on is counted as. */
type ClientErrorOutcome = Extract<ProxyOutcome, 'client_timeout' | 'bad_request'>;

function clientErrorOutcome(failure: ClientFailure): ClientErrorOutcome {
  return failure.status === 408 ? 'client_timeout' : 'bad_request';
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): void {
  const text = `${JSON.stringify(body)}\n`;
  res.writeHead(status, {
    ...headers,
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
  });
  res.end(text);
}

interface UpstreamFailure {
  status: 502 | 504;
  outcome: Extract<ProxyOutcome, 'upstream_error' | 'upstream_timeout' | 'upstream_queue_timeout'>;
  message: string;
}

/** undici and socket errors as the status a client should see and a message an operator can act on. */
function describeUpstreamFailure(error: unknown, upstream: UpstreamConfig): UpstreamFailure {
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

function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current instanceof Error; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && code !== 'UND_ERR_CONNECT' && code !== 'UND_ERR') return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}
