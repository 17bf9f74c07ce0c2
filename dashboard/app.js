// The Spillway controller's dashboard: one page, no build step. Data comes from the controller's
// JSON API (docs/dashboard.md): /api/history once, then one /api/stream event per controller tick.
// Every string from the controller (bucket keys come from reports, i.e. from the network) is put
// in the page with textContent, never parsed as HTML.

/** Points kept per bucket in the browser: ten minutes at the default one-second interval. */
const MAX_POINTS = 600;
const TOKEN_KEY = 'spillway-admin-token';
const ACTOR_KEY = 'spillway-admin-actor';

const state = {
  /** The latest view from the controller (what /api/snapshot answers). */
  view: undefined,
  /** Controller version of the newest point held; older or equal events are not appended twice. */
  lastVersion: -1,
  /** Epoch of the controller the points came from: a restarted controller counts versions anew. */
  epoch: undefined,
  events: 0,
  /** Bucket key -> { t, offered, admitted, limit, dropRatio, wouldDrop } (aligned arrays). */
  series: new Map(),
  /** Bucket key -> { card, plot } */
  charts: new Map(),
  rulesSignature: '',
  adminEnabled: undefined,
  token: sessionStorage.getItem(TOKEN_KEY) ?? '',
  actor: localStorage.getItem(ACTOR_KEY) ?? '',
  tuning: { engine: null, suggestions: [] },
};

// Read by tests and handy from the console.
window.spillway = {
  state,
  pointCount: (key) => state.series.get(key)?.t.length ?? 0,
  latest: () => state.view,
};

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name === 'text') node.textContent = value;
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== 'string') node[name] = value;
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children) if (child !== undefined && child !== null) node.append(child);
  return node;
}

const formatRate = (value) =>
  value === null || value === undefined ? '–' : value >= 1000 ? value.toFixed(0) : value.toFixed(1);
const formatRatio = (value) => (value === null || value === undefined ? '–' : value.toFixed(2));
const modeBadge = (mode) => el('span', { class: `badge mode-${mode}`, text: mode });

function setConnection(kind, text) {
  const node = $('connection');
  node.className = `status status-${kind}`;
  node.textContent = text;
}

// ---- data ----

function seriesFor(key) {
  let s = state.series.get(key);
  if (!s) {
    s = { t: [], offered: [], admitted: [], limit: [], dropRatio: [], wouldDrop: [] };
    state.series.set(key, s);
  }
  return s;
}

function trim(s) {
  const extra = s.t.length - MAX_POINTS;
  if (extra > 0) for (const column of Object.values(s)) column.splice(0, extra);
}

function seedHistory(history) {
  history.atMs.forEach((atMs, i) => {
    for (const [key, b] of Object.entries(history.buckets)) {
      if (b.offeredRps[i] === null) continue;
      const s = seriesFor(key);
      s.t.push(atMs / 1000);
      s.offered.push(b.offeredRps[i]);
      s.admitted.push(b.admittedRps[i]);
      s.limit.push(b.limitRps[i]);
      s.dropRatio.push(b.dropRatio[i]);
      s.wouldDrop.push(b.wouldDropRps[i]);
    }
  });
  for (const s of state.series.values()) trim(s);
  if (history.versions.length > 0) state.lastVersion = history.versions[history.versions.length - 1];
}

/**
 * Shows a view; `record` (tick events only) also appends it to the charts. A view fetched between
 * ticks carries the fetch time, not the tick's, so it is shown but never plotted.
 */
