// The multicdn dashboard: reads the service's JSON API (/api/v1/...) and renders it.
// No framework, no build step. Every piece of data reaches the page through textContent or
// setAttribute (never innerHTML), so a hostile network name or note cannot become markup.
// Refreshes every 10 s; the journal is searched on demand.
'use strict';

const API = new URL('../api/v1/', location.href);
const REFRESH_MS = 10000;
const COLOURS = ['#d9480f', '#1c7ed6', '#2b8a3e', '#862e9c', '#e67700', '#0b7285'];
const SVG = 'http://www.w3.org/2000/svg';

// --- small helpers -------------------------------------------------------------------------------

function $(sel) { return document.querySelector(sel); }

// el('td', {class: 'x', 'data-p75': 1}, 'text', childNode, ...): attributes set with
// setAttribute, strings added as text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

async function getJson(path, params) {
  const url = new URL(path, API);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== '' && v !== null && v !== undefined) url.searchParams.set(k, v);
  }
  const res = await fetch(url, { headers: { accept: 'application/json' } });
  if (!res.ok) {
    const text = (await res.text()).slice(0, 200);
    throw new Error(`${url.pathname}: HTTP ${res.status}${text ? ': ' + text : ''}`);
  }
  return res.json();
}

const ms = (v) => (v === null || v === undefined ? '—' : `${Math.round(v)} ms`);
const pct = (v) => (v === null || v === undefined ? '—' : `${Math.round(v * 100)}%`);
const when = (t) => (t ? new Date(t).toLocaleString() : '—');
const colour = (providers, p) => COLOURS[Math.max(0, providers.indexOf(p)) % COLOURS.length];

function showError(target, err) {
  target.replaceChildren(el('p', { class: 'error' }, String(err.message || err)));
}

// Replaces target's content with what build() resolves to (a list of nodes), or with the error.
async function fill(target, build) {
  try {
    target.replaceChildren(...(await build()));
  } catch (e) {
    showError(target, e);
    throw e;
  }
}

function weightsText(w) {
  return Object.entries(w || {}).map(([p, v]) => `${p} ${pct(v)}`).join(', ') || '—';
}

// --- 1 and 2: the board and the networks --------------------------------------------------------

function boardCell(c) {
  const td = el('td', {
    'data-provider': c.provider,
    'data-p75': c.p75 === null ? '' : c.p75,
    'data-share': c.share,
    'data-samples': c.samples,
    class: c.steerable ? null : 'thin',
    title: `${c.samples} samples: ${c.status}`,
  }, el('span', { class: 'p75' }, ms(c.p75)), ' ', el('span', { class: 'share' }, pct(c.share)));
  if (!c.steerable) td.append(el('span', { class: 'thin-marker', 'aria-label': c.status }, '*'));
  return td;
}

function boardTable(table, rows, board, withCountry) {
  const head = el('tr', {}, el('th', {}, withCountry ? 'Network' : 'Country'));
  if (withCountry) head.append(el('th', {}, 'Country'));
  head.append(el('th', { class: 'num' }, 'Samples'));
  for (const p of board.providers) head.append(el('th', { 'data-provider': p }, p));
  const body = el('tbody');
  for (const row of rows) {
    const tr = el('tr', { 'data-key': row.key }, el('th', { scope: 'row' }, row.key));
    if (withCountry) tr.append(el('td', {}, row.country || '—'));
    tr.append(el('td', { class: 'num' }, row.total));
    const byProvider = new Map(row.cells.map((c) => [c.provider, c]));
    for (const p of board.providers) {
      const c = byProvider.get(p);
      tr.append(c ? boardCell(c) : el('td', { 'data-provider': p, class: 'thin' }, '—'));
    }
    body.append(tr);
  }
  if (rows.length === 0) {
    body.append(el('tr', {}, el('td', { colspan: board.providers.length + 3, class: 'muted' }, 'no samples in the window')));
  }
  table.replaceChildren(el('thead', {}, head), body);
}

