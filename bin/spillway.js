#!/usr/bin/env node
// The `spillway` command. The CLI lives in src/cli; this file only loads its compiled form.
import { main } from '../dist/src/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error) => {
    console.error(error?.stack ?? error);
    process.exitCode = 1;
  },
);