function applyView(view, { record }) {
  state.view = view;
  state.events++;
  if (state.epoch !== undefined && view.controller.epoch !== state.epoch) {
    // A new controller (restart, failover): its versions start again from 0, so the old points
    // would hide every new one behind `lastVersion`; they belong to a history that ended.
    state.series.clear();
    state.lastVersion = -1;
  }
  state.epoch = view.controller.epoch;
  if (record && view.controller.version > state.lastVersion) {
    state.lastVersion = view.controller.version;
    const t = view.controller.nowMs / 1000;
    for (const b of view.buckets) {
      const s = seriesFor(b.key);
      s.t.push(t);
      s.offered.push(b.offeredRps);
      s.admitted.push(b.admittedRps);
      s.limit.push(b.limitRps);
      s.dropRatio.push(b.dropRatio);
      s.wouldDrop.push(b.wouldDropRps);
      trim(s);
    }
    // Keys churn (a template keyed by a client value): keep the series of the buckets shown, and
    // of no more than as many others, so the page's memory stays bounded over hours.
    if (state.series.size > 2 * Math.max(view.buckets.length, 50)) {
      const shown = new Set(view.buckets.map((b) => b.key));
      for (const key of state.series.keys()) if (!shown.has(key)) state.series.delete(key);
    }
  }
  render(view);
}

// ---- rendering ----

function render(view) {
  const c = view.controller;
  $('controller-id').textContent = c.id;
  // A number, not a date: the default epoch is the start time in ms × 1,024 plus random bits
  // (unique per replica), and an epoch given by configuration need not be a time at all.
  $('epoch').textContent = String(c.epoch);
  $('version').textContent = String(c.ticks);
  $('interval').textContent = `${c.intervalMs} ms`;
  $('policy').textContent = Object.entries(c.ratioPolicy)
    .map(([k, v]) => (k === 'kind' ? v : `${k}=${v}`))
    .join(' ');
  $('hosts').textContent = String(view.hostsTotal);
  renderBuckets(view);
  renderUnknownBuckets(view);
  renderCharts(view);
  renderRules(view);
  renderChildren(view);
  renderAdmin(view);
}

function renderBuckets(view) {
  const body = $('buckets').tBodies[0];
  body.replaceChildren(
    ...view.buckets.map((b) =>
      el(
        'tr',
        { 'data-bucket': b.key },
        el('td', {}, el('code', { text: b.key })),
        el(
          'td',
          {},
          modeBadge(b.mode),
          b.overridden ? el('span', { class: 'override', text: ' override' }) : null,
        ),
        numberCell('offered', b.offeredRps, formatRate),
        numberCell('admitted', b.admittedRps, formatRate),
        numberCell('limit', b.limitRps, formatRate),
        numberCell('dropRatio', b.dropRatio, formatRatio),
        numberCell('wouldDrop', b.wouldDropRps, formatRate),
        numberCell('children', b.children, String),
      ),
    ),
  );
  $('buckets-empty').hidden = view.buckets.length > 0;
  $('buckets-note').textContent =
    view.bucketsTotal > view.buckets.length
      ? `(the ${view.buckets.length} busiest of ${view.bucketsTotal})`
      : `(${view.bucketsTotal})`;
}

function numberCell(field, value, format) {
  return el('td', { class: 'num', 'data-field': field, 'data-value': String(value), text: format(value) });
}

function chartSize(card) {
  return { width: Math.max(240, card.clientWidth - 22), height: 190 };
}

function createChart(key) {
  const plotHolder = el('div', { class: 'chart' });
  const card = el(
    'article',
    { class: 'chart-card', 'data-bucket': key },
    el('h3', {}, el('code', { text: key }), el('span', { class: 'chart-mode' })),
    plotHolder,
  );
  const container = $('charts');
  const after = [...container.children].find((node) => node.dataset.bucket > key);
  container.insertBefore(card, after ?? null);
  const rate = (_u, v) => formatRate(v);
  const plot = new window.uPlot(
    {
      ...chartSize(card),
      scales: {
        x: { time: true },
        rps: { range: (_u, _min, max) => [0, Math.max(1, (max ?? 1) * 1.1)] },
        ratio: { range: [0, 1] },
      },
      series: [
        {},
        { label: 'offered/s', scale: 'rps', stroke: '#2e90fa', width: 2, value: rate },
        { label: 'admitted/s', scale: 'rps', stroke: '#12b76a', width: 2, value: rate },
        { label: 'limit/s', scale: 'rps', stroke: '#d92d20', width: 1.5, dash: [6, 4], value: rate },
        { label: 'would-drop/s', scale: 'rps', stroke: '#f79009', width: 1.5, value: rate },
        {
          label: 'drop ratio',
          scale: 'ratio',
          stroke: '#7a5af8',
          width: 1.5,
          value: (_u, v) => formatRatio(v),
        },
      ],
      axes: [
        {},
        { scale: 'rps', size: 55 },
        {
          scale: 'ratio',
          side: 1,
          size: 40,
          grid: { show: false },
          values: (_u, ticks) => ticks.map((v) => v.toFixed(1)),
        },
      ],
    },
    [[], [], [], [], [], []],
    plotHolder,
  );
  const chart = { card, plot, hovered: false };
  // The legend shows the point under the cursor, and the latest values otherwise.
  plot.over.addEventListener('mouseenter', () => {
    chart.hovered = true;
  });
  plot.over.addEventListener('mouseleave', () => {
    chart.hovered = false;
    showLatest(chart);
  });
  state.charts.set(key, chart);
  return chart;
}