async function renderBoard() {
  const metric = $('#metric').value;
  try {
    const board = await getJson('board', { metric, networks: 20 });
    const rows = board.all ? [...board.countries, board.all] : board.countries;
    boardTable($('#board'), rows, board, false);
    boardTable($('#networks'), board.networks, board, true);
    $('#board-caption').firstChild.textContent =
      `${metric === 'probe' ? 'Probe time' : 'Page TTFB'}, last ${Math.round(board.window_s / 60)} min; ` +
      `each cell: p75 and the provider's share. A cell steers from ${board.min_samples} samples. `;
    return board;
  } catch (e) {
    showError($('#board'), e);
    showError($('#networks'), e);
    throw e;
  }
}

// --- 3: weights in force ------------------------------------------------------------------------

function renderWeights() {
  return fill($('#weights'), async () => {
    const w = await getJson('weights');
    const flags = [`round ${w.round}`, `mode ${w.mode}`];
    if (w.dry_run) flags.push('dry run: nothing is applied');
    if (w.static) flags.push('static: the loop does not move weights');
    const providers = [...new Set(w.cohorts.flatMap((c) => Object.keys(c.weights)))].sort();
    const list = el('ul', { class: 'cohorts' });
    for (const c of w.cohorts) {
      const bar = el('div', { class: 'bar', role: 'img', 'aria-label': weightsText(c.weights) });
      for (const p of providers) {
        const v = c.weights[p] || 0;
        if (v > 0) {
          bar.append(el('span', { style: `width:${(v * 100).toFixed(2)}%;background:${colour(providers, p)}`, title: `${p} ${pct(v)}` }));
        }
      }
      list.append(el('li', { 'data-cohort': c.cohort },
        el('strong', {}, c.cohort), ' ', el('span', { class: 'muted' }, c.networks.join(', ')),
        bar, el('span', { class: 'weights-text' }, weightsText(c.weights))));
    }
    fillCohorts(w.cohorts);
    return [el('p', { class: w.mode === 'normal' ? 'muted' : 'warn' }, flags.join(' · ')), list];
  });
}

// --- 4: loop health -----------------------------------------------------------------------------

function renderLoop() {
  return fill($('#loop'), async () => {
    const l = await getJson('loop', { hours: 24 });
    const rules = Object.entries(l.by_rule || {}).map(([r, n]) => `${r} ${n}`).join(', ') || 'none';
    const dl = el('dl', {},
      el('dt', {}, 'Moves'), el('dd', { 'data-moves': l.moves }, `${l.moves} (${Number(l.moves_per_day).toFixed(1)} a day)`),
      el('dt', {}, 'By rule'), el('dd', {}, rules),
      el('dt', {}, 'Mean realized gain'), el('dd', {}, l.mean_gain_ms === null ? '— (no settled move yet)' : ms(l.mean_gain_ms)));
    const osc = el('ul', { class: 'oscillating' });
    for (const o of l.oscillating) {
      osc.append(el('li', { 'data-cohort': o.cohort, class: 'warn' },
        `${o.cohort}: ${o.reversals} reversals, ${when(o.from)} – ${when(o.to)}`));
    }
    if (l.oscillating.length === 0) osc.append(el('li', { class: 'muted' }, 'no cohort oscillates'));
    return [dl, el('h3', {}, 'Oscillating cohorts'), osc];
  });
}

// --- 5: provider health -------------------------------------------------------------------------

function renderHealth() {
  return fill($('#health'), async () => {
    const h = await getJson('health');
    const list = el('ul', { class: 'providers' });
    for (const p of h.providers) {
      const reasons = el('ul', { class: 'reasons' });
      for (const r of p.reasons) {
        reasons.append(el('li', { 'data-kind': r.kind }, el('strong', {}, r.kind), `: ${r.detail}`,
          r.since ? el('span', { class: 'muted' }, ` since ${when(r.since)}`) : null));
      }
      list.append(el('li', { 'data-provider': p.provider, 'data-out': p.out, class: p.out ? 'out' : 'in' },
        el('span', { class: 'dot' }), el('strong', {}, p.provider), ` ${p.out ? 'out of rotation' : 'in rotation'}`,
        p.reasons.length ? reasons : null));
    }
    return [list];
  });
}

