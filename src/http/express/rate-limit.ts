import type { NextFunction, Request, Response } from 'express';
import { assertMiddlewareOptionNames } from '../middleware-options.js';
import {
  createRateLimitMiddleware,
  type FrameworkAdapter,
  type RateLimitMiddlewareOptions,
  type RateLimitStats,
} from '../rate-limit-middleware.js';
import { RATE_LIMITED_CONTENT_TYPE } from '../rate-limited-response.js';

export type ExpressRateLimitOptions = RateLimitMiddlewareOptions<Request, Response>;

/** An Express middleware with its counters and the client address it would key a request by. */
export interface ExpressRateLimit {
  (req: Request, res: Response, next: NextFunction): void;
  readonly stats: RateLimitStats;
  /** The default key of `req`: its client address after trusted-proxy and prefix rules. */
  clientAddress(req: Request): string;
}

/**
 * Only the Node `IncomingMessage`/`ServerResponse` surface Express extends is used, so the
 * middleware needs Express's types at compile time and nothing of Express at run time.
 */
const expressAdapter: FrameworkAdapter<Request, Response> = {
  peerAddress: (req) => req.socket.remoteAddress,
  forwardedFor: (req) => req.headers['x-forwarded-for'],
  getHeader: (res, name) => res.getHeader(name),
  setHeader: (res, name, value) => {
    res.setHeader(name, value);
  },
  setStatus: (res, statusCode) => {
    res.statusCode = statusCode;
  },
  ended: (res) => res.writableEnded || res.destroyed,
  sendJson: (res, body) => {
    res.setHeader('Content-Type', RATE_LIMITED_CONTENT_TYPE);
    res.end(body);
  },
};

/**
 * Rate limiting for Express 5 (`app.use(expressRateLimit({...}))` or per route). A local or global
 * limiter decides synchronously, and `next()` is called before the middleware returns; a Redis
 * limiter's decision is awaited. Rejections get the proxy's 429 (`rateLimitedBody`): `Retry-After`,
 * `RateLimit-Policy`, `RateLimit`, `Cache-Control: no-store` and
 * `{"error":"rate_limited","message":…,"policies":[name],"retryAfterSeconds":n}`. See docs/middleware.md.
 *
 * @example
 * const perClient = createKeyedTokenBucket({ capacity: 100, refillPerSec: 10 });
 * app.use(expressRateLimit({
 *   limiter: perClient,
 *   policy: { name: 'api', limit: 100, windowSec: 10 },
 *   trustedProxies: ['10.0.0.0/8'],
 * }));
 */
export function expressRateLimit(options: ExpressRateLimitOptions): ExpressRateLimit {
  assertMiddlewareOptionNames(options, 'expressRateLimit');
  const core = createRateLimitMiddleware(options, expressAdapter);
  const run = core.run;
  const middleware = ((req: Request, res: Response, next: NextFunction): void => {
    run(req, res, next);
  }) as ExpressRateLimit;
  Object.defineProperties(middleware, {
    name: { value: 'expressRateLimit' },
    stats: { value: core.stats, enumerable: true },
    clientAddress: { value: core.clientAddress, enumerable: true },
  });
  return middleware;
}
