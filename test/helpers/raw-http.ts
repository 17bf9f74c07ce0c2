import { connect } from 'node:net';

/** One response as it came on the wire. */
export interface RawAnswer {
  status: number;
  /** Lower-case names; a repeated field keeps its last line. */
  headers: Record<string, string>;
  body: string;
}

export interface RawExchange {
  /** Every response the server sent, in order (framed by `Content-Length`; the last by the close). */
  answers: RawAnswer[];
  /** From the first byte written to the server closing the connection. */
  elapsedMs: number;
}

/**
 * Writes `pieces[0]` as is on a fresh connection to `127.0.0.1:port` (a request a Node client will
 * not send: malformed, pipelined, without Host), and each next piece once as many whole answers as
 * pieces written have come back; resolves once the server closes the connection, or resets it.
 */
export function rawExchange(port: number, ...pieces: string[]): Promise<RawExchange> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let startedMs = 0;
    let written = 0;
    const writeNext = () => {
      while (written < pieces.length && wholeAnswers(Buffer.concat(chunks).toString('latin1')) >= written) {
        socket.write(pieces[written++]!);
      }
    };
    socket.on('connect', () => {
      startedMs = performance.now();
      writeNext();
    });
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      writeNext();
    });
    // A reset (the server destroyed the connection with bytes unread) ends the exchange as a close does.
    socket.on('error', () => {});
    socket.on('close', () =>
      resolve({
        answers: parseAnswers(Buffer.concat(chunks).toString('latin1')).map(({ answer }) => answer),
        elapsedMs: performance.now() - startedMs,
      }),
    );
  });
}

function wholeAnswers(received: string): number {
  return parseAnswers(received).filter(({ whole }) => whole).length;
}

/** `received` as latin1, one character a byte, so `Content-Length` counts characters. */
function parseAnswers(received: string): { answer: RawAnswer; whole: boolean }[] {
  const answers: { answer: RawAnswer; whole: boolean }[] = [];
  let rest = received;
  while (rest.length > 0) {
    const split = rest.indexOf('\r\n\r\n');
    const [statusLine = '', ...lines] = (split < 0 ? rest : rest.slice(0, split)).split('\r\n');
    const headers: Record<string, string> = {};
    for (const line of lines) {
      const colon = line.indexOf(':');
      headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
    }
    const after = split < 0 ? '' : rest.slice(split + 4);
    const declared = headers['content-length'];
    const length = declared === undefined ? after.length : Number(declared);
    answers.push({
      answer: {
        status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1] ?? 0),
        headers,
        body: Buffer.from(after.slice(0, length), 'latin1').toString('utf8'),
      },
      whole: split >= 0 && declared !== undefined && after.length >= length,
    });
    rest = after.slice(length);
  }
  return answers;
}
