import type { IncomingMessage } from 'node:http';
import type { ActiveRules } from './active-rules.js';
import { hasBody } from './proxy-responses.js';

/** What `claim` returns for a request that takes no slot. */
const NO_SLOT = (): void => {};

/**
 * Request bodies in progress per client, at most `server.maxUploadsPerClient` each: a slow upload
 * that streams holds a pooled upstream connection (and one being read ahead, a buffer) for as long
 * as its client takes, so without a bound one client trickling many uploads holds the whole pool
 * and every other client waits for a connection. A client is the address key the buckets'
 * `{client}` renders (an IPv6 /64, the address `X-Forwarded-For` names behind trusted proxies).
 * Only clients with a body in progress have an entry.
 */
export class ClientUploads {
  readonly #inProgress = new Map<string, number>();

  /** Clients with a body in progress. */
  get clients(): number {
    return this.#inProgress.size;
  }

  /**
   * A slot for `req`'s body, given back by the function returned (once, however often it is
   * called) or when the body has been read; a no-op for a request without a body still to come
   * or with no bound. Undefined when the client already has its bound in progress: refuse it.
   */
  claim(req: IncomingMessage, rules: ActiveRules): (() => void) | undefined {
    const max = rules.rules.server.maxUploadsPerClient;
    if (max === 0 || req.complete || !hasBody(req)) return NO_SLOT;
    const client = rules.resolveClient(req.socket.remoteAddress ?? '', req.headers['x-forwarded-for']);
    const inProgress = this.#inProgress.get(client) ?? 0;
    if (inProgress >= max) return undefined;
    this.#inProgress.set(client, inProgress + 1);
    let held = true;
    const release = (): void => {
      if (!held) return;
      held = false;
      req.off('end', release);
      const left = (this.#inProgress.get(client) ?? 1) - 1;
      if (left === 0) this.#inProgress.delete(client);
      else this.#inProgress.set(client, left);
    };
    req.once('end', release);
    return release;
  }
}
