// The console's charts, drawn as inline SVG from plain numbers: a timeline of steps, spend over
// time against a cap, a histogram, a rate with its interval. No library: the console works
// air-gapped. Every mark carries a <title> with its exact values (a tooltip, and what a screen
// reader says), and each chart comes with a table of the same values behind it.
"use strict";

import { el, seconds } from "./console_api.js";

const NS = "http://www.w3.org/2000/svg";
export const WIDTH = 1000; // every chart's viewBox width; it scales to its figure
const LEFT = 210, RIGHT = 985; // the time axis of the timeline and the cost chart: aligned

export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value != null) node.setAttribute(key, typeof value === "number" ? round(value) : String(value));
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function round(value) { return String(Math.round(value * 100) / 100); }

function titled(node, text) { node.append(svg("title", {}, text)); return node; }

function chart(height, label, width = WIDTH) {
  return svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
}

/** A table of a chart's exact values, folded under it. */
export function dataTable(caption, headers, rows) {
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const row of rows) body.append(el("tr", {}, ...row.map((v) => el("td", {}, v == null ? "" : String(v)))));
  table.append(body);
  return el("details", { className: "data" }, el("summary", {}, caption), table);
}

// Round tick steps for a time axis (seconds), and a label for each.
const TIME_STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];
function timeLabel(s) {
  if (s === 0) return "0";
  if (s < 60) return `${Number(s.toFixed(1))}s`;
  if (s < 3600) return `${Number((s / 60).toFixed(1))}m`;
  return `${Number((s / 3600).toFixed(1))}h`;
}

function timeAxis(node, t0, t1, top, bottom) {
  const span = (t1 - t0) / 1000, k = (RIGHT - LEFT) / span;
  const step = TIME_STEPS.find((s) => span / s <= 8) || span / 8;
  for (let s = 0; s <= span + 1e-9; s += step) {
    const x = LEFT + s * k;
    node.append(svg("line", { class: "grid", x1: x, x2: x, y1: top, y2: bottom }));
    node.append(svg("text", { x, y: bottom + 13, "text-anchor": "middle" }, timeLabel(s)));
  }
  node.append(svg("line", { class: "axis time-axis", x1: LEFT, x2: RIGHT, y1: bottom, y2: bottom }));
}

/** The time span of a run's steps: the first start to the last end (now, while one runs). */
export function span(steps, now) {
  let t0 = Infinity, t1 = -Infinity;
  for (const step of steps) {
    if (step.start == null) continue;
    t0 = Math.min(t0, step.start);
    t1 = Math.max(t1, step.end ?? now ?? step.start);
  }
  if (!Number.isFinite(t0)) return null;
  return { t0, t1: Math.max(t1, t0 + 1) };
}

/**
 * One bar per step on a time axis: x where it started, width what it took. ``steps``: {id,
 * kind, state, start, end (null while it runs), summary}, times in ms; ``now`` the server's
 * clock for a step still running, whose bar reaches it (and so grows).
 */
export function timeline(steps, range, now) {
  const row = 20, top = 8, bottom = top + Math.max(1, steps.length) * row + 4;
  const node = chart(bottom + 22, `timeline of ${steps.length} steps`);
  if (!range) return node;
  const { t0, t1 } = range, k = (RIGHT - LEFT) / (t1 - t0);
  node.dataset.t0 = new Date(t0).toISOString();
  node.dataset.t1 = new Date(t1).toISOString();
  timeAxis(node, t0, t1, top, bottom);
  steps.forEach((step, index) => {
    const y = top + index * row;
    const end = step.end ?? now ?? step.start;
    const running = step.end == null;
    const took = Math.max(0, (end - step.start) / 1000);
    const text = `${step.id} (${step.kind}): ${running ? "running for " : ""}${seconds(took)}, ${step.state}` +
      (step.summary ? ` — ${step.summary}` : "");
    const lane = titled(svg("g", { class: "lane-group" }), text);
    lane.append(svg("rect", { class: "lane", x: 0, y, width: WIDTH, height: row, fill: "transparent" }));
    lane.append(svg("text", { class: "label", x: 4, y: y + 14 }, step.id.length > 30 ? `${step.id.slice(0, 29)}…` : step.id));
    const x = LEFT + (step.start - t0) * k;
    lane.append(svg("line", { class: `tick kind-${step.kind}`, x1: x, x2: x, y1: y + 3, y2: y + row - 3 }));
    lane.append(svg("rect", {
      class: `bar kind-${step.kind} state-${step.state}${running ? " running" : ""}`,
      x, y: y + 3, width: (end - step.start) * k, height: row - 6, rx: 2,
      "data-step": step.id, "data-seconds": took.toFixed(3),
    }));
    node.append(lane);
  });
  return node;
}

