/**
 * A one-shot command whose output is piped into a reader that stops early (`spillway tune | head -3`)
 * gets EPIPE on its next write: the reader chose to stop, nothing failed. Exit then, quietly, with
 * the exit code the command has set so far (0), rather than die of an unhandled 'error' event with
 * a stack trace. Any other error on stdout is thrown as before.
 */
export function exitQuietlyWhenStdoutCloses(): void {
  process.stdout.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code !== 'EPIPE') throw error;
    process.exit(typeof process.exitCode === 'number' ? process.exitCode : 0);
  });
}