// --- 6: the journal -----------------------------------------------------------------------------

function evidence(ev) {
  if (!ev) return null;
  const rows = el('tbody');
  for (const p of ev.providers || []) {
    rows.append(el('tr', { 'data-provider': p.provider }, el('th', { scope: 'row' }, p.provider),
      el('td', { class: 'num' }, ms(p.score)), el('td', { class: 'num' }, p.samples)));
  }
  const facts = [];
  if (ev.network) facts.push(`network ${ev.network}`);
  if (ev.gap_ms !== null && ev.gap_ms !== undefined) facts.push(`gap ${ms(ev.gap_ms)}`);
  if (ev.required_ms !== null && ev.required_ms !== undefined) facts.push(`required ${ms(ev.required_ms)}`);
  if (ev.capped_by) facts.push(`capped by ${ev.capped_by}`);
  return el('div', { class: 'evidence' },
    el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'provider'), el('th', {}, 'score'), el('th', {}, 'samples'))), rows),
    facts.length ? el('p', {}, facts.join(' · ')) : null,
    ev.note ? el('p', { class: 'note' }, ev.note) : null);
}

function localToRfc3339(v) {
  return v ? new Date(v).toISOString() : '';
}

async function searchJournal(ev) {
  if (ev) ev.preventDefault();
  const form = $('#journal-form');
  const status = $('#journal-status');
  const results = $('#journal-results');
  const params = {
    network: form.elements.network.value.trim(),
    from: localToRfc3339(form.elements.from.value),
    to: localToRfc3339(form.elements.to.value),
    moves_only: form.elements.moves_only.checked ? 'true' : 'false',
    limit: 200,
  };
  status.textContent = 'searching…';
  try {
    const j = await getJson('journal', params);
    const items = [];
    for (const e of j.entries) {
      items.push([e.at, el('li', { class: 'entry', 'data-cohort': e.cohort, 'data-rule': e.rule },
        el('time', { datetime: e.at }, when(e.at)), ' ',
        el('strong', {}, e.cohort), el('span', { class: 'muted' }, ` (${(e.networks || []).join(', ')})`), ' ',
        el('span', { class: 'before' }, weightsText(e.before)), ' → ', el('span', { class: 'after' }, weightsText(e.after)), ' ',
        el('span', { class: 'rule' }, e.rule), evidence(e.evidence))]);
    }
    for (const o of j.operator || []) {
      items.push([o.at, el('li', { class: 'operator' }, el('time', { datetime: o.at }, when(o.at)), ' ',
        el('strong', {}, o.who), ` ${o.action}: `, el('span', { class: 'note' }, o.why))]);
    }
    items.sort((a, b) => (a[0] < b[0] ? 1 : a[0] > b[0] ? -1 : 0));
    results.replaceChildren(...items.map((i) => i[1]));
    status.textContent = `${j.entries.length} decision(s), ${(j.operator || []).length} operator action(s)`;
  } catch (e) {
    results.replaceChildren();
    status.textContent = String(e.message || e);
    status.className = 'error';
    return;
  }
  status.className = 'muted';
}

// --- 7: charts ----------------------------------------------------------------------------------

function fillCohorts(cohorts) {
  const select = $('#chart-cohort');
  const current = select.value;
  const names = cohorts.map((c) => c.cohort);
  if (names.join('\n') === Array.from(select.options, (o) => o.value).join('\n')) return;
  select.replaceChildren(...names.map((n) => el('option', { value: n }, n)));
  if (names.includes(current)) select.value = current;
  renderCharts().catch(() => {});
}

