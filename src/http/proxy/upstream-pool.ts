import { type Dispatcher, Pool } from 'undici';
import type { UpstreamConfig } from '../rules/proxy-rules.js';
import { UpstreamQueue } from './upstream-queue.js';

/**
 * The upstream as the proxy reaches it: a pool of keep-alive connections (undici `Pool`), the
 * queue for them (`UpstreamQueue`), and the `upstream` settings in force. The pool is built with
 * `url`, `connections` and `connectTimeoutMs`: those stay until a restart (and so do the messages
 * that quote them); the other settings apply to the next request forwarded.
 */
export class UpstreamPool {
  readonly queue: UpstreamQueue;
  #config: UpstreamConfig;
  readonly #pool: Pool;

  constructor(config: UpstreamConfig) {
    this.#config = config;
    this.#pool = new Pool(config.url, {
      connections: config.connections,
      connectTimeout: config.connectTimeoutMs,
      headersTimeout: config.headersTimeoutMs,
      bodyTimeout: config.bodyTimeoutMs,
      keepAliveTimeout: 4_000,
    });
    this.queue = new UpstreamQueue(config.connections);
  }

  get config(): UpstreamConfig {
    return this.#config;
  }

  /** New settings from a reload; false when one that needs a restart changed (it is kept). */
  reconfigure(config: UpstreamConfig): boolean {
    const { url, connections, connectTimeoutMs } = this.#config;
    const applied =
      config.url === url &&
      config.connections === connections &&
      config.connectTimeoutMs === connectTimeoutMs;
    this.#config = { ...config, url, connections, connectTimeoutMs };
    return applied;
  }

  /** Hands a request (or an upgrade) that holds one of the queue's connections to the pool. */
  dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): void {
    this.#pool.dispatch(options, handler);
  }

  queueFullMessage(): string {
    return `all ${this.#config.connections} upstream connections are busy and ${this.#config.maxQueued} requests wait for one`;
  }

  /** Closes idle connections and waits for the requests in flight. */
  close(): Promise<void> {
    return this.#pool.close();
  }

  /** Cuts every connection now. */
  destroy(): Promise<void> {
    return this.#pool.destroy();
  }
}