/**
 * Model spend over time against the cap: a staircase of the cumulative cost of the steps that
 * cost something, each step where it ended, and the cap as a dashed line. ``points``: {t (ms),
 * usd (cumulative), step, added}; ``cap``: dollars or null.
 */
export function costChart(points, cap, range) {
  const top = 14, bottom = 150;
  const node = chart(bottom + 22, `spend over time${cap != null ? ` against a cap of $${cap}` : ""}`);
  if (!range) return node;
  const { t0, t1 } = range, k = (RIGHT - LEFT) / (t1 - t0);
  const total = points.length ? points[points.length - 1].usd : 0, capUSD = cap == null ? null : Number(cap);
  const top_ = Math.max(capUSD ?? 0, total) * 1.05 || 0.01, step = nice(top_ / 4);
  const ymax = step * Math.ceil(top_ / step);
  const y = (usd) => bottom - (bottom - top) * (usd / ymax);
  node.dataset.ymax = String(ymax);
  for (let v = step; v <= ymax + step / 2; v += step) {
    node.append(svg("line", { class: "grid", x1: LEFT, x2: RIGHT, y1: y(v), y2: y(v) }));
    node.append(svg("text", { x: LEFT - 6, y: y(v) + 4, "text-anchor": "end" }, `$${Number(v.toPrecision(3))}`));
  }
  timeAxis(node, t0, t1, top, bottom);
  node.append(svg("line", { class: "axis baseline", x1: LEFT, x2: RIGHT, y1: bottom, y2: bottom }));
  let path = `M${round(LEFT)},${round(bottom)}`, last = bottom;
  for (const point of points) {
    const x = LEFT + (point.t - t0) * k;
    path += ` L${round(x)},${round(last)} L${round(x)},${round(y(point.usd))}`;
    last = y(point.usd);
  }
  path += ` L${round(RIGHT)},${round(last)}`;
  node.append(svg("path", { class: "spend-area", d: `${path} L${RIGHT},${bottom} Z` }));
  node.append(svg("path", { class: "spend", d: path }));
  for (const point of points) {
    node.append(titled(svg("circle", {
      class: "point", cx: LEFT + (point.t - t0) * k, cy: y(point.usd), r: 3.5,
      "data-usd": point.label, "data-step": point.step,
    }), `${point.step}: +$${point.added}, $${point.label} in all`));
  }
  if (cap != null) {
    node.append(titled(svg("line", { class: "cap", x1: LEFT, x2: RIGHT, y1: y(capUSD), y2: y(capUSD), "data-usd": String(cap) }),
      `the run's cap: $${cap}`));
    node.append(svg("text", { class: "cap-label", x: RIGHT, y: y(capUSD) - 4, "text-anchor": "end" }, `cap $${cap}`));
  }
  node.append(svg("text", { x: 4, y: top + 10, class: "label" }, `$${points.length ? points[points.length - 1].label : "0"} spent`));
  if (capUSD) {
    const used = (100 * total) / capUSD;
    node.append(svg("text", { x: 4, y: top + 26 }, `${used < 0.1 ? used.toPrecision(2) : used.toFixed(1)}% of the cap`));
  }
  return node;
}