function renderCharts(view) {
  if (!window.uPlot) return;
  const shown = new Set(view.buckets.map((b) => b.key));
  for (const [key, chart] of state.charts) {
    if (!shown.has(key)) {
      chart.plot.destroy();
      chart.card.remove();
      state.charts.delete(key);
    }
  }
  for (const b of view.buckets) {
    const chart = state.charts.get(b.key) ?? createChart(b.key);
    chart.card.querySelector('.chart-mode').replaceChildren(modeBadge(b.mode));
    const s = seriesFor(b.key);
    chart.plot.setData([s.t, s.offered, s.admitted, s.limit, s.wouldDrop, s.dropRatio]);
    if (!chart.hovered) showLatest(chart);
  }
}

function showLatest(chart) {
  const points = chart.plot.data[0].length;
  if (points > 0) chart.plot.setLegend({ idx: points - 1 });
}

window.addEventListener('resize', () => {
  for (const { card, plot } of state.charts.values()) plot.setSize(chartSize(card));
});

function renderRules(view) {
  const signature = JSON.stringify([view.rules, view.admin, state.token !== '']);
  if (signature === state.rulesSignature) return;
  state.rulesSignature = signature;
  const canAct = view.admin.enabled && state.token !== '';
  const why = view.admin.enabled ? 'enter the admin token first' : 'admin actions are off on this controller';
  $('rules').tBodies[0].replaceChildren(
    ...view.rules.map((r) => {
      const other = r.mode === 'shadow' ? 'enforce' : 'shadow';
      const limitInput = el('input', {
        type: 'number',
        min: '0',
        step: 'any',
        value: String(r.limitRps),
        'aria-label': `new limit for ${r.rule}`,
        'data-rule': r.rule,
        disabled: !canAct,
      });
      const actions = view.admin.enabled
        ? el(
            'div',
            { class: 'actions' },
            el('button', {
              type: 'button',
              text: `Switch to ${other}`,
              'data-action': 'mode',
              'data-rule': r.rule,
              'data-mode': other,
              disabled: !canAct,
              title: canAct ? `${r.rule}: ${r.mode} -> ${other}` : why,
              onclick: () => act('/api/admin/mode', { rule: r.rule, mode: other }),
            }),
            limitInput,
            el('button', {
              type: 'button',
              text: 'Set limit',
              'data-action': 'limit',
              'data-rule': r.rule,
              disabled: !canAct,
              title: canAct ? '' : why,
              onclick: () => {
                // An empty field is not 0: Number('') is, and 0 blocks the bucket.
                const text = limitInput.value.trim();
                const limitRps = Number(text);
                if (text === '' || !Number.isFinite(limitRps) || limitRps < 0) {
                  showAction('error', `${r.rule}: enter a limit (a number, 0 or more) first`);
                  return;
                }
                if (limitRps === 0 && !confirm(`A limit of 0 drops every request of ${r.rule}. Set it?`))
                  return;
                act('/api/admin/limit', { rule: r.rule, limitRps });
              },
            }),
            r.override
              ? el('button', {
                  type: 'button',
                  text: 'Clear override',
                  'data-action': 'clear',
                  'data-rule': r.rule,
                  disabled: !canAct,
                  onclick: () => act('/api/admin/clear-override', { rule: r.rule }),
                })
              : null,
          )
        : el('span', { class: 'muted', text: 'read-only' });
      const overridden = r.override !== undefined;
      return el(
        'tr',
        { 'data-rule': r.rule },
        el(
          'td',
          {},
          el('code', { text: r.rule }),
          r.kind === 'template' ? el('span', { class: 'muted', text: ' template' }) : null,
        ),
        el('td', { text: r.scope }),
        el(
          'td',
          {},
          modeBadge(r.mode),
          r.override?.mode ? el('span', { class: 'muted', text: ` (file: ${r.file.mode})` }) : null,
        ),
        el(
          'td',
          { class: 'num' },
          formatRate(r.limitRps),
          r.override?.limitRps !== undefined
            ? el('span', { class: 'muted', text: ` (file: ${formatRate(r.file.limitRps)})` })
            : null,
        ),
        el('td', {
          class: overridden ? 'override' : '',
          text: overridden
            ? `override since ${new Date(r.overriddenAtMs).toLocaleTimeString()}`
            : 'limits file',
        }),
        el('td', {}, actions),
      );
    }),
  );
}

