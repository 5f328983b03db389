"""The status page served at `/`: one self-contained HTML document, no external resources.

Its script fetches `/status.json` every 2 seconds and draws everything itself: a summary line,
three SVG line charts of the sampled history (messages in per second, messages out per second,
subscription lag; one line per topic or subscription, the busiest ones) and tables of topics and
subscriptions. Nothing is downloaded from elsewhere, so it works on an isolated network. Kept as
a Python string so that it ships inside the package with no package-data configuration.
Every chart is an `<svg class="chart" data-series=N data-points=M>`, which tests check.

Lines are told apart by colour and by dash (`DASHES`): two series with the same values, drawn on
top of each other, still show both (the dashed one over the solid one), and the later one's
legend says `= NAME` of the one it covers. The page is served with the status of the moment
inside it (`page`), drawn before the load event: a headless browser's screenshot or DOM dump
shows the charts and tables, not "loading..." (docs/OPERATIONS.md has the recipe).
"""

import json
from typing import Any, Final

PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Headwater status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #1d2330;
         background: #f6f7f9; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 15px; margin: 20px 0 6px; }
  #summary { color: #505a6b; margin-bottom: 8px; }
  .bad { color: #b3261e; font-weight: 600; }
  .good { color: #1e7b34; font-weight: 600; }
  .charts { display: flex; flex-wrap: wrap; gap: 16px; }
  .panel { background: #fff; border: 1px solid #dde1e7; border-radius: 6px; padding: 8px 10px; }
  .panel h3 { font-size: 13px; margin: 0 0 4px; font-weight: 600; }
  svg.chart { display: block; }
  .legend { font-size: 12px; color: #505a6b; max-width: 400px; }
  .legend span { display: inline-block; margin-right: 10px; white-space: nowrap; }
  .legend svg { display: inline-block; margin-right: 4px; vertical-align: middle; }
  table { border-collapse: collapse; background: #fff; border: 1px solid #dde1e7; }
  th, td { padding: 4px 10px; border-bottom: 1px solid #eef0f3; text-align: right; }
  th { background: #eef0f3; font-weight: 600; }
  td:first-child, th:first-child, td.text { text-align: left; }
  #error { color: #b3261e; }
</style>
</head>
<body>
<h1>Headwater</h1>
<div id="summary">loading&hellip;</div>
<div id="error"></div>
<div class="charts">
  <div class="panel"><h3>Messages in per second</h3><div id="chart-in"></div></div>
  <div class="panel"><h3>Messages out per second</h3><div id="chart-out"></div></div>
  <div class="panel"><h3>Subscription lag (messages)</h3><div id="chart-lag"></div></div>
</div>
<h2>Topics</h2>
<table id="topics"><thead><tr><th>topic</th><th>dispatch</th><th>partitions</th>
<th>in/s</th><th>out/s</th><th>messages in</th><th>messages out</th><th>bytes in</th>
<th>bytes out</th><th>offline</th></tr></thead><tbody></tbody></table>
<h2>Subscriptions</h2>
<table id="subscriptions"><thead><tr><th>topic</th><th>subscription</th><th>type</th>
<th>consumers</th><th>lag</th><th>backlog</th><th>unacked</th><th>delivered</th>
<th>dead-lettered</th><th>dropped</th></tr></thead><tbody></tbody></table>
<h2>Kafka groups</h2>
<table id="kafka-groups"><thead><tr><th>group</th><th>kind</th><th>state</th><th>members</th>
<th>epoch</th><th>topics</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const COLORS = ["#2f6fdf", "#e0732c", "#2a9d5c", "#c23b7a", "#7c5cd6", "#b59a1c",
                "#1aa3b0", "#8a4b2d", "#5f6b7d", "#d64545"];
// one per series after the colours: a line drawn over an equal one leaves it visible
const DASHES = ["", "6 3", "2 3", "9 3 2 3", "4 5"];
const W = 400, H = 190, PAD_L = 52, PAD_R = 8, PAD_T = 8, PAD_B = 22;
const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(n) {
  if (n === null || n === undefined) return "";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : String(Number(n.toPrecision(3)));
}

function niceMax(v) {  // 1, 2 or 5 times a power of ten: round numbers on the axis
  if (!(v > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(v))), f = v / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

function chart(holder, times, series) {
  const names = Object.keys(series);
  let max = 0, points = 0;
  for (const name of names) for (const v of series[name]) if (v !== null && v > max) max = v;
  max = niceMax(max);
  const t0 = times.length ? times[0] : 0, t1 = times.length ? times[times.length - 1] : 1;
  const span = Math.max(t1 - t0, 1);
  const x = t => PAD_L + (t - t0) / span * (W - PAD_L - PAD_R);
  const y = v => PAD_T + (1 - v / max) * (H - PAD_T - PAD_B);
  const svg = el("svg", {class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`});
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4, yy = y(v);
    el("line", {x1: PAD_L, x2: W - PAD_R, y1: yy, y2: yy, stroke: "#eef0f3"}, svg);
    el("text", {x: PAD_L - 4, y: yy + 4, "text-anchor": "end", "font-size": 10,
                fill: "#505a6b"}, svg).textContent = fmt(v);
  }
  el("line", {x1: PAD_L, x2: W - PAD_R, y1: H - PAD_B, y2: H - PAD_B, stroke: "#9aa3b0"}, svg);
  el("text", {x: PAD_L, y: H - 6, "font-size": 10, fill: "#505a6b"}, svg).textContent =
    "-" + Math.round(span) + " s";
  el("text", {x: W - PAD_R, y: H - 6, "font-size": 10, fill: "#505a6b",
              "text-anchor": "end"}, svg).textContent = "now";
  const legend = document.createElement("div");
  legend.className = "legend";
  // a series over an earlier one: equal wherever both have a value (and one at least)
  const covers = (a, b) => {
    let common = 0;
    for (let j = 0; j < a.length; j++) {
      if (a[j] === null || b[j] === null || a[j] === undefined || b[j] === undefined) continue;
      if (a[j] !== b[j]) return false;
      common++;
    }
    return common > 0;
  };
  names.forEach((name, i) => {
    const color = COLORS[i % COLORS.length], dash = DASHES[i % DASHES.length];
    const same = names.slice(0, i).find(other => covers(series[other], series[name]));
    let d = "", pen = false;
    series[name].forEach((v, j) => {
      if (v === null || v === undefined || j >= times.length) { pen = false; return; }
      d += (pen ? "L" : "M") + x(times[j]).toFixed(1) + " " + y(v).toFixed(1) + " ";
      pen = true;
      points++;
    });
    if (d) el("path", {d: d, fill: "none", stroke: color, "stroke-width": 2,
                       "stroke-dasharray": dash || "none", class: "series",
                       "data-name": name}, svg);
    const item = document.createElement("span");
    item.setAttribute("data-name", name);
    const mark = el("svg", {width: 22, height: 6});
    el("line", {x1: 0, x2: 22, y1: 3, y2: 3, stroke: color, "stroke-width": 2,
                "stroke-dasharray": dash || "none"}, mark);
    item.appendChild(mark);
    item.appendChild(document.createTextNode(same === undefined ? name : `${name} = ${same}`));
    if (same !== undefined) item.setAttribute("data-same-as", same);
    legend.appendChild(item);
  });
  if (!names.length) {
    el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#9aa3b0",
                "font-size": 12}, svg).textContent = "no data yet";
  }
  svg.setAttribute("data-series", names.length);
  svg.setAttribute("data-points", points);
  holder.replaceChildren(svg, legend);
}

function row(table, cells) {
  const tr = document.createElement("tr");
  for (const [value, text] of cells) {
    const td = document.createElement("td");
    td.textContent = typeof value === "number" ? fmt(value) : (value ?? "");
    if (text) td.className = "text";
    tr.appendChild(td);
  }
  table.appendChild(tr);
}

function render(s) {
  const ready = s.ready ? '<span class="good">ready</span>'
                        : `<span class="bad">not ready: ${s.not_ready_reason}</span>`;
  const uploads = s.uploads ? ` &middot; uploads pending ${s.uploads.pending},
    failures ${s.uploads.failures}` : "";
  document.getElementById("summary").innerHTML =
    `version ${s.version} &middot; up ${fmt(s.uptime_seconds)} s &middot; ${ready}
     &middot; ${s.connections} connections &middot; ${s.topics.length} topics${uploads}`;
  const h = s.history;
  chart(document.getElementById("chart-in"), h.time, h.in_per_second);
  chart(document.getElementById("chart-out"), h.time, h.out_per_second);
  chart(document.getElementById("chart-lag"), h.lag_time, h.lag);
  const topics = document.querySelector("#topics tbody");
  const subs = document.querySelector("#subscriptions tbody");
  topics.replaceChildren();
  subs.replaceChildren();
  for (const t of s.topics) {
    row(topics, [[t.name, 1], [t.dispatch, 1], [t.partitions], [t.in_per_second],
                 [t.out_per_second], [t.messages_in], [t.messages_out], [t.bytes_in],
                 [t.bytes_out], [t.offline_partitions]]);
    for (const u of t.subscriptions) {
      row(subs, [[t.name, 1], [u.name, 1], [u.type, 1], [u.consumers], [u.lag],
                 [u.backlog], [u.unacked], [u.delivered], [u.dead_lettered], [u.dropped]]);
    }
  }
  // a share group's records are its Shared subscription's row above (same name)
  const groups = document.querySelector("#kafka-groups tbody");
  groups.replaceChildren();
  for (const g of s.kafka_groups ?? []) {
    row(groups, [[g.name, 1], [g.kind, 1], [g.state, 1], [g.members], [g.epoch],
                 [g.topics.join(", "), 1]]);
  }
  document.body.setAttribute("data-rendered", String(Date.now()));
}

async function refresh() {
  try {
    const response = await fetch("status.json", {cache: "no-store"});
    if (!response.ok) throw new Error("status.json: HTTP " + response.status);
    render(await response.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot refresh: " + e.message;
  }
  setTimeout(refresh, 2000);
}
const FIRST = /*STATUS*/null;  // the status when the page was served: drawn before "load"
if (FIRST) {
  render(FIRST);
  setTimeout(refresh, 2000);
} else {
  refresh();
}
</script>
</body>
</html>
"""


def page(status: dict[str, Any]) -> str:
    """The page with `status` drawn at once (the same object `/status.json` returns)."""
    # inside <script>: "</" would end it early, so every "<" is escaped (still valid JSON)
    first = json.dumps(status, separators=(",", ":")).replace("<", "\\u003c")
    return PAGE.replace("/*STATUS*/null", first, 1)
