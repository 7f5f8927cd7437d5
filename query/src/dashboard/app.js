// Hourglass dashboard: plain script over the public HTTP API, charts drawn as SVG.
// Every request failure is shown in the panel whose data it was meant to fill.
"use strict";

const $ = (sel) => document.querySelector(sel);
const SVG_NS = "http://www.w3.org/2000/svg";
/** Above this many readings per field a chart draws only its line, not one dot per reading. */
const MAX_DOTS = 2000;
const STATS_EVERY_MS = 2000;
const RATE_HISTORY = 90;

const state = {
  table: null, device: null, latestTs: null, stats: [], searchSeq: 0, chartSeq: 0, deadSeq: 0, tableSeq: 0, latestSeq: 0,
};

// ---- requests and errors -------------------------------------------------------------------

/**
 * The API token, when Hourglass checks tokens: given once in the address as `/#token=...` (a
 * fragment never reaches the server or its logs), then kept for this tab in sessionStorage.
 * Without auth (the local demo) there is none and requests carry no Authorization header.
 */
const TOKEN_KEY = "hourglass.token";
function apiToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    // A token is letters, digits, `-` and `_`; a bad %-escape is taken as typed, for the
    // server to refuse (decodeURIComponent threw, and every panel said "URI malformed").
    let token = m[1];
    try {
      token = decodeURIComponent(token);
    } catch (_) {}
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

/**
 * JSON.parse's reviver keeping integers past 2^53 exact, as BigInt (its source text, where the
 * browser gives it): typed i64 fields hold them, and a double would show another number.
 */
function exactIntegers(_key, value, context) {
  if (typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)) {
    return BigInt(context.source);
  }
  return value;
}

/** A value to chart: a number, or an integer past 2^53 (`exactIntegers`); else null. */
const plotted = (v) => (typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : null);

/**
 * GET a JSON document; throws an Error whose message is what the page shows. `exact`: integers
 * past 2^53 come as BigInt (readings' values, shown as stored), else as the nearest double.
 */
async function api(path, exact = false) {
  let res;
  const headers = { accept: "application/json" };
  const token = apiToken();
  if (token) headers.authorization = `Bearer ${token}`;
  try {
    res = await fetch(path, { headers });
  } catch (e) {
    throw new Error(`cannot reach Hourglass (${e.message})`);
  }
  let body = null;
  const text = await res.text();
  try {
    body = text ? JSON.parse(text, exact ? exactIntegers : undefined) : null;
  } catch (_) {
    if (res.ok) throw new Error(`${path}: the answer is not JSON`);
  }
  if (!res.ok) {
    let why = body && body.error ? body.error : text.slice(0, 200) || res.statusText;
    if (res.status === 401) why += " (open this page as /#token=<your token>)";
    const err = new Error(`${res.status}: ${why}`);
    err.status = res.status;
    err.body = body;
    throw err;
  }
  return body;
}

function showError(id, err) {
  const el = $(id);
  if (!err) {
    el.hidden = true;
    el.textContent = "";
    return;
  }
  el.textContent = err.message || String(err);
  el.hidden = false;
}

window.addEventListener("error", (e) => showError("#global-error", new Error(`page error: ${e.message}`)));
window.addEventListener("unhandledrejection", (e) =>
  showError("#global-error", new Error(`page error: ${e.reason && e.reason.message ? e.reason.message : e.reason}`)));

// ---- formatting ----------------------------------------------------------------------------

