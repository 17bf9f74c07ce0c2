/** One server-sent event as a browser would see it (comments kept apart, for heartbeat checks). */
export interface SseEvent {
  event: string;
  data: string;
}

/**
 * Reads `count` events from an event stream, then closes it. Comment lines (`: heartbeat`) are
 * collected in `comments` when given; `onEvent` sees each event as it arrives. Rejects when the stream fails or `timeoutMs` passes first.
 */
export async function readEvents(
  url: string,
  count: number,
  timeoutMs: number,
  { comments, onEvent }: { comments?: string[]; onEvent?: (event: SseEvent) => void } = {},
): Promise<SseEvent[]> {
  const abort = new AbortController();
  const timer = setTimeout(
    () => abort.abort(new Error(`fewer than ${count} events within ${timeoutMs} ms`)),
    timeoutMs,
  );
  const events: SseEvent[] = [];
  try {
    const response = await fetch(url, { signal: abort.signal, headers: { accept: 'text/event-stream' } });
    if (response.status !== 200) throw new Error(`GET ${url}: ${response.status} ${await response.text()}`);
    if (!response.headers.get('content-type')?.startsWith('text/event-stream')) {
      throw new Error(`GET ${url}: content-type ${response.headers.get('content-type')}`);
    }
    const decoder = new TextDecoder();
    let buffer = '';
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      buffer += decoder.decode(chunk, { stream: true });
      let end = buffer.indexOf('\n\n');
      while (end >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        end = buffer.indexOf('\n\n');
        let event = 'message';
        const data: string[] = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) comments?.push(line);
          else if (line.startsWith('event: ')) event = line.slice(7);
          else if (line.startsWith('data: ')) data.push(line.slice(6));
        }
        if (data.length > 0) {
          events.push({ event, data: data.join('\n') });
          onEvent?.(events.at(-1)!);
        }
        if (events.length >= count) return events;
      }
    }
    throw new Error(`stream ended after ${events.length} events`);
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
}
