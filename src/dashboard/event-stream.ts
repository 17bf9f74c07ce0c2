import type { IncomingMessage, ServerResponse } from 'node:http';
import { isIP } from 'node:net';
import { sliceToYield } from '../control/fair-slots.js';

export interface EventStreamOptions {
  /**
   * Most concurrent subscribers. When every slot is taken, a newcomer whose address holds at least
   * two fewer streams than the address holding the most takes that address's oldest stream's
   * slot (`accept`); otherwise it is refused (the caller answers 503). Default 32.
   */
  maxClients?: number;
  /**
   * Most concurrent subscribers from one client address (`streamClientKey`), so one client cannot
   * take every slot; one more is refused (the caller answers 429). Default 4.
   */
  maxClientsPerAddress?: number;
  /** A comment line this often keeps proxies and browsers from closing an idle stream. Default 15 s. */
  heartbeatMs?: number;
  /**
   * A subscriber whose unsent output passes this is cut off: a stalled browser tab must not make
   * the controller buffer events without bound. Default 1 MiB.
   */
  maxBufferedBytes?: number;
}

export interface EventStream {
  /**
   * Takes over the response as a `text/event-stream` (`accepted`); otherwise the response is
   * untouched: `full` when every slot is taken, `address-full` when the client's address has its
   * share already.
   */
  accept(request: IncomingMessage, response: ServerResponse): 'accepted' | 'full' | 'address-full';
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
  const maxClientsPerAddress = options.maxClientsPerAddress ?? 4;
  /** Each subscriber and its `streamClientKey`. */
  const clients = new Map<ServerResponse, string>();
  const perAddress = new Map<string, number>();
  let heartbeat: NodeJS.Timeout | undefined;

  function drop(response: ServerResponse): void {
    const key = clients.get(response);
    // Both the request's and the response's `close` come here: count a subscriber out once.
    if (key === undefined) return;
    clients.delete(response);
    const left = (perAddress.get(key) ?? 1) - 1;
    if (left > 0) perAddress.set(key, left);
    else perAddress.delete(key);
    if (clients.size === 0 && heartbeat) {
      clearInterval(heartbeat);
      heartbeat = undefined;
    }
  }

  function send(chunk: string): void {
    for (const response of clients.keys()) {
      if (response.writableLength > maxBufferedBytes) {
        drop(response);
        response.destroy();
        continue;
      }
      response.write(chunk);
    }
  }

  /**
   * Slots are shared max-min fairly between addresses (`sliceToYield`): a few addresses that took
   * every slot (one client holding several IPv4 addresses or /64s) give their oldest stream's up to
   * a newcomer with fewer, so they cannot keep everyone else from watching.
   */
  function evictForNewcomer(newcomerStreams: number): boolean {
    const busiestKey = sliceToYield(perAddress, newcomerStreams);
    if (busiestKey === undefined) return false;
    for (const [oldest, oldestKey] of clients) {
      if (oldestKey !== busiestKey) continue;
      drop(oldest);
      oldest.end();
      return true;
    }
    return false;
  }

  return {
    get clients() {
      return clients.size;
    },
    accept(request, response) {
      const key = streamClientKey(request.socket.remoteAddress);
      const open = perAddress.get(key) ?? 0;
      if (open >= maxClientsPerAddress) return 'address-full';
      if (clients.size >= maxClients && !evictForNewcomer(open)) return 'full';
      response.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-store',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      // The browser reconnects after this many ms if the stream breaks.
      response.write('retry: 2000\n\n');
      clients.set(response, key);
      perAddress.set(key, open + 1);
      request.socket.setNoDelay(true);
      const onClose = () => drop(response);
      request.once('close', onClose);
      response.once('close', onClose);
      heartbeat ??= setInterval(() => send(': heartbeat\n\n'), heartbeatMs);
      heartbeat.unref();
      return 'accepted';
    },
    publish(event, data) {
      if (clients.size === 0) return;
      send(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    },
    close() {
      for (const response of [...clients.keys()]) {
        drop(response);
        response.end();
      }
    },
  };
}

/**
 * Who counts as one client for `maxClientsPerAddress`: an IPv4 address (an IPv4-mapped IPv6 one
 * as IPv4), or an IPv6 /64, since one machine commonly holds a whole /64 and could rotate through
 * it to take every slot.
 */
export function streamClientKey(remoteAddress: string | undefined): string {
  if (remoteAddress === undefined) return 'unknown';
  const address = remoteAddress.split('%')[0]!.toLowerCase();
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  if (isIP(v4) === 4) return v4;
  if (isIP(address) !== 6) return address;
  const [head = '', tail] = address.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups =
    tail === undefined
      ? left
      : [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right];
  return `${groups
    .slice(0, 4)
    .map((g) => Number.parseInt(g, 16).toString(16))
    .join(':')}::/64`;
}