/** A round step (1, 2 or 5 times a power of ten) at least ``raw``. */
function nice(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
}

/** Bins over ``values``: about the square root of their number, at most 12, equal widths. */
export function bins(values) {
  if (!values.length) return [];
  const lo = Math.min(...values), hi = Math.max(...values);
  const n = hi === lo ? 1 : Math.min(12, Math.max(2, Math.ceil(Math.sqrt(values.length))));
  const width = (hi - lo) / n;
  const out = Array.from({ length: n }, (_, i) => ({ lo: lo + i * width, hi: i === n - 1 ? hi : lo + (i + 1) * width, count: 0 }));
  for (const v of values) out[width === 0 ? 0 : Math.min(n - 1, Math.floor((v - lo) / width))].count += 1;
  return out;
}

/** A histogram of ``values``; ``format`` writes one value, ``noun`` names what is counted. */
export function histogram(values, format, noun, label) {
  const width = 520, top = 10, bottom = 150, left = 40, right = width - 10; // a half-width figure
  const node = chart(bottom + 24, label, width);
  const binned = bins(values);
  const most = Math.max(1, ...binned.map((b) => b.count));
  const w = (right - left) / Math.max(1, binned.length);
  for (let i = 0; i <= 4; i++) {
    const yv = bottom - ((bottom - top) * i) / 4;
    node.append(svg("line", { class: "grid", x1: left, x2: right, y1: yv, y2: yv }));
    node.append(svg("text", { x: left - 6, y: yv + 4, "text-anchor": "end" }, String(Math.round((most * i) / 4 * 10) / 10)));
  }
  binned.forEach((bin, i) => {
    const h = ((bottom - top) * bin.count) / most;
    node.append(titled(svg("rect", {
      class: "bin", x: left + i * w + 1, y: bottom - h, width: Math.max(1, w - 2), height: h,
      "data-count": bin.count, "data-lo": String(bin.lo), "data-hi": String(bin.hi),
    }), `${bin.count} ${noun}${bin.count === 1 ? "" : "s"}: ${format(bin.lo)} to ${format(bin.hi)}`));
    if ((binned.length <= 6 || i % 2 === 0) && (i < binned.length - 1 || binned.length === 1)) {
      node.append(svg("text", { x: left + i * w, y: bottom + 14, "text-anchor": "start" }, format(bin.lo)));
    }
  });
  if (binned.length) node.append(svg("text", { x: right, y: bottom + 14, "text-anchor": "end" }, format(binned[binned.length - 1].hi)));
  node.append(svg("line", { class: "axis", x1: left, x2: right, y1: bottom, y2: bottom }));
  const table = dataTable(`the ${binned.length} bins`, ["from", "to", noun + "s"],
    binned.map((b) => [format(b.lo), format(b.hi), b.count]));
  return [node, table];
}

/** A rate on 0..100% with its interval: a bar from ``lo`` to ``hi``, a dot at ``value``. */
export function interval(value, lo, hi, label) {
  const left = 20, right = WIDTH - 20, mid = 26;
  const x = (v) => left + (right - left) * v;
  const node = chart(54, label);
  node.append(svg("rect", { class: "track", x: left, y: mid - 8, width: right - left, height: 16, rx: 3 }));
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    node.append(svg("text", { x: x(v), y: 50, "text-anchor": v === 0 ? "start" : v === 1 ? "end" : "middle" }, `${v * 100}%`));
  }
  if (lo != null && hi != null) {
    node.append(titled(svg("line", { class: "interval", x1: x(lo), x2: x(hi), y1: mid, y2: mid, "data-lo": String(lo), "data-hi": String(hi) }), label));
    for (const v of [lo, hi]) node.append(svg("line", { class: "interval", x1: x(v), x2: x(v), y1: mid - 7, y2: mid + 7 }));
  }
  if (value != null) node.append(titled(svg("circle", { class: "estimate", cx: x(value), cy: mid, r: 6, "data-value": String(value) }), label));
  return node;
}