/** Keys hosts report that match no rule: unlimited, and said so where the operator looks. */
function renderUnknownBuckets(view) {
  const keys = view.unknownBucketKeys ?? [];
  $('unknown-buckets').hidden = keys.length === 0;
  if (keys.length === 0) return;
  const entries = view.counters?.unknownBuckets ?? keys.length;
  $('unknown-summary').textContent =
    `${keys.length === 1 ? '1 bucket key' : `${keys.length} bucket keys`} listed (${entries} report entries named such keys since the controller started; the list restarts when the limits file is reloaded).`;
  $('unknown-keys').replaceChildren(...keys.map((key) => el('li', {}, el('code', { text: key }))));
}

function renderChildren(view) {
  $('children').tBodies[0].replaceChildren(
    ...view.children.map((c) =>
      el(
        'tr',
        { 'data-child': c.id },
        el('td', {}, el('code', { text: c.id })),
        el('td', { text: c.tier }),
        el('td', { text: c.zone || '–' }),
        el('td', { class: 'num', text: String(c.hostCount) }),
        el('td', { class: 'num', text: String(c.buckets) }),
        el('td', { class: 'num', text: `${(c.ageMs / 1000).toFixed(1)} s ago` }),
        el('td', { class: c.freshness, text: c.freshness === 'late' ? 'late (no recent report)' : 'fresh' }),
      ),
    ),
  );
  $('children-empty').hidden = view.children.length > 0;
  if (view.childrenTotal > view.children.length) {
    $('children-empty').hidden = false;
    $('children-empty').textContent = `Showing ${view.children.length} of ${view.childrenTotal}.`;
  }
}

function renderAdmin(view) {
  if (state.adminEnabled === view.admin.enabled) return;
  state.adminEnabled = view.admin.enabled;
  $('admin-disabled').hidden = view.admin.enabled;
  $('token-form').hidden = !view.admin.enabled;
  renderTuning();
}

// ---- admin actions ----

function showAction(kind, text) {
  const node = $('action-status');
  node.className = `action-status ${kind}`;
  node.textContent = text;
}

async function adminRequest(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: {
      authorization: `Bearer ${state.token}`,
      'x-spillway-actor': state.actor || 'dashboard',
      ...(body ? { 'content-type': 'application/json' } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(
      `${json?.error?.code ?? response.status}: ${json?.error?.message ?? response.statusText}`,
    );
  }
  return json;
}

async function act(path, body) {
  showAction('', 'sending…');
  try {
    const result = await adminRequest('POST', path, body);
    const change = (name) =>
      result.before[name] === result.after[name]
        ? ''
        : `${name} ${result.before[name]} → ${result.after[name]}`;
    const what = [change('mode'), change('limitRps')].filter(Boolean).join(', ') || 'no change';
    showAction('done', `${result.rule}: ${what} (in force from version ${result.appliesFromVersion})`);
    applyView(await (await fetch('/api/snapshot')).json(), { record: false });
    if (path.includes('tuning')) await refreshTuning();
  } catch (error) {
    showAction('error', String(error.message ?? error));
  }
}

$('token-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  state.token = $('token').value.trim();
  state.actor = $('actor').value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  localStorage.setItem(ACTOR_KEY, state.actor);
  state.rulesSignature = '';
  if (state.view) renderRules(state.view);
  renderTuning();
  $('token-status').textContent = 'checking…';
  try {
    await adminRequest('GET', '/api/admin/check');
    $('token-status').textContent = 'token accepted';
  } catch (error) {
    $('token-status').textContent = String(error.message ?? error);
  }
});

