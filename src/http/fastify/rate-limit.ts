import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import { assertMiddlewareOptionNames } from '../middleware-options.js';
import {
  createRateLimitMiddleware,
  type FrameworkAdapter,
  type RateLimitMiddlewareOptions,
  type RateLimitStats,
} from '../rate-limit-middleware.js';
import { RATE_LIMITED_CONTENT_TYPE } from '../rate-limited-response.js';

export type FastifyRateLimitOptions = RateLimitMiddlewareOptions<FastifyRequest, FastifyReply>;

/** An `onRequest` hook (callback style, so a synchronous decision calls `done` synchronously). */
export type FastifyRateLimitHook = (
  request: FastifyRequest,
  reply: FastifyReply,
  done: HookHandlerDoneFunction,
) => void;

/**
 * A Fastify plugin that adds the rate limit `onRequest` hook to the instance it is registered on
 * and, like a plugin wrapped by `fastify-plugin`, to the registering scope (it is not
 * encapsulated): `await app.register(limit)` limits every route of `app`. For one route, pass
 * `limit.onRequest` in the route's `onRequest` option instead.
 */
export interface FastifyRateLimit {
  (instance: FastifyInstance, options: unknown, done: (error?: Error) => void): void;
  readonly onRequest: FastifyRateLimitHook;
  readonly stats: RateLimitStats;
  /** The default key of `request`: its client address after trusted-proxy and prefix rules. */
  clientAddress(request: FastifyRequest): string;
}

/**
 * The client address comes from the raw socket and the raw X-Forwarded-For header, never from
 * `request.ip`, so Fastify's own `trustProxy` setting cannot widen who may choose their key.
 */
/** Set on a rejected request's reply once `send` was called: Fastify's `reply.sent` waits for the end. */
const SEND_CALLED = Symbol('spillway.sendCalled');
type WatchedReply = FastifyReply & { [SEND_CALLED]?: true };

const fastifyAdapter: FrameworkAdapter<FastifyRequest, FastifyReply> = {
  peerAddress: (request) => request.raw.socket?.remoteAddress,
  forwardedFor: (request) => request.headers['x-forwarded-for'],
  getHeader: (reply, name) => reply.getHeader(name),
  setHeader: (reply, name, value) => {
    reply.header(name, value);
  },
  setStatus: (reply, statusCode) => {
    reply.code(statusCode);
  },
  ended: (reply) => reply.sent || reply.raw.destroyed || (reply as WatchedReply)[SEND_CALLED] === true,
  // `reply.sent` stays false until the raw response ends, after the app's async `onSend` hooks:
  // a custom `onLimited` that sent would look unanswered and get the default body sent too.
  answering: (reply) => {
    const send = reply.send;
    reply.send = function sendWatched(this: FastifyReply, payload?: unknown) {
      (reply as WatchedReply)[SEND_CALLED] = true;
      return send.call(this, payload);
    };
  },
  sendJson: (reply, body) => {
    reply.type(RATE_LIMITED_CONTENT_TYPE).send(body);
  },
};

/**
 * Rate limiting for Fastify 5. Same options, headers, 429 body and counters as `expressRateLimit`;
 * a local or global limiter decides synchronously and `done()` runs before the hook returns.
 * Imports only Fastify's types. See docs/middleware.md.
 *
 * @example
 * const limit = fastifyRateLimit({ limiter, policy: { name: 'api', limit: 100, windowSec: 10 } });
 * await app.register(limit);
 * // or per route: app.get('/search', { onRequest: limit.onRequest }, handler);
 */
export function fastifyRateLimit(options: FastifyRateLimitOptions): FastifyRateLimit {
  assertMiddlewareOptionNames(options, 'fastifyRateLimit');
  const core = createRateLimitMiddleware(options, fastifyAdapter);
  const run = core.run;
  const onRequest: FastifyRateLimitHook = function fastifyRateLimitHook(request, reply, done) {
    // A rejection sends the reply and never calls `done`, which is how an onRequest hook answers early.
    run(request, reply, done);
  };
  const plugin = ((instance: FastifyInstance, _options: unknown, done: (error?: Error) => void): void => {
    instance.addHook('onRequest', onRequest);
    done();
  }) as FastifyRateLimit;
  Object.defineProperties(plugin, {
    name: { value: 'fastifyRateLimit' },
    onRequest: { value: onRequest, enumerable: true },
    stats: { value: core.stats, enumerable: true },
    clientAddress: { value: core.clientAddress, enumerable: true },
    // What fastify-plugin sets: no encapsulation (the hook reaches the registering scope) and a name for errors.
    [Symbol.for('skip-override')]: { value: true },
    [Symbol.for('fastify.display-name')]: { value: 'spillway-rate-limit' },
  });
  return plugin;
}