// A line chart of series [{name, points: [[Date, number]]}], y from 0, time on x.
function lineChart(target, series, providers, yFormat, yMax) {
  const W = 560, H = 220, L = 48, R = 12, T = 10, B = 26;
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) {
    target.replaceChildren(el('p', { class: 'muted' }, 'no history yet'));
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = yMax ?? Math.max(1, ...all.map((p) => p[1])) * 1.1;
  const x = (t) => L + (t1 === t0 ? (W - L - R) / 2 : ((t - t0) / (t1 - t0)) * (W - L - R));
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    root.append(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }));
    const label = svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' });
    label.textContent = yFormat(v);
    root.append(label);
  }
  const times = t1 === t0 ? [[t0, 'middle']] : [[t0, 'start'], [t1, 'end']];
  times.forEach(([t, anchor]) => {
    const label = svg('text', { x: x(t), y: H - 6, 'text-anchor': anchor, class: 'axis' });
    label.textContent = new Date(t).toLocaleString();
    root.append(label);
  });
  for (const s of series) {
    const d = s.points.map((p, i) => `${i ? 'L' : 'M'}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
    const stroke = colour(providers, s.name);
    const path = svg('path', { d, fill: 'none', stroke, 'stroke-width': 2, 'data-provider': s.name });
    const title = svg('title');
    title.textContent = s.name;
    path.append(title);
    root.append(path);
    // A lone point has no line to draw: mark it.
    if (s.points.length === 1) {
      root.append(svg('circle', { cx: x(s.points[0][0]), cy: y(s.points[0][1]), r: 3.5, fill: stroke }));
    }
  }
  const legend = el('p', { class: 'legend' });
  for (const s of series) {
    legend.append(el('span', { style: `color:${colour(providers, s.name)}` }, '■ '), s.name, '  ');
  }
  target.replaceChildren(root, legend);
}

async function renderCharts() {
  const cohort = $('#chart-cohort').value;
  if (!cohort) return;
  const network = $('#chart-network').value.trim();
  try {
    const h = await getJson('history', { cohort, network });
    const byName = (rows, value) => {
      const m = new Map();
      for (const r of rows) for (const [p, v] of value(r)) {
        if (v === null || v === undefined) continue;
        if (!m.has(p)) m.set(p, []);
        m.get(p).push([Date.parse(r.at), v]);
      }
      return [...m.entries()].sort().map(([name, points]) => ({ name, points }));
    };
    const weights = byName(h.weights, (r) => Object.entries(r.weights));
    const p75 = byName(h.p75, (r) => [[r.provider, r.p75]]);
    const providers = [...new Set([...weights, ...p75].map((s) => s.name))].sort();
    lineChart($('#chart-weights'), weights, providers, pct, 1);
    lineChart($('#chart-p75'), p75, providers, ms);
  } catch (e) {
    showError($('#chart-weights'), e);
    showError($('#chart-p75'), e);
  }
}

// --- wiring -------------------------------------------------------------------------------------

async function refresh() {
  const parts = await Promise.allSettled([renderBoard(), renderWeights(), renderLoop(), renderHealth(), renderCharts()]);
  const failed = parts.filter((p) => p.status === 'rejected').length;
  const status = $('#status');
  status.textContent = `updated ${new Date().toLocaleTimeString()}${failed ? `, ${failed} part(s) failed` : ''}`;
  status.className = failed ? 'error' : 'muted';
}

document.addEventListener('DOMContentLoaded', () => {
  $('#metric').addEventListener('change', () => renderBoard().catch(() => {}));
  $('#chart-cohort').addEventListener('change', () => renderCharts());
  $('#chart-network').addEventListener('change', () => renderCharts());
  $('#chart-form').addEventListener('submit', (e) => { e.preventDefault(); renderCharts(); });
  $('#journal-form').addEventListener('submit', searchJournal);
  refresh();
  setInterval(refresh, REFRESH_MS);
});
