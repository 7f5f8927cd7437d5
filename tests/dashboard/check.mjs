// Drives the dashboard in headless Chromium the way a person would and prints what it shows,
// as one JSON object on stdout; tests/observability.rs compares it with what was published.
//
//   node tests/dashboard/check.mjs URL TABLE PREFIX DEVICE FROM TO SCREENSHOT.png OTHER
//
// It also shows the device's hour and day roll-ups and saves that view as SCREENSHOT-hour.png,
// then picks table OTHER and its device DEVICE.
//
// Needs Debian's chromium (/usr/bin/chromium, or $CHROMIUM) and playwright-core installed under
// $HG_TEST_NODE_DIR (default ~/.cache/hourglass-node); scripts/test.sh installs both.
// Exits non-zero, with the reason on stderr, when a step cannot be done or the page throws.

import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";

const [url, table, prefix, device, from, to, shot, other] = process.argv.slice(2);
if (!other) {
  console.error("usage: check.mjs URL TABLE PREFIX DEVICE FROM TO SCREENSHOT OTHER");
  process.exit(2);
}
const nodeDir = process.env.HG_TEST_NODE_DIR || path.join(os.homedir(), ".cache", "hourglass-node");
const require = createRequire(path.join(nodeDir, "package.json"));
const { chromium } = require("playwright-core");

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium" });
const pageErrors = [];
/** Status elements may be empty (zero height): wait for their state, not their visibility. */
const attached = { state: "attached" };
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(30000);
  page.on("pageerror", (e) => pageErrors.push(e.message));
  const out = {};

  await page.goto(url);
  await page.waitForSelector(`#tables button[data-table="${table}"]`);
  out.tables = await page.$$eval("#tables button.table", (bs) => bs.map((b) => b.dataset.table));

  // Pick the table (its definition in a line), then search its devices by prefix.
  await page.click(`#tables button[data-table="${table}"]`);
  await page.waitForSelector('#table-info[data-state="done"]', attached);
  out.table_info = await page.textContent("#table-info");
  // Defined again elsewhere (roll-ups kept 80,000 days): the line follows at the tables' next
  // refresh (every 30 s; called here).
  out.redefined = await page.evaluate(async (name) => {
    const body = JSON.stringify({ name, hour_rollup_retention: "80000d", day_rollup_retention: "80000d" });
    const res = await fetch("/v1/tables", { method: "POST", headers: { "content-type": "application/json" }, body });
    return res.status;
  }, table);
  await page.evaluate(() => loadTables());
  await page.waitForFunction((before) => document.querySelector("#table-info").textContent !== before, out.table_info);
  out.table_info_refreshed = await page.textContent("#table-info");
  await page.waitForSelector('#devices-status[data-state="done"]', attached);
  await page.fill("#device-search", prefix);
  await page.waitForFunction((p) => {
    const status = document.querySelector("#devices-status").dataset.state;
    const shown = [...document.querySelectorAll("#devices button.device")];
    return status === "done" && shown.length > 0 && shown.every((b) => b.dataset.device.startsWith(p));
  }, prefix);
  out.devices = await page.$$eval("#devices button.device", (bs) => bs.map((b) => b.dataset.device));

  // Pick the device: its latest values, then a chart of the hour before its latest reading.
  await page.click(`#devices button[data-device="${device}"]`);
  await page.waitForSelector('#chart-status[data-state="done"]', attached);
  out.title = await page.textContent("#device-title");
  out.latest = Object.fromEntries(
    await page.$$eval("#latest tbody tr", (rows) => rows.map((r) => [r.dataset.field, r.querySelector("td.value").textContent])));
  out.latest_ts = await page.textContent("#latest-ts");

  // The chosen range.
  const load = async () => {
    await page.$eval("#chart-status", (e) => { e.dataset.state = "stale"; });
    await page.click("#load");
    await page.waitForSelector('#chart-status[data-state="done"], #chart-status[data-state="error"]', attached);
  };
  await page.fill("#from", from);
  await page.fill("#to", to);
  await load();
  out.chart_status = await page.textContent("#chart-status");
  out.charts = await page.$$eval("#charts svg.chart", (svgs) => svgs.map((s) => ({
    field: s.dataset.field,
    points: s.dataset.points,
    ts: [...s.querySelectorAll("circle.point")].map((c) => c.dataset.ts),
    values: [...s.querySelectorAll("circle.point")].map((c) => c.dataset.value),
  })));

  // The same range relative to now, 30 s to 31 s before each end (the readings are 5 minutes
  // apart): the page resolves both ends at the click, with one "now", and asks for epoch ms.
  const secondsAgo = (text) => Math.ceil((Date.now() - (/^\d+$/.test(text) ? Number(text) : Date.parse(text))) / 1000) + 30;
  await page.fill("#from", `now-${secondsAgo(from)}s`);
  await page.fill("#to", `now-${secondsAgo(to)}s`);
  const asked = page.waitForRequest((r) => r.url().includes("/readings?"));
  await load();
  const askedFor = new URL((await asked).url()).searchParams;
  out.relative_request = [askedFor.get("from"), askedFor.get("to")];
  out.relative_chart_status = await page.textContent("#chart-status");

  // Dead letters, readiness and the ingest panel (the rate needs two samples of /v1/stats).
  await page.waitForSelector('#dead-letters tbody[data-state="done"]', attached);
  out.dead_letters = await page.$$eval("#dead-letters tr.dead-letter td.reason", (tds) => tds.map((t) => t.textContent));
  // Filtered by reason, then by a source prefix no letter has; `older` stays hidden (one page).
  // A filter sets the table's state to "loading" before its request, so "done" is its answer.
  const deadRows = async () => {
    await page.waitForSelector('#dead-letters tbody[data-state="done"], #dead-letters tbody[data-state="error"]', attached);
    return page.$$eval("#dead-letters tbody tr", (trs) => trs.map((t) => t.querySelector("td.reason")?.textContent ?? t.textContent));
  };
  await page.waitForSelector('#dead-reason option[value="invalid_json"]', attached);
  await page.selectOption("#dead-reason", "invalid_json");
  out.dead_invalid_json = await deadRows();
  await page.selectOption("#dead-reason", "");
  await deadRows();
  await page.fill("#dead-source", "no/such/");
  await page.click("#dead-filter button[type=submit]");
  out.dead_no_source = await deadRows();
  out.dead_older_hidden = await page.isHidden("#dead-older");
  await page.fill("#dead-source", "hourglass/");
  await page.click("#dead-filter button[type=submit]");
  out.dead_topic = await deadRows();
  await page.waitForFunction(() => document.querySelector("#ready").dataset.state !== "unknown");
  out.ready = await page.textContent("#ready");
  await page.waitForFunction(() => document.querySelector("#stat-rate").textContent !== "–");
  out.stored = await page.textContent("#stat-stored");
  out.broker = await page.textContent("#stat-broker");
  // The page's byte sizes (the broker cell's middle figure) at each unit's edges.
  // Rates of a fleet publishing 2,000 readings in a burst every 10 s (at 5 s, 15 s, …), sampled
  // every 2 s, as the page polls: from 20 s on, each sample's rate is over its last 20 s.
  out.burst_rates = await page.evaluate(() => {
    const samples = [];
    for (let t = 0; t <= 40000; t += 2000) samples.push({ t, readings: 2000 * Math.floor((t + 5000) / 10000), messages: 0 });
    return samples.map((_, i) => windowRate(samples, i, "readings"));
  });
  out.sizes = await page.evaluate(() => [0, 1023, 1024, 1536, 1024 ** 2 - 1, 1.5 * 1024 ** 2, 2.25 * 1024 ** 3].map(size));
  // The broker cell after skips: two sources' backlogs, skips and the messages known lost summed.
  out.broker_skipped = await page.evaluate(() =>
    brokerCell([
      { broker_backlog: 1200, broker_backlog_bytes: 3 * 1024 ** 2, broker_skips: 2, broker_skipped_messages: 1700 },
      { broker_backlog: 5, broker_backlog_bytes: 512, broker_skips: 1, broker_skipped_messages: 0, broker_unmatched_messages: 4 },
      { messages: 9, broker_unmatched_messages: 3 },
    ]),
  );
  // Unmatched messages alone are lost too.
  out.broker_unmatched = await page.evaluate(() => brokerCell([{ broker_skips: 0, broker_unmatched_messages: 2 }]));
  await page.screenshot({ path: shot, fullPage: true });

  // A range the API rejects: its message is shown and the old chart is gone.
  await page.fill("#from", "yesterday");
  await load();
  out.range_error = (await page.isVisible("#chart-error")) ? await page.textContent("#chart-error") : null;
  out.charts_after_error = await page.$$eval("#charts svg.chart", (s) => s.length);

  // Roll-ups over the same range, then over the 6 h preset, by hour and by day.
  const rollupCharts = () => page.$$eval("#charts svg.chart", (svgs) => svgs.map((s) => {
    const pts = [...s.querySelectorAll("circle.point")];
    const attr = (k) => pts.map((c) => c.dataset[k]);
    return {
      field: s.dataset.field,
      level: s.dataset.level,
      points: s.dataset.points,
      line_points: s.querySelector("polyline.line").getAttribute("points").split(" ").length,
      band: !!s.querySelector("polygon.band"),
      period: attr("period"),
      mean: attr("mean"),
      min: attr("min"),
      max: attr("max"),
      count: attr("count"),
      titles: [...s.querySelectorAll("g.period > title")].map((t) => t.textContent),
    };
  }));
  const reload = async (action) => {
    await page.$eval("#chart-status", (e) => { e.dataset.state = "stale"; });
    await action();
    await page.waitForSelector('#chart-status[data-state="done"], #chart-status[data-state="error"]', attached);
  };
  const rollupView = async () => ({
    status: await page.textContent("#chart-status"),
    error: (await page.isVisible("#chart-error")) ? await page.textContent("#chart-error") : null,
    charts: await rollupCharts(),
  });
  await page.fill("#from", from);
  await reload(() => page.selectOption("#level", "hour"));
  out.hour_same_range = await rollupView();
  await reload(() => page.click('#range .presets button[data-span="21600000"]'));
  out.hour_6h = await rollupView();
  out.range_6h = [await page.inputValue("#from"), await page.inputValue("#to")];
  await page.hover("#charts svg.chart g.period");
  await page.screenshot({ path: shot.replace(/\.png$/, "") + "-hour.png", fullPage: true });
  await reload(() => page.selectOption("#level", "day"));
  out.day_6h = await rollupView();
  await page.fill("#from", "yesterday");
  await reload(() => page.click("#load"));
  out.rollup_range_error = await rollupView();
  // A date and time without a UTC offset: sent as typed, for the API to refuse, as raw readings'
  // (the page read it in the browser's time zone, and asked for those roll-ups).
  await page.fill("#from", from.replace(/Z$/, ""));
  await reload(() => page.click("#load"));
  out.rollup_local_time = await rollupView();

  // Another table: the device panel empties at once; then its device of the same name.
  await page.click(`#tables button[data-table="${other}"]`);
  out.switched = {
    title: await page.textContent("#device-title"),
    latest_hidden: await page.isHidden("#latest"),
    charts: await page.$$eval("#charts svg.chart", (s) => s.length),
    load_disabled: await page.isDisabled("#load"),
  };
  await page.waitForSelector('#table-info[data-state="done"]', attached);
  out.big_table_info = await page.textContent("#table-info");
  await page.waitForSelector('#devices-status[data-state="done"]', attached);
  await page.click(`#devices button[data-device="${device}"]`);
  await page.waitForSelector('#chart-status[data-state="done"]', attached);
  await reload(() => page.selectOption("#level", "raw"));
  out.big_latest = Object.fromEntries(
    await page.$$eval("#latest tbody tr", (rows) => rows.map((r) => [r.dataset.field, r.querySelector("td.value").textContent])));
  out.big_chart_status = await page.textContent("#chart-status");
  out.big_charts = await page.$$eval("#charts svg.chart", (svgs) => svgs.map((s) => ({
    field: s.dataset.field,
    values: [...s.querySelectorAll("circle.point")].map((c) => c.dataset.value),
    cy_finite: [...s.querySelectorAll("circle.point")].every((c) => Number.isFinite(Number(c.getAttribute("cy")))),
    y_ticks: [...s.querySelectorAll("text.tick.y")].map((t) => t.textContent),
  })));

  if (await page.isVisible("#global-error")) pageErrors.push(await page.textContent("#global-error"));
  if (pageErrors.length) throw new Error(`the page reported errors:\n${pageErrors.join("\n")}`);
  process.stdout.write(JSON.stringify(out) + "\n");
} catch (e) {
  console.error(e.stack || String(e));
  if (page) await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
  process.exitCode = 1;
} finally {
  await browser.close();
}
