import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface StaticAsset {
  contentType: string;
  body: Buffer;
}

/**
 * The page's files by URL path. A fixed list read once at start: no path from a request ever
 * reaches the file system, and a missing file fails the start instead of a page load.
 */
export function loadStaticAssets(dashboardDir = findDashboardDir()): Map<string, StaticAsset> {
  const require = createRequire(import.meta.url);
  const uplotDir = dirname(require.resolve('uplot/dist/uPlot.iife.min.js'));
  const files: [urlPath: string, file: string, contentType: string][] = [
    ['/', join(dashboardDir, 'index.html'), 'text/html; charset=utf-8'],
    ['/app.js', join(dashboardDir, 'app.js'), 'text/javascript; charset=utf-8'],
    ['/style.css', join(dashboardDir, 'style.css'), 'text/css; charset=utf-8'],
    ['/vendor/uPlot.iife.min.js', join(uplotDir, 'uPlot.iife.min.js'), 'text/javascript; charset=utf-8'],
    ['/vendor/uPlot.min.css', join(uplotDir, 'uPlot.min.css'), 'text/css; charset=utf-8'],
  ];
  return new Map(
    files.map(([urlPath, file, contentType]) => [urlPath, { contentType, body: readFileSync(file) }]),
  );
}

/** `dashboard/` at the package root, found by walking up from this module (src/ under tsx, dist/src/ built). */
export function findDashboardDir(): string {
  let dir = new URL('.', import.meta.url);
  for (let i = 0; i < 5; i++) {
    const candidate = new URL('dashboard/index.html', dir);
    if (existsSync(candidate)) return fileURLToPath(new URL('dashboard', dir));
    dir = new URL('..', dir);
  }
  throw new Error(`cannot find the dashboard's static files (dashboard/index.html) above ${import.meta.url}`);
}
