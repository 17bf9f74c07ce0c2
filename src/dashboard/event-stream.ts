import type { IncomingMessage, ServerResponse } from 'node:http';

export interface EventStreamOptions {
  /** Most concurrent subscribers; one more is refused (the caller answers 503). Default 32. */
  maxClients?: number;
  /** A comment line this often keeps proxies and browsers from closing an idle stream. Default 15 s. */
  heartbeatMs?: number;
  /**
   * A subscriber whose unsent output passes this is cut off: a stalled browser tab must not make
   * the controller buffer events without bound. Default 1 MiB.
   */
  maxBufferedBytes?: number;
}

export interface EventStream {
  /** Takes over the response as a `text/event-stream`; false (response untouched) when full. */
  accept(request: IncomingMessage, response: ServerResponse): boolean;
  /** Sends one event to every subscriber. */
  publish(event: string, data: unknown): void;
  readonly clients: number;
  /** Ends every subscriber's stream. */
  close(): void;
}

/** Server-sent events to a bounded set of subscribers; each event is serialized once for all. */
export function createEventStream(options: EventStreamOptions = {}): EventStream {
  const maxClients = options.maxClients ?? 32;
  const heartbeatMs = options.heartbeatMs ?? 15_000;
  const maxBufferedBytes = options.maxBufferedBytes ?? 1024 * 1024;
  const clients = new Set<ServerResponse>();
  let heartbeat: NodeJS.Timeout | undefined;

  function drop(response: ServerResponse): void {
    clients.delete(response);
    if (clients.size === 0 && heartbeat) {
      clearInterval(heartbeat);
      heartbeat = undefined;
    }
  }

  function send(chunk: string): void {
    for (const response of clients) {
      if (response.writableLength > maxBufferedBytes) {
        drop(response);
        response.destroy();
        continue;
      }
      response.write(chunk);
    }
  }

  return {
    get clients() {
      return clients.size;
    },
    accept(request, response) {
      if (clients.size >= maxClients) return false;
      response.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-store',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      // The browser reconnects after this many ms if the stream breaks.
      response.write('retry: 2000\n\n');
      clients.add(response);
      request.socket.setNoDelay(true);
      const onClose = () => drop(response);
      request.once('close', onClose);
      response.once('close', onClose);
      heartbeat ??= setInterval(() => send(': heartbeat\n\n'), heartbeatMs);
      heartbeat.unref();
      return true;
    },
    publish(event, data) {
      if (clients.size === 0) return;
      send(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    },
    close() {
      for (const response of [...clients]) {
        drop(response);
        response.end();
      }
    },
  };
}
