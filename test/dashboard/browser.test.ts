import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import type { BucketHistoryColumns } from '../../src/dashboard/bucket-history.js';
import type { DashboardView } from '../../src/dashboard/dashboard-view.js';
import {
  REPO_ROOT,
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from '../integration/spillway-process.js';

// The dashboard in a real headless Chromium against a real cluster (controller, aggregator and
// two hosts as CLI processes): the charts draw the controller's data, and the shadow -> enforce
// button, clicked with the token typed into the page, makes the hosts start dropping.

const CHROMIUM = process.env.SPILLWAY_CHROMIUM ?? '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
const TOKEN = 'browser-test-token-0123456789';
const SHADOW = 'search';
const ORPHAN = 'orphan:acme';
const ENFORCE = 'checkout';
const INTERVAL_MS = 500;
const SCREENSHOT = join(REPO_ROOT, 'test-artifacts', 'dashboard.png');

/**
 * The slice of the page's globals these tests read: the test compiles without the DOM library, and
 * functions passed to `page.evaluate` run in the page, so they name `globalThis` themselves.
 */
interface PageGlobals {
  spillway?: { pointCount(key: string): number; latest(): DashboardView };
  document: {
    querySelector(
      selector: string,
    ): { getAttribute(name: string): string | null; textContent: string | null } | null;
    querySelectorAll(selector: string): Iterable<{
      width: number;
      height: number;
      getContext(kind: '2d'): {
        getImageData(x: number, y: number, w: number, h: number): { data: Uint8ClampedArray };
      };
    }>;
  };
}

const missingBrowser = !existsSync(CHROMIUM);
if (missingBrowser && process.env.CI === 'true') {
  throw new Error(`${CHROMIUM} is missing: CI must install chromium (apt-get install -y chromium)`);
}

describe('dashboard in headless Chromium', {
  timeout: 180_000,
  skip: missingBrowser ? `${CHROMIUM} not installed (apt-get install -y chromium)` : false,
}, () => {
  const started: SpillwayProcess[] = [];
  let dir = '';
  let profileDir = '';
  let base = '';
  let hosts: SpillwayProcess[] = [];
  let context: BrowserContext | undefined;
  let page: Page;
  const pageErrors: string[] = [];

  const track = async (promise: Promise<SpillwayProcess>) => {
    const p = await promise;
    started.push(p);
    return p;
  };
  const hostsDropped = async (bucket: string) => {
    const readings = await Promise.all(hosts.map((h) => scrape(h.ops)));
    return readings.reduce((n, r) => n + (r.get(seriesKey('spillway_dropped_total', { bucket })) ?? 0), 0);
  };

  /** The rule `rule` as the controller's snapshot has it now. */
  const ruleNow = async (rule: string) => {
    const view = (await (await fetch(`${base}api/snapshot`)).json()) as DashboardView;
    return view.rules.find((r) => r.rule === rule)!;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-browser-'));
    profileDir = mkdtempSync(join(tmpdir(), 'spillway-chromium-profile-'));
    const limitsPath = join(dir, 'limits.yaml');
    writeFileSync(
      limitsPath,
      [
        'version: 1',
        `intervalMs: ${INTERVAL_MS}`,
        'buckets:',
        `  - key: ${ENFORCE}`,
        '    limitRps: 100',
        '    mode: enforce',
        `  - key: ${SHADOW}`,
        '    limitRps: 60',
        '    mode: shadow',
        '',
      ].join('\n'),
    );
    const anyPort = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'];
    const controller = await track(
      startSpillway('controller', [
        'controller',
        '--config',
        limitsPath,
        ...anyPort,
        '--dashboard',
        '127.0.0.1:0',
        '--admin-token',
        TOKEN,
        '--id',
        'browser-test-controller',
      ]),
    );
    base = (JSON.parse(controller.output.find((l) => l.includes('"listening"'))!) as { dashboard: string })
      .dashboard;
    const aggregator = await track(
      startSpillway('aggregator', [
        'aggregator',
        '--zone',
        'z1',
        '--parent',
        controller.grpc!,
        ...anyPort,
        '--interval-ms',
        String(INTERVAL_MS),
      ]),
    );
    hosts = await Promise.all(
      [1, 2].map((n) =>
        track(
          startSpillway(`host-${n}`, [
            'host',
            '--aggregator',
            aggregator.grpc!,
            '--zone',
            'z1',
            '--bucket',
            // host-1 also offers a bucket the limits file has no rule for: unlimited, and said so.
            `${ENFORCE}=${n * 60},${SHADOW}=${n * 50}${n === 1 ? `,${ORPHAN}=5` : ''}`,
            '--ops',
            '127.0.0.1:0',
            '--interval-ms',
            String(INTERVAL_MS),
            '--id',
            `browser-host-${n}`,
            '--log-level',
            'warn',
          ]),
        ),
      ),
    );
    context = await chromium.launchPersistentContext(profileDir, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      viewport: { width: 1400, height: 1000 },
    });
    page = context.pages()[0] ?? (await context.newPage());
    page.on('pageerror', (error) => pageErrors.push(`pageerror: ${error.message}`));
    page.on('console', (message) => {
      if (message.type() === 'error') pageErrors.push(`console: ${message.text()}`);
    });
  });

  after(async () => {
    await context?.close();
    await Promise.all(started.map((p) => stopSpillway(p, 3_000)));
    for (const path of [dir, profileDir]) if (path) rmSync(path, { recursive: true, force: true });
  });

  it('draws live charts of the controller data', async () => {
    await page.goto(base);
    await page.waitForFunction(
      ([a, b]) => {
        const s = (globalThis as unknown as PageGlobals).spillway;
        return s !== undefined && s.pointCount(a!) >= 6 && s.pointCount(b!) >= 6;
      },
      [SHADOW, ENFORCE],
      { timeout: 60_000 },
    );
    assert.equal(await page.locator('#connection').textContent(), 'live');
    assert.equal(await page.locator('.chart-card canvas').count(), 2, 'one uPlot canvas per bucket');
    // The canvases are drawn on, not blank.
    const inked = await page.evaluate(() =>
      [...(globalThis as unknown as PageGlobals).document.querySelectorAll('.chart-card canvas')].map(
        (canvas) => {
          const pixels = canvas.getContext('2d')!.getImageData(0, 0, canvas.width, canvas.height).data;
          let painted = 0;
          for (let i = 3; i < pixels.length; i += 4) if (pixels[i]! > 0) painted++;
          return painted;
        },
      ),
    );
    assert.ok(
      inked.every((n) => n > 500),
      `painted pixels per chart: ${inked}`,
    );

    // The offered rate the page shows is the controller's for the same tick, to the digit. The
    // page's latest view can be the `snapshot` event of a (re)connected stream, whose version no
    // tick recorded: read again until it is a tick's, which the next tick makes it.
    const readShown = () =>
      page.evaluate((bucket) => {
        const latest = (globalThis as unknown as PageGlobals).spillway!.latest();
        const cell = (globalThis as unknown as PageGlobals).document.querySelector(
          `tr[data-bucket="${bucket}"] td[data-field="offered"]`,
        )!;
        return {
          version: latest.controller.version,
          value: Number(cell.getAttribute('data-value')),
          text: cell.textContent,
        };
      }, SHADOW);
    let shown = await readShown();
    let history = (await (await fetch(`${base}api/history`)).json()) as BucketHistoryColumns;
    for (
      const deadline = Date.now() + 10_000;
      !history.versions.includes(shown.version) && Date.now() < deadline;
    ) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      shown = await readShown();
      history = (await (await fetch(`${base}api/history`)).json()) as BucketHistoryColumns;
    }
    const at = history.versions.indexOf(shown.version);
    assert.ok(at >= 0, `tick ${shown.version} in the controller's history`);
    const offered = history.buckets[SHADOW]!.offeredRps[at]!;
    assert.equal(shown.value, offered);
    assert.equal(shown.text, offered.toFixed(1));
    // And it is the load the hosts offer (50 + 100 per second), within what a busy box allows.
    assert.ok(Math.abs(offered - 150) < 0.25 * 150, `offered ${offered}`);
    const api = (await (await fetch(`${base}api/snapshot`)).json()) as DashboardView;
    const now = api.buckets.find((b) => b.key === SHADOW)!.offeredRps;
    assert.ok(Math.abs(now - shown.value) < 0.25 * 150, `page ${shown.value}, API now ${now}`);
    assert.equal(
      await page.locator('#tuning-status').textContent(),
      'No suggestions: no tuning engine is connected to this controller, so there is nothing to propose.',
    );
  });

  it('flips the shadow bucket to enforce from the page; the hosts start dropping', async () => {
    const flip = page.locator(`button[data-action="mode"][data-rule="${SHADOW}"]`);
    assert.equal(await flip.isDisabled(), true, 'disabled until a token is entered');
    assert.equal(await hostsDropped(SHADOW), 0, 'shadow drops nothing');

    await page.locator('#token').fill(TOKEN);
    await page.locator('#actor').fill('browser test');
    await page.locator('#token-save').click();
    await page.locator('#token-status', { hasText: 'token accepted' }).waitFor({ timeout: 10_000 });
    await flip.click();
    await page
      .locator('#action-status', { hasText: `${SHADOW}: mode shadow → enforce` })
      .waitFor({ timeout: 10_000 });

    const droppedAtFlip = await hostsDropped(SHADOW);
    await waitFor('the hosts dropping on the flipped bucket', async () =>
      (await hostsDropped(SHADOW)) > droppedAtFlip + 20 ? true : undefined,
    );
    await page.locator(`tr[data-bucket="${SHADOW}"] .mode-enforce`).waitFor({ timeout: 10_000 });
    await page.locator(`tr[data-rule="${SHADOW}"] .override`).waitFor({ timeout: 10_000 });
    // Let a few ticks of dropping show on the chart before the picture.
    await page.waitForTimeout(3 * INTERVAL_MS);
    mkdirSync(join(REPO_ROOT, 'test-artifacts'), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    assert.deepEqual(pageErrors, [], 'no errors in the page');
  });

  it('shows the keys no rule matches, which the host and the controller log (issue #35)', async () => {
    await page.waitForSelector('#unknown-buckets:not([hidden])', { timeout: 15_000 });
    assert.equal(await page.textContent('#unknown-keys'), ORPHAN);
    assert.match((await page.textContent('#unknown-buckets')) ?? '', /Not limited:/);
    await waitFor(
      'the host logs the unknown bucket, once',
      async () =>
        hosts[0]!.output.some((l) => l.includes(`bucket \\"${ORPHAN}\\" got no directive`))
          ? true
          : undefined,
      { timeoutMs: 15_000 },
    );
    const controller = started[0]!;
    assert.ok(
      controller.output.some((l) => l.includes('matches no rule of the limits file') && l.includes(ORPHAN)),
      controller.output.join('\n'),
    );
    const health = (await (await fetch(`http://${hosts[0]!.ops}/healthz`)).json()) as {
      bucketsWithoutRule: number;
    };
    assert.equal(health.bucketsWithoutRule, 1);
  });

  it('"Set limit" with an empty field sends nothing (it once sent 0, which blocks the bucket)', async () => {
    const limitBefore = (await ruleNow(SHADOW)).limitRps;
    const row = page.locator(`tr[data-rule="${SHADOW}"]`);
    await row.locator('input').fill('');
    await row.locator('button[data-action="limit"]').click();
    await page.locator('#action-status', { hasText: 'enter a limit' }).waitFor({ timeout: 10_000 });
    assert.equal((await ruleNow(SHADOW)).limitRps, limitBefore);
  });
});
