// ai-router console: hand-written, no build step, no library. Every string from the API is put
// in the page as a text node (h() below); nothing is parsed as HTML.
'use strict';

(function () {
  const TOKEN = 'ai-router.adminToken';
  const $ = (id) => document.getElementById(id);
  let refresh = null; // the current page's refresh timer
  let current = null; // the page the address names: nothing else is drawn
  let stream = null; // the events page's AbortController
  // The signed-in token's scope (GET /admin/whoami): actions it does not cover are not shown.
  let scope = 'read';
  const SCOPES = ['read', 'operate', 'keys', 'admin'];
  const may = (need) => SCOPES.indexOf(scope) >= SCOPES.indexOf(need);
  const readOnly = (need) => h('p', { class: 'note read-only' }, 'Read-only: this token\'s scope is ' + scope + '; changes here need ' + need + '.');

  // ------------------------------------------------------------------ DOM and formatting

  // h('tag', { class, id, on: { click }, ...attributes }, children...): children are nodes or
  // strings (text nodes); attributes go through setAttribute, never through HTML parsing.
  function h(tag, attrs, ...children) {
    const svg = ['svg', 'rect', 'line', 'text', 'g', 'title', 'polyline'].includes(tag);
    const el = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === 'style' || k.startsWith('on')) throw new Error('no inline style or handler');
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const text = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));
  const num = (v) => (typeof v === 'number' ? v.toLocaleString('en-US') : text(v));
  const pct = (v) => (typeof v === 'number' ? (v * 100).toFixed(1) + ' %' : '—');
  const ms = (v) => (typeof v === 'number' ? v + ' ms' : '—');
  const money = (v) => (typeof v === 'number' ? '$' + (v >= 1 ? v.toFixed(2) : v.toFixed(4)) : '—');

  function when(at) {
    if (at === null || at === undefined) return 'no end';
    if (at === 0) return '—';
    const d = new Date(at);
    const rel = Math.round((at - Date.now()) / 1000);
    const abs = Math.abs(rel);
    const span = abs < 90 ? abs + ' s' : abs < 5400 ? Math.round(abs / 60) + ' min' : abs < 172800 ? Math.round(abs / 3600) + ' h' : Math.round(abs / 86400) + ' d';
    return d.toISOString().replace('T', ' ').slice(0, 19) + 'Z (' + (rel >= 0 ? 'in ' + span : span + ' ago') + ')';
  }

  function age(msAgo) {
    if (typeof msAgo !== 'number') return '—';
    return msAgo < 1000 ? msAgo + ' ms' : Math.round(msAgo / 1000) + ' s';
  }

  function table(caption, heads, rows, empty) {
    if (!rows.length) return h('p', { class: 'empty' }, empty || 'None.');
    return h('div', { class: 'scroll', role: 'region', 'aria-label': caption, tabindex: '0' },
      h('table', {},
        h('caption', {}, caption),
        h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))),
        h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c instanceof Node ? c : text(c))))))));
  }

  function status(message, error) {
    const s = $('status');
    s.textContent = message || '';
    s.className = error ? 'status error' : 'status';
  }

  function badge(word) {
    const good = ['ok', 'closed', 'healthy', 'enabled', 'success', 'lasts', 'idle'];
    const bad = ['open', 'exhausted', 'disabled', 'revoked', 'out', 'runs_out', 'over'];
    const cls = good.includes(word) ? 'good' : bad.includes(word) ? 'bad' : 'warn';
    return h('span', { class: 'badge ' + cls }, text(word));
  }

  // A confirmation in a modal dialog: resolves true when the operator confirms.
  function confirmAction(message) {
    const dialog = $('confirm');
    $('confirm-text').textContent = message;
    return new Promise((resolve) => {
      dialog.addEventListener('close', () => resolve(dialog.returnValue === 'yes'), { once: true });
      dialog.returnValue = '';
      dialog.showModal();
      $('confirm-no').focus();
    });
  }

  // ------------------------------------------------------------------ API

  class ApiError extends Error {}

  async function api(method, path, body) {
    const token = sessionStorage.getItem(TOKEN);
    const init = {
      method,
      headers: { Authorization: 'Bearer ' + token, Accept: 'application/json' },
      credentials: 'omit',
      cache: 'no-store',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    const data = await r.json().catch(() => null);
    if (r.status === 403 && data && data.error && data.error.code === 'insufficient_scope') {
      throw new ApiError(data.error.message);
    }
    if (r.status === 401 || r.status === 403) {
      signOut((data && data.error && data.error.message) || 'The token was refused.');
      throw new ApiError('signed out');
    }
    if (!r.ok) throw new ApiError((data && data.error && data.error.message) || method + ' ' + path + ': ' + r.status);
    return data;
  }

  // ------------------------------------------------------------------ session

  function signOut(reason) {
    sessionStorage.removeItem(TOKEN);
    stop();
    $('nav').hidden = true;
    $('signout').hidden = true;
    $('page').hidden = true;
    $('page').replaceChildren();
    $('login').hidden = false;
    $('login-error').textContent = reason || '';
    $('token').focus();
  }

  async function signIn(token) {
    sessionStorage.setItem(TOKEN, token);
    try {
      await api('GET', '/admin/health');
      scope = (await api('GET', '/admin/whoami')).scope;
    } catch (e) {
      if (!(e instanceof ApiError) || e.message !== 'signed out') signOut(e.message);
      return;
    }
    $('login').hidden = true;
    $('nav').hidden = false;
    $('signout').hidden = false;
    $('page').hidden = false;
    route();
  }

  function stop() {
    if (refresh) clearInterval(refresh);
    refresh = null;
    if (stream) stream.abort();
    stream = null;
  }

  // ------------------------------------------------------------------ pages

  const pages = { overview, pool, keys, usage, events, config };

  async function route() {
    if (!sessionStorage.getItem(TOKEN)) return signOut();
    stop();
    const name = (location.hash || '#overview').slice(1);
    const page = pages[name] ? name : 'overview';
    for (const a of document.querySelectorAll('#nav a')) {
      if (a.getAttribute('href') === '#' + page) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    document.title = 'ai-router console: ' + page;
    current = page;
    await show(page);
  }

  async function show(page, keepFocus) {
    const root = $('page');
    try {
      const content = await pages[page]();
      // An answer that arrives after the operator moved on is not drawn over the new page.
      if (page !== current) return;
      root.replaceChildren(...content.filter((c) => c !== null && c !== undefined));
      root.dataset.page = page;
      root.dataset.loaded = String(Date.now());
      status('Updated ' + new Date().toLocaleTimeString());
      if (!keepFocus) $('main').focus();
    } catch (e) {
      if (e instanceof ApiError && e.message === 'signed out') return;
      status(e.message, true);
    }
  }

  // Redraws `page` every few seconds: one timer at a time (each redraw asks again).
  function every(seconds, page) {
    if (page !== current) return;
    if (refresh) clearInterval(refresh);
    refresh = setInterval(() => {
      if (!$('confirm').open) show(page, true);
    }, seconds * 1000);
  }

  function problemText(p) {
    const until = p.untilMs === undefined ? '' : ', until ' + when(p.untilMs);
    switch (p.kind) {
      case 'breaker': return 'Breaker ' + p.state + ' on ' + p.provider + (p.key ? '/' + p.key : '') + until;
      case 'key_out': return 'Key ' + p.provider + '/' + p.key + ' out: ' + p.reason + (p.code ? ' (' + p.code + ')' : '') + until;
      case 'provider_out': return 'Provider ' + p.provider + ' out: ' + p.reason + until;
      case 'cooldown': return 'Cooling down: ' + p.provider + '/' + p.key + ' ' + text(p.model) + until;
      case 'budget': return 'Budget ' + p.budget + (p.subject ? ' for ' + p.subject : '') + ': ' + p.level + until;
      case 'scope_out': return 'Billing scope ' + p.provider + '/' + p.scope + ' ' + p.state + ' (' + text(p.reason) + ')' + until;
      default: return p.kind;
    }
  }

  async function overview() {
    every(5, 'overview');
    const o = await api('GET', '/admin/console');
    const c = o.calls;
    const tile = (label, value) => h('div', { class: 'tile' }, h('span', { class: 'label' }, label), h('span', { class: 'value' }, value));
    const group = (caption, rows) => table(caption, ['name', 'calls', 'calls/s', 'success', 'p50', 'p99'],
      rows.map((r) => [text(r.name), num(r.requests), num(r.requestsPerSecond), pct(r.successRate), ms(r.p50Ms), ms(r.p99Ms)]),
      'No calls in the last minute.');
    return [
      h('h1', {}, 'Overview'),
      h('section', { class: o.problems.length ? 'problems bad' : 'problems good', 'aria-labelledby': 'wrong' },
        h('h2', { id: 'wrong' }, o.problems.length ? 'What is wrong now (' + o.problems.length + ')' : 'Nothing is wrong now'),
        o.problems.length ? h('ul', {}, o.problems.map((p) => h('li', {}, problemText(p)))) : null),
      h('div', { class: 'tiles' },
        tile('Calls per second (last ' + Math.round(c.windowMs / 1000) + ' s)', num(c.requestsPerSecond)),
        tile('Success rate', pct(c.successRate)),
        tile('Latency p50', ms(c.p50Ms)),
        tile('Latency p99', ms(c.p99Ms)),
        tile('Spend today (' + o.spend.day + ')', money(o.spend.today)),
        tile('Spend this month', money(o.spend.month))),
      h('div', { class: 'pair' },
        h('section', { 'aria-labelledby': 'spend-providers' },
          h('h2', { id: 'spend-providers' }, 'Spend per provider'),
          table('Spend per provider', ['provider', 'today', 'this month'],
            o.spend.providers.map((p) => [text(p.name), money(p.today), money(p.month)]), 'Nothing spent this month.')),
        h('section', { 'aria-labelledby': 'spend-protocols' },
          h('h2', { id: 'spend-protocols' }, 'Spend per protocol'),
          table('Spend per client protocol', ['protocol', 'today', 'this month'],
            o.spend.protocols.map((p) => [text(p.name), money(p.today), money(p.month)]), 'Nothing spent this month.'))),
      h('h2', {}, 'Per provider'), group('Calls per provider, last minute', c.providers),
      h('h2', {}, 'Per protocol'), group('Calls per client protocol, last minute', c.protocols),
      h('p', { class: 'note' }, 'Gateway ' + text(o.version) + ', status ' + text(o.status) + '.'),
    ];
  }

  async function reset(provider, key) {
    const what = key ? 'key ' + provider + '/' + key : 'provider ' + provider;
    if (!(await confirmAction('Reset ' + what + '? Its breakers close and its blacklists and cooldowns are lifted.'))) return;
    const r = await api('POST', '/admin/reset', key ? { provider, key } : { provider });
    await show('pool', true);
    const counts = Object.entries(r.reset || {}).map(([k, v]) => v + ' ' + k).join(', ');
    status('Reset ' + what + ': ' + (counts || 'nothing to lift') + '.');
  }

  async function pool() {
    every(5, 'pool');
    const [health, ledger] = await Promise.all([api('GET', '/admin/health'), api('GET', '/admin/console/ledger')]);
    const out = [h('h1', {}, 'Pool'), may('operate') ? null : readOnly('operate')];
    for (const p of health.providers) {
      const breaker = (key) => {
        const b = health.breakers.find((x) => x.provider === p.id && (key ? x.key === key : !x.key));
        return b ? b.state + (b.openUntilMs ? ' until ' + when(b.openUntilMs) : '') : 'closed';
      };
      const latency = (key) => {
        const lanes = health.lanes.filter((l) => l.provider === p.id && l.key === key);
        return lanes.length ? Math.round(lanes.reduce((s, l) => s + l.latencyEwmaMs, 0) / lanes.length) + ' ms' : '—';
      };
      // The attempts in flight on a key, as the Envoys last reported them.
      const inFlight = (key) => {
        const l = ledger.inFlight.find((x) => x.provider === p.id && x.key === key);
        return h('span', { 'data-in-flight': p.id + '/' + key }, num(l ? l.attempts : 0));
      };
      const provOut = health.providerHealth.find((x) => x.provider === p.id);
      const rows = p.keys.map((k) => [
        k.alias, badge(k.state), text(k.code), k.state === 'ok' ? '—' : when(k.untilMs), breaker(k.alias), inFlight(k.alias), latency(k.alias),
        may('operate') ? h('button', { type: 'button', class: 'small', 'aria-label': 'Reset key ' + p.id + '/' + k.alias, on: { click: () => reset(p.id, k.alias).catch((e) => status(e.message, true)) } }, 'Reset') : '—',
      ]);
      const led = ledger.providers.find((x) => x.provider === p.id);
      out.push(h('section', { class: 'card', 'aria-labelledby': 'prov-' + p.id },
        h('div', { class: 'row' },
          h('h2', { id: 'prov-' + p.id }, p.id, ' ', h('small', {}, p.kind)),
          may('operate') ? h('button', { type: 'button', 'aria-label': 'Reset provider ' + p.id, on: { click: () => reset(p.id).catch((e) => status(e.message, true)) } }, 'Reset provider') : null),
        provOut ? h('p', { class: 'error' }, 'Provider out: ' + provOut.reason + ', until ' + when(provOut.untilMs)) : null,
        h('p', { class: 'note' }, 'Models: ' + (p.models.join(', ') || '—') + '. Provider breaker: ' + breaker('') + '.'),
        table('Keys of ' + p.id, ['key', 'state', 'code', 'until', 'breaker', 'in flight', 'latency', ''], rows),
        led ? ledgerTables(led) : null));
    }
    out.push(h('h2', {}, 'Model families'));
    out.push(table('Families and the lanes serving them', ['family', 'routes', 'live', 'providers'],
      ledger.families.map((f) => [f.family, num(f.routes), num(f.live), f.providers.join(', ')])));
    return out;
  }

  function forecastText(f) {
    if (!f) return '—';
    switch (f.verdict) {
      case 'runs_out': return 'runs out ' + when(f.exhaustsAtMs) + ' at ' + f.ratePerMinute + '/min';
      case 'lasts': return 'lasts until reset (' + f.ratePerMinute + '/min)';
      case 'idle': return 'idle';
      case 'out': return 'out now';
      default: return 'unknown';
    }
  }

  function ledgerTables(led) {
    return led.scopes.map((s) => {
      const windows = Object.entries(s.windows).filter(([, w]) => w.limit !== null || w.remaining !== null);
      return h('div', { class: 'scope' },
        h('h3', {}, 'Billing scope ', s.scope, ' ', badge(s.state), s.reason ? ' ' + s.reason + ', until ' + when(s.untilMs) : ''),
        s.credit ? h('p', {}, 'Credit: ' + money(s.credit.remaining) + ' of ' + money(s.credit.limit) + ' left (' + s.credit.source + ', ' + age(s.credit.ageMs) + ' old)') : null,
        table('Ledger of ' + led.provider + '/' + s.scope, ['window', 'limit', 'used', 'remaining', 'source', 'age', 'resets', 'forecast'],
          windows.map(([name, w]) => [name, num(w.limit), num(w.used), num(w.remaining), text(w.source), age(w.ageMs), w.resetsAtMs ? when(w.resetsAtMs) : '—', forecastText(w.forecast)]),
          'No limit known for this scope.'));
    });
  }

  // ---- virtual keys

  let created = null; // the last create/rotate answer: its secret is shown once

  function secretBox() {
    if (!created) return null;
    const { key, secret } = created;
    created = null;
    const input = h('input', { id: 'new-secret', type: 'text', readonly: true, value: secret, 'aria-label': 'Secret of ' + key.label, size: '40' });
    const copy = h('button', {
      type: 'button', on: {
        click: async () => {
          try { await navigator.clipboard.writeText(input.value); status('Copied.'); } catch (e) { input.select(); status('Select and copy it by hand.'); }
        },
      },
    }, 'Copy');
    return h('section', { class: 'card secret', role: 'alert' },
      h('h2', {}, 'Secret of ' + key.label + ' (' + key.id + ')'),
      h('p', {}, 'Shown once: copy it now; the gateway keeps only its hash.'), input, ' ', copy);
  }

  async function keyAction(label, method, path, body, confirmText) {
    if (confirmText && !(await confirmAction(confirmText))) return;
    const r = await api(method, path, body);
    if (r && r.secret) created = r;
    await show('keys', true);
    status(label + ' done.');
  }

  async function keys() {
    const [list, use] = await Promise.all([api('GET', '/admin/keys'), api('GET', '/admin/console/usage?from=' + today() + '&to=' + today())]);
    const todayOf = (id) => { const k = use.keys.find((x) => x.id === id); return k ? k.total : null; };
    const act = (fn) => () => fn().catch((e) => status(e.message, true));
    const rows = list.keys.map((k) => {
      const t = todayOf(k.id);
      const state = k.revoked ? 'revoked' : k.enabled ? 'enabled' : 'disabled';
      const usageButton = h('button', { type: 'button', class: 'small', 'aria-label': 'Usage of ' + k.label, on: { click: act(() => keyUsage(k)) } }, 'Usage');
      const actions = k.mounted ? h('span', { class: 'actions' }, usageButton, h('span', { class: 'note' }, 'mounted (read-only)')) : k.revoked || !may('keys') ? h('span', { class: 'actions' }, usageButton) : h('span', { class: 'actions' },
        usageButton,
        h('button', { type: 'button', class: 'small', 'aria-label': 'Rotate ' + k.label, on: { click: act(() => keyAction('Rotate', 'POST', '/admin/keys/' + encodeURIComponent(k.id) + '/rotate', undefined, 'Rotate ' + k.label + '? The old secret stops working at once.')) } }, 'Rotate'),
        h('button', { type: 'button', class: 'small', 'aria-label': (k.enabled ? 'Disable ' : 'Enable ') + k.label, on: { click: act(() => keyAction(k.enabled ? 'Disable' : 'Enable', 'PATCH', '/admin/keys/' + encodeURIComponent(k.id), { enabled: !k.enabled })) } }, k.enabled ? 'Disable' : 'Enable'),
        h('button', { type: 'button', class: 'small danger', 'aria-label': 'Revoke ' + k.label, on: { click: act(() => keyAction('Revoke', 'POST', '/admin/keys/' + encodeURIComponent(k.id) + '/revoke', undefined, 'Revoke ' + k.label + ' for good?')) } }, 'Revoke'));
      const quota = Object.entries(k.quota || {}).filter(([, v]) => v !== null && v !== undefined).map(([n, v]) => n + ' ' + v).join(', ');
      return [h('span', { 'data-key-id': k.id }, k.label), k.id, text(k.owner), k.profiles.join(', ') || '—', k.models.join(', ') || '—', quota || '—', badge(state),
        t ? num(t.requests) + ' calls, ' + money(t.cost) : '—', actions];
    });
    const field = (id, label, hint, value) => h('p', {}, h('label', { for: id }, label), h('input', { id, name: id, type: 'text', value, 'aria-describedby': hint ? id + '-hint' : null }), hint ? h('small', { id: id + '-hint' }, ' ' + hint) : null);
    const form = h('form', { id: 'create-key', class: 'card' },
      h('h2', {}, 'Create a virtual key'),
      field('key-label', 'Label', 'lowercase letters, digits and _'), field('key-owner', 'Owner'),
      field('key-profiles', 'Profiles', 'comma-separated names, * for every profile'), field('key-models', 'Models', 'comma-separated ids or aliases, * for every model', '*'),
      h('button', { type: 'submit' }, 'Create'));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const split = (id) => $(id).value.split(',').map((s) => s.trim()).filter(Boolean);
      const spec = { label: $('key-label').value.trim() };
      if ($('key-owner').value.trim()) spec.owner = $('key-owner').value.trim();
      if (split('key-profiles').length) spec.profiles = split('key-profiles');
      if (split('key-models').length) spec.models = split('key-models');
      keyAction('Create', 'POST', '/admin/keys', spec).catch((e) => status(e.message, true));
    });
    return [h('h1', {}, 'Virtual keys'), secretBox(),
      table('Virtual keys', ['label', 'id', 'owner', 'profiles', 'models', 'quota', 'state', 'today', 'actions'], rows, 'No virtual key yet.'),
      h('div', { id: 'key-usage' }), may('keys') ? form : readOnly('keys')];
  }

  async function keyUsage(k) {
    const u = await api('GET', '/admin/keys/' + encodeURIComponent(k.id) + '/usage');
    $('key-usage').replaceChildren(h('section', { class: 'card' },
      h('h2', {}, 'Usage of ' + k.label + ' from ' + u.from + ' to ' + u.to),
      chart(everyDay(u.days, u.from, u.to), 'requests', 'Calls per day of ' + k.label),
      table('Days of ' + k.label, ['day', 'calls', 'ok', 'failed', 'tokens', 'cost', 'saved'],
        u.days.map((d) => [d.day, num(d.requests), num(d.successes), num(d.failures), num(d.promptTokens + d.completionTokens), money(d.cost), money(d.saved)]), 'No use in this range.')));
    $('key-usage').scrollIntoView();
  }

  // ---- usage and spend

  function today() { return new Date().toISOString().slice(0, 10); }

  // A bar chart of rows[field] per row.day, drawn as SVG by hand.
  function chart(rows, field, title) {
    const W = 640, H = 180, pad = 28;
    const max = Math.max(0, ...rows.map((r) => r[field] || 0));
    const svg = h('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'chart', role: 'img', 'aria-label': title }, h('title', {}, title));
    svg.append(h('line', { x1: pad, y1: H - pad, x2: W - 4, y2: H - pad, class: 'axis' }));
    if (!rows.length || max === 0) {
      svg.append(h('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'nothing yet'));
      return svg;
    }
    const bw = (W - pad - 4) / rows.length;
    rows.forEach((r, i) => {
      const v = r[field] || 0;
      const bh = ((H - 2 * pad) * v) / max;
      const x = pad + i * bw + bw * 0.1;
      svg.append(h('rect', { x: x.toFixed(1), y: (H - pad - bh).toFixed(1), width: (bw * 0.8).toFixed(1), height: bh.toFixed(1), class: 'bar' },
        h('title', {}, r.day + ': ' + (field === 'cost' ? money(v) : num(v)))));
      if (rows.length <= 16 || i % Math.ceil(rows.length / 8) === 0) {
        svg.append(h('text', { x: (x + bw * 0.4).toFixed(1), y: H - 10, 'text-anchor': 'middle', class: 'tick' }, r.day.slice(5)));
      }
    });
    svg.append(h('text', { x: 2, y: pad - 8, class: 'tick' }, field === 'cost' ? money(max) : num(max)));
    return svg;
  }

  // Every day from `from` to `to` (at most 92), the days without a row as zeroes.
  function everyDay(rows, from, to) {
    const out = [];
    const end = Date.parse(to + 'T00:00:00Z');
    for (let t = Date.parse(from + 'T00:00:00Z'); t <= end && out.length < 92; t += 86400000) {
      const day = new Date(t).toISOString().slice(0, 10);
      out.push(rows.find((r) => r.day === day) || { day, requests: 0, cost: 0 });
    }
    return out.length ? out : rows;
  }

  // Cells that a spreadsheet would run as a formula are quoted.
  function csv(rows) {
    const cell = (v) => {
      let s = v === null || v === undefined ? '' : String(v);
      if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
      return /[",\n']/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
    };
    return rows.map((r) => r.map(cell).join(',')).join('\r\n') + '\r\n';
  }

  let usageRange = null;

  async function usage() {
    const range = usageRange || { from: today().slice(0, 8) + '01', to: today() };
    const u = await api('GET', '/admin/console/usage?from=' + encodeURIComponent(range.from) + '&to=' + encodeURIComponent(range.to));
    const dayRows = u.days.map((d) => [d.day, d.requests, d.successes, d.failures, d.promptTokens, d.completionTokens, d.cost, d.saved]);
    const keyRows = u.keys.filter((k) => k.total.requests > 0).map((k) => [k.label, k.id, k.total.requests, k.total.promptTokens + k.total.completionTokens, k.total.cost, k.total.saved]);
    const laneRows = u.lanes.map((l) => [l.day, l.provider || '—', l.model || '—', l.protocol, l.requests, l.successes, l.promptTokens + l.completionTokens, l.cost, l.saved]);
    const download = h('button', {
      type: 'button', id: 'export-csv', on: {
        click: () => {
          // One line per key, day, provider, model and protocol: the stored usage rows.
          const rows = [['day', 'key', 'key id', 'provider', 'model', 'protocol', 'calls', 'successes', 'failures', 'prompt tokens', 'completion tokens', 'cost usd', 'saved usd']];
          for (const k of u.keys) for (const d of k.lanes) rows.push([d.day, k.label, k.id, d.provider, d.model, d.protocol, d.requests, d.successes, d.failures, d.promptTokens, d.completionTokens, d.cost, d.saved]);
          const a = h('a', { href: URL.createObjectURL(new Blob([csv(rows)], { type: 'text/csv' })), download: 'ai-router-usage-' + u.from + '-' + u.to + '.csv' });
          document.body.append(a); a.click(); a.remove();
        },
      },
    }, 'Export CSV');
    const form = h('form', { class: 'row', id: 'usage-range' },
      h('label', { for: 'from' }, 'From'), h('input', { id: 'from', type: 'date', value: u.from, required: true }),
      h('label', { for: 'to' }, 'To'), h('input', { id: 'to', type: 'date', value: u.to, required: true }),
      h('button', { type: 'submit' }, 'Show'), download);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      usageRange = { from: $('from').value, to: $('to').value };
      show('usage', true);
    });
    const sum = (f) => u.days.reduce((s, d) => s + d[f], 0);
    return [h('h1', {}, 'Usage and spend'), form,
      h('p', {}, 'From ' + u.from + ' to ' + u.to + ': ' + num(sum('requests')) + ' calls, ' + money(sum('cost')) + ' spent; cheaper lanes saved ' + money(sum('saved')) +
        '; the response cache answered ' + num(u.cache.hits) + ' calls and saved ' + money(u.cache.saved) + ' since the control plane started.'),
      h('h2', {}, 'Spend per day'), chart(everyDay(u.days, u.from, u.to), 'cost', 'Spend per day (USD)'),
      h('h2', {}, 'Calls per day'), chart(everyDay(u.days, u.from, u.to), 'requests', 'Calls per day'),
      table('Per day', ['day', 'calls', 'ok', 'failed', 'prompt tokens', 'completion tokens', 'cost', 'saved'], dayRows.map((r) => r.map((v, i) => (i >= 6 ? money(v) : i ? num(v) : v)))),
      h('h2', {}, 'Per key'),
      table('Per key', ['key', 'id', 'calls', 'tokens', 'cost', 'saved'], keyRows.map((r) => r.map((v, i) => (i >= 4 ? money(v) : i >= 2 ? num(v) : v)))),
      h('h2', {}, 'Per provider, model and protocol'),
      h('p', { class: 'note' }, 'A call counts on the lane that answered it; tokens and cost on the lane that used them; both on the protocol the client called by.'),
      table('Per provider, model and protocol', ['day', 'provider', 'model', 'protocol', 'calls', 'ok', 'tokens', 'cost', 'saved'], laneRows.map((r) => r.map((v, i) => (i >= 7 ? money(v) : i >= 4 ? num(v) : text(v)))))];
  }

  // ---- events

  const TYPES = ['attempt', 'request', 'breaker', 'key-disabled', 'key-restored', 'budget'];
  let eventFilter = { types: TYPES.slice(), provider: '', key: '' };

  function eventSummary(e) {
    const parts = [];
    for (const f of ['operation', 'outcome', 'model', 'status', 'latencyMs', 'reason', 'was', 'from', 'to', 'code', 'budget', 'level', 'errorClass']) {
      if (e[f] !== undefined && e[f] !== null && e[f] !== '') parts.push(f + '=' + e[f]);
    }
    return parts.join(' ');
  }

  async function events() {
    const list = h('tbody', { id: 'event-rows' });
    const boxes = TYPES.map((t) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: t, checked: eventFilter.types.includes(t) }), ' ' + t));
    const provider = h('input', { id: 'ev-provider', type: 'text', value: eventFilter.provider });
    const key = h('input', { id: 'ev-key', type: 'text', value: eventFilter.key });
    const form = h('form', { id: 'event-filter', class: 'card' },
      h('fieldset', {}, h('legend', {}, 'Types'), boxes),
      h('p', { class: 'row' }, h('label', { for: 'ev-provider' }, 'Provider'), provider, h('label', { for: 'ev-key' }, 'Key'), key,
        h('button', { type: 'submit' }, 'Apply')));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      eventFilter = { types: boxes.map((b) => b.firstChild).filter((b) => b.checked).map((b) => b.value), provider: provider.value.trim(), key: key.value.trim() };
      show('events', true);
    });
    const state = h('p', { id: 'event-state', class: 'note' }, 'Connecting…');
    listen(list, state);
    return [h('h1', {}, 'Events'), form, state,
      h('div', { class: 'scroll', role: 'region', 'aria-label': 'Live events', tabindex: '0' },
        h('table', {}, h('caption', {}, 'Live events, newest first'),
          h('thead', {}, h('tr', {}, ['time', 'type', 'provider', 'key', 'details'].map((x) => h('th', { scope: 'col' }, x)))), list))];
  }

  // Reads the SSE stream with fetch (EventSource cannot send the Authorization header).
  async function listen(list, state) {
    if (!eventFilter.types.length) { state.textContent = 'No type chosen.'; return; }
    const controller = new AbortController();
    stream = controller;
    const wanted = (e) => (!eventFilter.provider || e.provider === eventFilter.provider) && (!eventFilter.key || e.key === eventFilter.key || e.subject === eventFilter.key);
    try {
      const r = await fetch('/admin/events?types=' + encodeURIComponent(eventFilter.types.join(',')), {
        headers: { Authorization: 'Bearer ' + sessionStorage.getItem(TOKEN), Accept: 'text/event-stream' },
        credentials: 'omit', cache: 'no-store', signal: controller.signal,
      });
      if (!r.ok) throw new Error('events: ' + r.status);
      state.textContent = 'Live: ' + eventFilter.types.join(', ') + '.';
      state.dataset.live = 'true';
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
          if (!data) continue;
          let e;
          try { e = JSON.parse(data); } catch (_) { continue; }
          if (!wanted(e)) continue;
          list.prepend(h('tr', {}, [when(e.atMs).slice(0, 19), e.type, text(e.provider), text(e.key || e.subject), eventSummary(e)].map((c) => h('td', {}, c))));
          while (list.children.length > 300) list.lastChild.remove();
        }
      }
      state.textContent = 'The stream ended.';
    } catch (e) {
      if (e.name !== 'AbortError') state.textContent = 'The stream broke: ' + e.message;
    }
  }

  // ---- configuration

  async function config() {
    const [cat, health] = await Promise.all([api('GET', '/admin/catalog'), api('GET', '/admin/health')]);
    const cand = (p) => p.candidates.map((tier) => tier.map((c) => (c.provider ? c.provider + ':' : '') + c.model + (c.weight ? ' ×' + c.weight : '')).join(' | ')).join(' → ');
    return [h('h1', {}, 'Configuration'),
      h('p', { class: 'note' }, 'Read-only: the pool changes by editing its file.'),
      h('h2', {}, 'Profiles'),
      table('Profiles', ['name', 'model', 'fallbacks', 'candidates', 'providers', 'require', 'auto sort', 'cache'],
        cat.profiles.map((p) => [p.name, text(p.model), p.fallbacks.join(', ') || '—', cand(p) || '—', p.providers.join(', ') || '—', p.require.join(', ') || '—', String(p.autoSort), String(p.cache)]), 'No profile.'),
      h('h2', {}, 'Models'),
      table('Models', ['model', 'aliases', 'source', 'served by', 'capabilities', 'price (in/out per 1M)'],
        cat.models.map((m) => [m.id, m.aliases.join(', ') || '—', m.source,
          m.servedBy.map((s) => s.provider + ' (' + s.keys.join(', ') + ')').join('; '),
          [...new Set(m.servedBy.flatMap((s) => s.capabilities))].join(', ') || '—',
          m.servedBy.map((s) => (s.cost ? s.cost.input + ' / ' + s.cost.output : s.priced)).join('; ')])),
      h('h2', {}, 'Rules'),
      table('Routing rules, first tried first', ['name', 'priority', 'enabled', 'task type', 'user tier', 'feature', 'profile'],
        cat.routes.map((r) => [r.name, num(r.priority), String(r.enabled), text(r.match.taskType), text(r.match.userTier), text(r.match.feature), r.target.profile]), 'No rule.'),
      h('h2', {}, 'Budgets'),
      table('Budgets', ['name', 'scope', 'window', 'enforcement', 'warn at', 'max tokens', 'max cost', 'spent'],
        health.budgets.map((b) => [b.name, b.scope, b.window, b.enforcement, text(b.warnAt), num(b.limits.maxTokens), money(b.limits.maxCost),
          b.spent.map((s) => (s.subject || 'pool') + ': ' + num(s.tokens) + ' tokens, ' + money(s.cost) + (s.level ? ' (' + s.level + ')' : '')).join('; ') || '—']), 'No budget.'),
      h('h2', {}, 'Discovery'),
      table('Model listings', ['provider', 'key', 'listed', 'models', 'listed at', 'next', 'error'],
        cat.discovery.map((d) => [d.provider, d.key, String(d.listed), num(d.models), d.listedAtMs ? when(d.listedAtMs) : '—', when(d.nextListingAtMs), text(d.error)]), 'No provider discovers its models.'),
    ];
  }

  // ------------------------------------------------------------------ start

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const token = $('token').value.trim();
      $('token').value = '';
      signIn(token);
    });
    $('signout').addEventListener('click', () => signOut('Signed out.'));
    window.addEventListener('hashchange', route);
    const token = sessionStorage.getItem(TOKEN);
    if (token) signIn(token); else signOut();
  });
})();
