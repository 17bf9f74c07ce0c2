// Runs the `spillway` command from source (`node --import tsx src/cli/entry.ts <command> ...`), the
// same as bin/spillway.js does from the build. Tests spawn this so they need no build step.
import { main } from './main.js';

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error instanceof Error ? (error.stack ?? error.message) : error);
    process.exitCode = 1;
  },
);