const enc = encodeURIComponent;
/** Timestamps as RFC 3339 UTC with milliseconds, the form the API accepts back. */
const iso = (ms) => new Date(ms).toISOString();
/** Values exactly as stored: the shortest text that reads back as the same number. */
const num = (v) => (v === null || v === undefined ? "–" : String(v));
const count = (n) => Number(n).toLocaleString("en-US");
// Bytes in binary units: "512 B", "3.0 KiB", "1.5 MiB", "2.25 GiB" (a figure that would round
// to 1024 of a unit is given in the next).
const size = (n) => {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (i < units.length - 1 && Number(v.toFixed(1)) >= 1024) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i >= 2 ? 2 : 1)} ${units[i]}`;
};

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

/** Units of a duration, largest first, as the API writes them (`model::format_duration_ms`). */
const DURATION_UNITS = [["w", 7 * 86400000], ["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]];
/** A time relative to now, as the API reads it: `now`, `now-15m`, `now+1h` (ms, s, m, h, d, w). */
const RELATIVE_TIME = /^now(?:([+-])([1-9]\d*)(ms|s|m|h|d|w))?$/;
/** Milliseconds of each unit a relative time may use: the duration units and `ms`. */
const UNIT_MS = Object.fromEntries([...DURATION_UNITS, ["ms", 1]]);

/**
 * Parses what the range inputs accept (epoch ms, RFC 3339, or relative to `now` ms) for the
 * chart's axis; NaN if not. A date and time without a UTC offset is not RFC 3339 (the browser
 * read it in its own time zone, and roll-up charts asked for that: QA54 F5): NaN, so it is
 * sent as typed and the API says what is wrong, as for raw readings.
 */
function parseTime(text, now = Date.now()) {
  const t = text.trim();
  if (/^-?\d+$/.test(t)) return Number(t);
  const rel = RELATIVE_TIME.exec(t);
  if (rel) return rel[1] ? now + (rel[1] === "-" ? -1 : 1) * Number(rel[2]) * UNIT_MS[rel[3]] : now;
  return /(?:z|[+-]\d\d:\d\d)$/i.test(t) ? Date.parse(t) : NaN;
}

/** A range input as sent: a time relative to `now` as its epoch ms (both ends of one `now`), else as typed. */
function resolveTime(text, now) {
  return RELATIVE_TIME.test(text) ? String(parseTime(text, now)) : text;
}

// ---- readiness and ingest rate -------------------------------------------------------------

async function refreshReady() {
  const badge = $("#ready");
  try {
    await api("/ready");
    badge.textContent = "ready";
    badge.dataset.state = "ready";
    badge.title = "GET /ready: 200";
  } catch (e) {
    badge.textContent = e.status === 503 ? "not ready" : "unreachable";
    badge.dataset.state = "down";
    const reasons = e.body && e.body.reasons ? e.body.reasons.join("; ") : e.message;
    badge.title = reasons;
    if (e.status === 503) badge.textContent = `not ready: ${reasons}`;
  }
}

async function refreshStats() {
  try {
    const s = await api("/v1/stats");
    showError("#ingest-error", null);
    const readings = s.sources.reduce((a, x) => a + x.readings, 0);
    const messages = s.sources.reduce((a, x) => a + x.messages, 0);
    const dead = Object.values(s.dead_letters).reduce((a, n) => a + n, 0);
    // Counts since the server's start: lower than the last sample, it restarted (a rate from
    // both was negative), and the history starts over.
    if (state.stats.length && readings < state.stats[state.stats.length - 1].readings) state.stats = [];
    const prev = state.stats[state.stats.length - 1];
    state.stats.push({ t: s.now_ms, readings, messages });
    if (state.stats.length > RATE_HISTORY) state.stats.shift();
    const last = state.stats.length - 1;
    const rate = windowRate(state.stats, last, "readings");
    if (rate != null) {
      $("#stat-rate").textContent = count(Math.round(rate));
      $("#stat-msg-rate").textContent = count(Math.round(windowRate(state.stats, last, "messages")));
    }
    $("#stat-readings").textContent = count(readings);
    $("#stat-stored").textContent = count(s.store.readings);
    $("#stat-messages").textContent = count(messages);
    $("#stat-dead").textContent = count(dead);
    $("#stat-commit").textContent =
      s.store.commit_count > 0 ? `${((s.store.commit_seconds_sum / s.store.commit_count) * 1000).toFixed(2)} ms` : "–";
    $("#stat-catalog").textContent = `${count(s.store.tables)} · ${count(s.store.devices)}`;
    const broker = $("#stat-broker");
    [broker.textContent, broker.dataset.state] = brokerCell(s.sources);
    // The filter's reasons: every label the store counts.
    const pick = $("#dead-reason");
    if (pick.options.length === 1) {
      for (const r of Object.keys(s.dead_letters).sort()) pick.append(el("option", { value: r }, r));
    }
    const reasons = Object.entries(s.dead_letters).filter(([, n]) => n > 0);
    $("#dead-summary").textContent = reasons.length
      ? "since the service started: " + reasons.map(([r, n]) => `${r} ${count(n)}`).join(", ")
      : "none since the service started (the list below keeps older ones)";
    drawSpark();
  } catch (e) {
    showError("#ingest-error", e);
  }
}

// The embedded broker's cell: what it holds for Hourglass, its size, the times it dropped unread
// messages and how many of them it said it dropped (a skip's loss is unknown when a RUST_LOG hid
// rumqttd's warnings, so "lost" is at least that many), and the messages it took on topics no
// subscription of Hourglass matches (stored nowhere). With its state: "lost" after any skip or
// unmatched message.
function brokerCell(sources) {
  const sum = (key) => sources.reduce((a, x) => a + (x[key] || 0), 0);
  const skips = sum("broker_skips");
  const unmatched = sum("broker_unmatched_messages");
  const text = `${count(sum("broker_backlog"))} · ${size(sum("broker_backlog_bytes"))} · ${count(skips)} · ${count(sum("broker_skipped_messages"))} · ${count(unmatched)}`;
  return [text, skips > 0 || unmatched > 0 ? "lost" : "ok"];
}

/**
 * Rates are averaged over this span: a fleet publishing in one burst every 10 s (the demo's)
 * read 0 between its bursts and a spike at each, two samples apart (QA56 F3).
 */
const RATE_WINDOW_MS = 20000;

/**
 * The rate per second of `key` at sample `i` of `samples` ({t, readings, messages}, oldest
 * first): since the oldest sample at most RATE_WINDOW_MS before it (the one before it when
 * none is); null for the first sample, or samples of one time.
 */
function windowRate(samples, i, key) {
  if (i < 1) return null;
  let j = i - 1;
  while (j > 0 && samples[i].t - samples[j - 1].t <= RATE_WINDOW_MS) j--;
  const secs = (samples[i].t - samples[j].t) / 1000;
  return secs > 0 ? Math.max(0, (samples[i][key] - samples[j][key]) / secs) : null;
}

function drawSpark() {
  const box = $("#rate-spark");
  const pts = [];
  for (let i = 1; i < state.stats.length; i++) pts.push(windowRate(state.stats, i, "readings") ?? 0);
  box.replaceChildren();
  $("#spark-note").hidden = pts.length >= 2;
  if (pts.length < 2) return;
  const max = Math.max(1, ...pts);
  const x = (i) => (i / (RATE_HISTORY - 2)) * 300;
  const y = (v) => 38 - (v / max) * 34;
  box.append(svg("polyline", { points: pts.map((v, i) => `${x(i)},${y(v)}`).join(" "), class: "spark-line" }));
}

// ---- tables and devices --------------------------------------------------------------------

/** Most table names listed at once; a deployment may hold thousands, the filter narrows them. */
const MAX_TABLES_SHOWN = 200;

async function loadTables() {
  try {
    const { tables } = await api("/v1/tables");
    showError("#tables-error", null);
    state.tables = tables;
    renderTables();
    // The picked table's line too: a definition may have changed it (fields, retentions).
    if (state.table != null && tables.includes(state.table)) loadTableInfo(state.table, true);
  } catch (e) {
    showError("#tables-error", e);
  }
}

function renderTables() {
  const tables = state.tables || [];
  const filter = $("#table-filter").value.trim();
  const shown = tables.filter((t) => t.includes(filter));
  const list = $("#tables");
  list.replaceChildren();
  for (const t of shown.slice(0, MAX_TABLES_SHOWN)) {
    const b = el("button", { type: "button", class: "table", "data-table": t, title: t }, t);
    if (t === state.table) b.classList.add("active");
    b.addEventListener("click", () => selectTable(t));
    list.append(el("li", {}, b));
  }
  $("#tables-status").textContent =
    tables.length === 0 ? "No tables yet: publish to hourglass/{table}/{device}."
    : shown.length === 0 ? `no table name contains “${filter}”`
    : shown.length > MAX_TABLES_SHOWN ? `${MAX_TABLES_SHOWN} of ${count(shown.length)} shown: type to filter`
    : "";
}

$("#table-filter").addEventListener("input", renderTables);

function selectTable(t) {
  if (t !== state.table) clearDevice();
  state.table = t;
  for (const b of document.querySelectorAll("#tables button")) b.classList.toggle("active", b.dataset.table === t);
  const input = $("#device-search");
  input.disabled = false;
  input.value = "";
  loadTableInfo(t);
  searchDevices();
}

/** Most fields a table's line names. */
const FIELDS_SHOWN = 20;
/** A retention in the largest unit it is a whole number of: `30d`, `12h`, else milliseconds. */
function duration(ms) {
  const unit = DURATION_UNITS.find(([, size]) => ms !== 0 && ms % size === 0);
  return unit ? `${ms / unit[1]}${unit[0]}` : `${ms}ms`;
}

/**
 * What the table keeps, in one line: its partitions, how long readings and roll-ups are kept
 * (a roll-up floor — what a shorter retention had hidden when it was lengthened — as the first
 * period shown), and its fields. Roll-ups before those are not shown: this says why.
 */
async function loadTableInfo(t, refresh = false) {
  const seq = ++state.tableSeq;
  const info = $("#table-info");
  // A refresh leaves the line as it is until the answer comes.
  if (!refresh) info.dataset.state = "loading";
  let text;
  try {
    const d = await api(`/v1/tables/${enc(t)}`);
    const kept = (ms) => (ms == null ? "forever" : duration(ms));
    const rollups = (level, ms, floor) => `${level} roll-ups kept ${kept(ms)}` + (floor == null ? "" : ` from ${iso(floor)}`);
    // Past its hot retention a partition moves to the archive, kept until the cold retention
    // (forever without one), or is deleted on a store without an archive.
    const readings = `readings kept ${kept(d.hot_retention_ms)}` + (d.hot_retention_ms == null ? ""
      : d.store_archive ? ` (archive: ${kept(d.cold_retention_ms)})` : ", then deleted (no archive)");
    const more = d.fields.length - FIELDS_SHOWN;
    const fields = d.fields.length === 0 ? "no fields yet"
      : `fields: ${d.fields.slice(0, FIELDS_SHOWN).map((f) => `${f.name} ${f.type}`).join(", ")}` +
        (more > 0 ? ` and ${count(more)} more` : "");
    text = [`${d.partition} partitions${d.strict ? ", strict" : ""}`, readings,
      rollups("hour", d.hour_rollup_retention_ms, d.hour_rollup_floor_ms),
      rollups("day", d.day_rollup_retention_ms, d.day_rollup_floor_ms), fields].join(" · ");
  } catch (e) {
    text = `definition unavailable: ${e.message}`;
  }
  if (seq !== state.tableSeq) return; // another table was picked meanwhile
  info.textContent = text;
  info.hidden = false;
  info.dataset.state = "done";
}

async function searchDevices() {
  const seq = ++state.searchSeq;
  const prefix = $("#device-search").value.trim();
  const list = $("#devices");
  const status = $("#devices-status");
  status.textContent = "searching…";
  status.dataset.state = "loading";
  try {
    const r = await api(`/v1/tables/${enc(state.table)}/devices?prefix=${enc(prefix)}&limit=100`);
    if (seq !== state.searchSeq) return; // a newer search is under way
    showError("#devices-error", null);
    list.replaceChildren();
    for (const d of r.devices) {
      const b = el("button", { type: "button", class: "device", "data-device": d, title: d }, d);
      if (d === state.device) b.classList.add("active");
      b.addEventListener("click", () => selectDevice(d));
      list.append(el("li", {}, b));
    }
    status.textContent =
      r.devices.length === 0
        ? (prefix ? `no device of ${state.table} starts with “${prefix}”` : `no device in ${state.table} yet`)
        : `${r.devices.length} device(s)${r.complete ? "" : "; more match: type a longer prefix"}`;
    status.dataset.state = "done";
  } catch (e) {
    if (seq !== state.searchSeq) return;
    list.replaceChildren();
    status.textContent = "";
    status.dataset.state = "error";
    showError("#devices-error", e);
  }
}

let searchTimer = null;
$("#device-search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(searchDevices, 200);
});

// ---- one device: latest values and chart ---------------------------------------------------

/** Empties the device panel (a device belongs to its table), dropping answers on their way. */
function clearDevice() {
  state.device = null;
  state.latestTs = null;
  state.chartSeq += 1;
  state.latestSeq += 1;
  $("#device-title").textContent = "Pick a table and a device";
  $("#latest").hidden = true;
  $("#latest tbody").replaceChildren();
  $("#latest-ts").textContent = "";
  showError("#latest-error", null);
  for (const b of document.querySelectorAll("#range button")) b.disabled = true;
  $("#level").disabled = true;
  $("#charts").replaceChildren();
  $("#chart-status").textContent = "";
  $("#chart-status").dataset.state = "idle";
  showError("#chart-error", null);
}

async function selectDevice(d) {
  state.device = d;
  for (const b of document.querySelectorAll("#devices button")) b.classList.toggle("active", b.dataset.device === d);
  $("#device-title").textContent = `${d} in ${state.table}`;
  for (const b of document.querySelectorAll("#range button")) b.disabled = false;
  $("#level").disabled = false;
  await loadLatest();
  // Another device or table picked meanwhile: that pick loads its own.
  if (state.device === d && state.latestTs !== null) {
    setSpan(3600000);
    await loadChart();
  }
}

async function loadLatest() {
  const table = $("#latest");
  const body = table.querySelector("tbody");
  state.latestTs = null;
  const seq = ++state.latestSeq;
  try {
    const r = await api(`/v1/tables/${enc(state.table)}/latest?devices=${enc(state.device)}`, true);
    if (seq !== state.latestSeq) return; // another device or table was picked meanwhile
    showError("#latest-error", null);
    const reading = r.latest[0] && r.latest[0].reading;
    body.replaceChildren();
    if (!reading) {
      table.hidden = true;
      $("#latest-ts").textContent = "no reading stored for this device";
      return;
    }
    for (const [k, v] of Object.entries(reading)) {
      if (k === "ts") continue;
      body.append(el("tr", { "data-field": k }, el("td", { class: "field" }, k), el("td", { class: "value" }, num(v))));
    }
    table.hidden = false;
    state.latestTs = reading.ts;
    $("#latest-ts").textContent = `at ${iso(reading.ts)} (${reading.ts})`;
  } catch (e) {
    if (seq !== state.latestSeq) return;
    body.replaceChildren();
    table.hidden = true;
    $("#latest-ts").textContent = "";
    showError("#latest-error", e);
  }
}

/** Sets the range to the `span` ms ending just after the device's latest reading. */
function setSpan(span) {
  const end = (state.latestTs ?? Date.now()) + 1;
  $("#from").value = iso(end - span);
  $("#to").value = iso(end);
}

for (const b of document.querySelectorAll("#range .presets button")) {
  b.addEventListener("click", () => {
    setSpan(Number(b.dataset.span));
    loadChart();
  });
}

$("#range").addEventListener("submit", (e) => {
  e.preventDefault();
  loadChart();
});

$("#level").addEventListener("change", () => {
  if (state.device !== null) loadChart();
});

/** Roll-up levels the chart offers: period length (ms; UTC hours and days are fixed) and names. */
const LEVELS = {
  hour: { ms: 3600e3, one: "hour", many: "hours", adj: "hourly" },
  day: { ms: 86400e3, one: "day", many: "days", adj: "daily" },
};

async function loadChart() {
  const level = LEVELS[$("#level").value];
  const now = Date.now();
  const from = resolveTime($("#from").value.trim(), now);
  const to = resolveTime($("#to").value.trim(), now);
  const view = level ? rollupView(level, from, to) : readingsView(from, to);
  const seq = ++state.chartSeq;
  const status = $("#chart-status");
  const charts = $("#charts");
  status.textContent = "loading…";
  status.dataset.state = "loading";
  try {
    const r = view.load ? await view.load() : await api(view.path);
    if (seq !== state.chartSeq) return;
    showError("#chart-error", null);
    charts.replaceChildren();
    const shown = view.draw(r, charts);
    status.textContent = shown.text;
    status.dataset.count = String(shown.n);
    status.dataset.state = "done";
  } catch (e) {
    if (seq !== state.chartSeq) return;
    charts.replaceChildren();
    status.textContent = "";
    status.dataset.state = "error";
    showError("#chart-error", e);
  }
}

/** Most raw readings one chart loads, page after page; a range that holds more shows these. */
const MAX_CHART_READINGS = 50000;

/** The raw readings of the chosen range: one chart per field, a point per reading. */
function readingsView(from, to) {
  return {
    path: `/v1/tables/${enc(state.table)}/devices/${enc(state.device)}/readings?from=${enc(from)}&to=${enc(to)}`,
    /** Every page of the range (the API answers one page a request), up to MAX_CHART_READINGS. */
    async load() {
      const readings = [];
      let cursor = null;
      do {
        const r = await api(this.path + (cursor ? `&cursor=${enc(cursor)}` : ""), true);
        for (const x of r.readings) readings.push(x);
        cursor = r.next_cursor;
      } while (cursor && readings.length < MAX_CHART_READINGS);
      return { readings, more: Boolean(cursor) };
    },
    draw(r, charts) {
      const readings = r.readings;
      const fields = [];
      for (const x of readings) for (const k of Object.keys(x)) if (k !== "ts" && !fields.includes(k)) fields.push(k);
      let x0 = parseTime(from), x1 = parseTime(to);
      if (!(x1 > x0) && readings.length) [x0, x1] = [readings[0].ts, readings[readings.length - 1].ts + 1];
      // Strings and booleans are in the latest values, not charted.
      const charted = fields.filter((f) => readings.some((x) => plotted(x[f]) !== null));
      for (const f of charted) charts.append(chart(f, readings, x0, x1));
      let text = readings.length
        ? `${count(readings.length)} reading(s) from ${iso(readings[0].ts)} to ${iso(readings[readings.length - 1].ts)}`
        : "no readings in this range";
      const other = fields.filter((f) => !charted.includes(f));
      if (other.length) text += `; not charted (not numbers): ${other.join(", ")}`;
      if (r.more) text += `: the range holds more than ${count(MAX_CHART_READINGS)}, narrow it to see the rest`;
      return { n: readings.length, text };
    },
  };
}

/**
 * The roll-ups of the periods that overlap the chosen range: `from` goes back to the start of its
 * period (when the page can read it; otherwise it is sent as typed and the API says what is wrong).
 */
function rollupView(level, fromText, to) {
  const fromMs = parseTime(fromText);
  const from = Number.isFinite(fromMs) ? String(Math.floor(fromMs / level.ms) * level.ms) : fromText;
  return {
    path: `/v1/tables/${enc(state.table)}/rollups?device=${enc(state.device)}&level=${level.one}` +
      `&from=${enc(from)}&to=${enc(to)}&aggs=count,min,max,mean`,
    draw(r, charts) {
      const rows = r.rows;
      const fields = [];
      for (const x of rows) for (const k of Object.keys(x)) if (k !== "period" && !fields.includes(k)) fields.push(k);
      let x0 = Number(from), x1 = Math.ceil(parseTime(to) / level.ms) * level.ms;
      if (!(x1 > x0) && rows.length) [x0, x1] = [rows[0].period, rows[rows.length - 1].period + level.ms];
      for (const f of fields) charts.append(rollupChart(f, rows, level, x0, x1));
      const text = rows.length
        ? `${count(rows.length)} ${rows.length === 1 ? level.one : level.many} from ${iso(rows[0].period)} to ` +
          `${iso(rows[rows.length - 1].period + level.ms)}`
        : `no ${level.one} roll-ups in this range (a period is rolled up once the allowed lateness has passed)`;
      return { n: rows.length, text };
    },
  };
}

/** "Nice" tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten. */
function ticks(lo, hi, n) {
  const raw = (hi - lo) / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && out.length < 50; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

/**
 * The value axis's [lo, hi] for values from `min` to `max`, padded 6%. A span too small for
 * doubles to tell apart (all equal, or 1e16 and 1e16 + 2) is widened to a millionth of the
 * magnitude, at least 1: ±1 around 1e21 changed nothing, and the scale divided by zero.
 */
function valueRange(min, max) {
  let lo = min, hi = max;
  const least = Math.max(1, Math.max(Math.abs(lo), Math.abs(hi)) * 1e-6);
  if (!(hi - lo >= least)) {
    const mid = lo / 2 + hi / 2;
    lo = mid - least;
    hi = mid + least;
  }
  const pad = (hi - lo) * 0.06;
  return [lo - pad, hi + pad];
}

/** Time-axis steps, ms: whole seconds, minutes, hours and days, so ticks fall on round UTC times. */
const TIME_STEPS = [1e3, 5e3, 15e3, 30e3, 60e3, 2 * 60e3, 5 * 60e3, 10 * 60e3, 15 * 60e3, 30 * 60e3, 3600e3,
  2 * 3600e3, 3 * 3600e3, 6 * 3600e3, 12 * 3600e3, 86400e3, 2 * 86400e3, 7 * 86400e3, 14 * 86400e3, 28 * 86400e3];

function timeTicks(x0, x1, n) {
  const raw = (x1 - x0) / n;
  const step = TIME_STEPS.find((s) => s >= raw) || Math.ceil(raw / 86400e3) * 86400e3;
  const out = [];
  for (let t = Math.ceil(x0 / step) * step; t <= x1 && out.length < 50; t += step) out.push(t);
  return { step, ticks: out };
}

function timeLabel(ms, step, span) {
  const s = iso(ms);
  if (step < 60e3) return s.slice(11, 19); // HH:MM:SS
  if (step >= 86400e3) return s.slice(0, 10); // YYYY-MM-DD
  if (span <= 86400e3) return s.slice(11, 16); // HH:MM
  return s.slice(5, 10) + " " + s.slice(11, 16); // MM-DD HH:MM
}

/** One field's readings as an SVG line chart over [x0, x1). */
function chart(field, readings, x0, x1) {
  // [ts, value charted, value as stored].
  const pts = readings.filter((r) => plotted(r[field]) !== null).map((r) => [r.ts, plotted(r[field]), r[field]]);
  const [lo, hi] = valueRange(Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1])));
  const root = svg("svg", {
    class: "chart", viewBox: "0 0 860 200", "data-field": field, "data-points": String(pts.length), role: "img",
    "aria-label": `${field}: ${pts.length} readings`,
  });
  root.append(svg("text", { x: 64, y: 11, class: "chart-title" }, `${field} (${count(pts.length)})`));
  const { sx, sy } = axes(root, x0, x1, lo, hi);
  root.append(svg("polyline", { points: pts.map(([t, v]) => `${sx(t).toFixed(1)},${sy(v).toFixed(1)}`).join(" "), class: "line" }));
  if (pts.length <= MAX_DOTS) {
    for (const [t, v, stored] of pts) {
      root.append(svg("circle", { cx: sx(t).toFixed(1), cy: sy(v).toFixed(1), r: 2.5, class: "point", "data-ts": String(t), "data-value": String(stored) },
        svg("title", {}, `${iso(t)}  ${num(stored)}`)));
    }
  }
  return root;
}

/** The frame, grid and axes shared by both charts; returns the scales. */
function axes(root, x0, x1, lo, hi) {
  const W = 860, H = 200, L = 64, R = 16, T = 14, B = 26;
  const sx = (t) => L + ((t - x0) / (x1 - x0)) * (W - L - R);
  const sy = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  for (const v of ticks(lo, hi, 4)) {
    root.append(svg("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: "grid" }));
    root.append(svg("text", { x: L - 6, y: sy(v) + 4, class: "tick y" }, String(v)));
  }
  const { step, ticks: xs } = timeTicks(x0, x1, 6);
  for (const t of xs) {
    root.append(svg("line", { x1: sx(t), x2: sx(t), y1: T, y2: H - B, class: "grid" }));
    root.append(svg("text", { x: sx(t), y: H - 8, class: "tick x" }, timeLabel(t, step, x1 - x0)));
  }
  root.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "frame" }));
  return { sx, sy, top: T, bottom: H - B };
}

/**
 * One field's roll-ups as an SVG chart over [x0, x1): per period (drawn at its middle) the mean
 * on the line, the min–max as the band, and the count in the period's hover title.
 */
function rollupChart(field, rows, level, x0, x1) {
  // Own members only: a field named `constructor` is on every object's prototype.
  const pts = rows.filter((r) => Object.hasOwn(r, field) && r[field]).map((r) => ({ period: r.period, ...r[field] }));
  const [lo, hi] = valueRange(Math.min(...pts.map((p) => p.min)), Math.max(...pts.map((p) => p.max)));
  const n = pts.length;
  const root = svg("svg", {
    class: "chart rollup", viewBox: "0 0 860 200", "data-field": field, "data-level": level.one,
    "data-points": String(n), role: "img", "aria-label": `${field}: ${level.adj} mean, min and max of ${n} ${level.many}`,
  });
  root.append(svg("text", { x: 64, y: 11, class: "chart-title" },
    `${field}: ${level.adj} mean, min–max band (${count(n)} ${n === 1 ? level.one : level.many})`));
  const { sx, sy, top, bottom } = axes(root, x0, x1, lo, hi);
  const mid = (p) => sx(p.period + level.ms / 2);
  const xy = (x, v) => `${x.toFixed(1)},${sy(v).toFixed(1)}`;
  root.append(svg("polygon", {
    points: [...pts.map((p) => xy(mid(p), p.max)), ...pts.slice().reverse().map((p) => xy(mid(p), p.min))].join(" "),
    class: "band",
  }));
  // A mean of null (a sum that overflowed) is no point of the line; it was drawn as 0.
  const means = pts.filter((p) => p.mean !== null);
  root.append(svg("polyline", { points: means.map((p) => xy(mid(p), p.mean)).join(" "), class: "line" }));
  if (n <= MAX_DOTS) {
    const width = Math.max(2, sx(x0 + level.ms) - sx(x0));
    for (const p of pts) {
      const x = mid(p);
      root.append(svg("g", { class: "period" },
        svg("title", {}, `${iso(p.period)} ${level.one}: mean ${num(p.mean)}, min ${num(p.min)}, ` +
          `max ${num(p.max)}, ${count(p.count)} reading(s)`),
        svg("rect", { x: (x - width / 2).toFixed(1), y: top, width: width.toFixed(1), height: bottom - top, class: "hover" }),
        svg("line", { x1: x.toFixed(1), x2: x.toFixed(1), y1: sy(p.min).toFixed(1), y2: sy(p.max).toFixed(1), class: "range" }),
        svg("circle", {
          cx: x.toFixed(1), cy: sy(p.mean ?? (p.min / 2 + p.max / 2)).toFixed(1), r: p.mean === null ? 0 : 2.5,
          class: "point", "data-period": String(p.period),
          "data-mean": String(p.mean), "data-min": String(p.min), "data-max": String(p.max), "data-count": String(p.count),
        })));
    }
  }
  return root;
}

// ---- dead letters --------------------------------------------------------------------------

// The cursor of the page after the one shown.
let deadOlder = null;

// Newest first, 50 at a time, by the filter's reason and source prefix; `older` reads the page
// after the one shown.
async function loadDeadLetters(older) {
  const body = $("#dead-letters tbody");
  const seq = ++state.deadSeq;
  body.dataset.state = "loading";
  const params = new URLSearchParams({ limit: "50" });
  const reason = $("#dead-reason").value;
  const source = $("#dead-source").value.trim();
  if (reason) params.set("reason", reason);
  if (source) params.set("source", source);
  if (older && deadOlder) params.set("cursor", deadOlder);
  try {
    const r = await api("/v1/dead-letters?" + params);
    if (seq !== state.deadSeq) return; // a newer filter is under way
    showError("#dead-error", null);
    body.replaceChildren();
    deadOlder = r.next_cursor;
    $("#dead-older").hidden = !deadOlder;
    if (r.dead_letters.length === 0) {
      const text = reason || source || older ? "No dead letters match." : "No dead letters.";
      body.append(el("tr", {}, el("td", { colspan: "5", class: "muted" }, text)));
    }
    for (const d of r.dead_letters) {
      const payload = d.payload.length > 160 ? d.payload.slice(0, 160) + "…" : d.payload;
      body.append(el("tr", { class: "dead-letter", "data-reason": d.reason },
        el("td", { class: "received" }, iso(d.received_ms)), el("td", { class: "reason" }, d.reason), el("td", {}, d.source),
        el("td", {}, d.detail), el("td", { class: "payload" }, el("code", {}, payload))));
    }
    body.dataset.state = "done";
  } catch (e) {
    if (seq !== state.deadSeq) return;
    body.replaceChildren();
    body.dataset.state = "error";
    showError("#dead-error", e);
  }
}

$("#dead-refresh").addEventListener("click", () => loadDeadLetters(false));
$("#dead-filter").addEventListener("submit", (e) => { e.preventDefault(); loadDeadLetters(false); });
$("#dead-reason").addEventListener("change", () => loadDeadLetters(false));
$("#dead-older").addEventListener("click", () => loadDeadLetters(true));

// ---- start ---------------------------------------------------------------------------------

loadTables();
loadDeadLetters(false);
refreshReady();
refreshStats();
setInterval(() => { refreshStats(); refreshReady(); }, STATS_EVERY_MS);
setInterval(loadTables, 30000);