// ---- tuning ----

async function refreshTuning() {
  try {
    state.tuning = await (await fetch('/api/tuning')).json();
  } catch {
    state.tuning = { engine: null, suggestions: [], failed: true };
  }
  renderTuning();
}

function renderTuning() {
  const { engine, suggestions, failed } = state.tuning;
  const status = $('tuning-status');
  const table = $('tuning');
  if (failed) status.textContent = 'Could not load suggestions from the controller.';
  else if (!engine)
    status.textContent =
      'No suggestions: no tuning engine is connected to this controller, so there is nothing to propose.';
  else if (suggestions.length === 0) status.textContent = `No suggestions right now (engine: ${engine}).`;
  else status.textContent = `${suggestions.length} suggestion(s) from ${engine}.`;
  table.hidden = suggestions.length === 0;
  const canAct = state.adminEnabled && state.token !== '';
  table.tBodies[0].replaceChildren(
    ...suggestions.map((s) =>
      el(
        'tr',
        { 'data-suggestion': s.id },
        el('td', {}, el('code', { text: s.rule })),
        el('td', { class: 'num', text: formatRate(s.currentLimitRps) }),
        el('td', { class: 'num', text: formatRate(s.suggestedLimitRps) }),
        el('td', { text: s.reason }),
        el(
          'td',
          {},
          state.adminEnabled
            ? el('button', {
                type: 'button',
                text: 'Accept',
                'data-action': 'accept',
                disabled: !canAct,
                onclick: () => act('/api/admin/tuning/accept', { id: s.id }),
              })
            : null,
        ),
      ),
    ),
  );
}

async function reseedHistory() {
  try {
    const history = await (await fetch('/api/history')).json();
    state.series.clear();
    state.lastVersion = -1;
    seedHistory(history);
  } catch {
    // The next tick appends as usual; the gap stays.
  }
}

// ---- start ----

function takeTokenFromFragment() {
  // `spillway demo` prints the URL with #token=...: a fragment never reaches the server or its logs.
  const match = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (!match) return;
  state.token = decodeURIComponent(match[1]);
  sessionStorage.setItem(TOKEN_KEY, state.token);
  history.replaceState(null, '', location.pathname + location.search);
}

function connect() {
  const source = new EventSource('/api/stream');
  let opened = false;
  source.addEventListener('open', () => {
    setConnection('ok', 'live');
    // After a reconnect, ticks sent while the stream was down are in the history: read it again.
    if (opened) void reseedHistory();
    opened = true;
  });
  // `snapshot` once on connect (the view now), then `tick` after every controller tick.
  source.addEventListener('snapshot', (event) => {
    setConnection('ok', 'live');
    applyView(JSON.parse(event.data), { record: false });
  });
  source.addEventListener('tick', (event) => {
    setConnection('ok', 'live');
    applyView(JSON.parse(event.data), { record: true });
  });
  source.addEventListener('error', () => {
    // EventSource reconnects on its own (after the server's `retry`); a 503 (too many viewers) closes it.
    if (source.readyState === EventSource.CLOSED) {
      setConnection('bad', 'disconnected: reload to retry');
    } else setConnection('wait', 'reconnecting…');
  });
}

async function start() {
  takeTokenFromFragment();
  $('token').value = state.token;
  $('actor').value = state.actor;
  if (state.token) $('token-status').textContent = 'token set';
  try {
    seedHistory(await (await fetch('/api/history')).json());
  } catch {
    // The stream fills the charts anyway.
  }
  connect();
  await refreshTuning();
  setInterval(refreshTuning, 10_000);
}

start();
