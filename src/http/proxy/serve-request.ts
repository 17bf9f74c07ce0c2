import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { requestHeadFault } from '../../server/http-client-error.js';
import { Exchange } from './exchange.js';
import type { ProxyContext } from './proxy-context.js';
import type { ProxyMetrics } from './proxy-metrics.js';
import {
  FORWARDED_METHODS,
  hasBody,
  requestTarget,
  sendJson,
  sendRawJson,
  tooManyUploadsBody,
} from './proxy-responses.js';

/**
 * A request the server hands over (`expectContinue`: one that waits for `100 Continue`): refused
 * when its head is unsound or its client has `server.maxUploadsPerClient` bodies in progress,
 * `OPTIONS *` answered here, anything else decided and then answered 429 or forwarded by its
 * `Exchange`.
 */
export function serveRequest(
  context: ProxyContext,
  req: IncomingMessage,
  res: ServerResponse,
  expectContinue: boolean,
): void {
  // Pipelined behind a connection's last response, read while its body is dropped
  // (`lingeringClose`): never answered, the connection closes.
  if (req.socket.writableEnded) return;
  const { metrics, connections } = context;
  connections.countInFlight(1);
  const exchange = new Exchange(context, req, res, expectContinue);
  // The one `close` listener of a request: in-flight count, and a client leaving mid-forward.
  res.on('close', () => exchange.closed());
  connections.opened(exchange);
  try {
    if (context.lifecycle.draining) res.setHeader('connection', 'close');
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
      answerServerOptions(metrics, req, res);
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
    // Before the decision: a refused upload spends nothing.
    if (!exchange.claimUpload()) {
      metrics.request('too_many_uploads');
      refuseBody();
      const max = exchange.rules.rules.server.maxUploadsPerClient;
      sendJson(res, 429, tooManyUploadsBody(max), { 'retry-after': '1' });
      return;
    }
    const verdict = context.decider.decide(exchange.rules, req);
    if (verdict instanceof Promise) {
      verdict.then((decided) => exchange.followVerdict(decided)).catch((error) => exchange.failed(error));
      return;
    }
    exchange.followVerdict(verdict);
  } catch (error) {
    exchange.failed(error);
  }
}

/**
 * `OPTIONS *` (asterisk form, RFC 9112 §3.2.4) asks about the server as a whole, not a resource
 * (RFC 9110 §9.3.7: a ping, or a test of a server's capabilities). The proxy is the server its
 * clients talk to, so it answers itself: 200, and in `Allow` the methods it takes and forwards.
 * It cannot forward the question: undici sends only origin-form and absolute-form targets, and a
 * side channel around the pool would escape `upstream.connections` and the queue. No bucket is
 * decided: nothing reaches the upstream.
 */
function answerServerOptions(metrics: ProxyMetrics, req: IncomingMessage, res: ServerResponse): void {
  metrics.request('answered_locally');
  // A body (none is defined for it) is not read: the connection closes instead.
  if (hasBody(req)) res.setHeader('connection', 'close');
  res.writeHead(200, { allow: FORWARDED_METHODS, 'content-length': 0 });
  res.end();
}

/**
 * CONNECT: Node hands it to 'connect', never to 'request' (with no listener it just drops the
 * connection). A reverse proxy opens no tunnels to arbitrary hosts: 405, which must list what is
 * allowed (RFC 9110 §15.5.6).
 */
export function refuseConnect(metrics: ProxyMetrics, socket: Duplex): void {
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
}
