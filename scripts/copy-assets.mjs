#!/usr/bin/env node
// tsc copies no non-TypeScript files; the Lua scripts (and later static assets) must sit beside
// the compiled modules that load them by relative path.
import { cpSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

function copy(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) copy(path);
    else if (/\.(lua|html|css|proto)$/.test(name)) cpSync(path, join('dist', path));
  }
}
copy('src');
