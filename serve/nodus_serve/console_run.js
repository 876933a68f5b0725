// A run's page (?run=NAME): a timeline of its steps, its spend over time against its cap, the
// transcript, its turns, answer and steps; live while the run goes on.
//
// Live: the run's events stream says when something changed and the page reads the run and its
// steps again; between two reads a step still running grows on the timeline by the server's
// clock (its `runningSince` plus `runningSeconds` when read, plus the time since), so a browser
// whose clock is off draws it right.
"use strict";

import { api, cell, crumbs, el, fill, followEvents, getJSON, href, money, ms, seconds, stamp } from "./console_api.js";
import { costChart, dataTable, span, timeline } from "./console_charts.js";
import { transcript } from "./console_transcript.js";

const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);

// A BYOK turn is billed nothing; it shows its list cost, or says its model has none.
function turnCost(turn, byok) {
  if (!byok) return money(turn.costUSD);
  if (turn.listCostUSD != null) return `${money(turn.costUSD)} (list ${money(turn.listCostUSD)})`;
  return turn.unpricedModels ? `${money(turn.costUSD)} (no list price)` : money(turn.costUSD);
}

// A step in progress says what it does and, while the run is Running, for how long.
function stepSummary(step) {
  const summary = step.summary || "";
  if (step.state !== "Started" || step.runningSeconds == null) return summary;
  const running = `running ${seconds(step.runningSeconds)}`;
  return summary ? `${summary} (${running})` : running;
}

/** Dollars as integer billionths, so a sum of decimal strings stays exact enough to compare. */
const NANO = 1e9;
function nano(usd) { const v = Number(usd); return Number.isFinite(v) ? Math.round(v * NANO) : 0; }
function dollars(n) { return (n / NANO).toFixed(9).replace(/\.?0+$/, "") || "0"; }

/** The timeline's bars: each step's start and end in ms; a running step has no end. */
function bars(steps) {
  return steps.filter((step) => step.startedAt).map((step) => {
    const start = ms(step.startedAt);
    const running = step.state === "Started";
    return {
      id: step.id, kind: step.kind, state: step.state, summary: stepSummary(step), start,
      // A Started step of a run that is not Running (parked, ended) is interrupted: no bar grows.
      end: running ? (step.runningSeconds != null ? null : start) : (ms(step.finishedAt) ?? start),
    };
  });
}

/** Spend over time: the steps that cost something, where they ended, summed in order. */
function spend(steps) {
  const costly = steps.filter((st) => nano(st.costUSD) > 0 && (st.finishedAt || st.startedAt))
    .map((st) => ({ step: st.id, t: ms(st.finishedAt || st.startedAt), added: st.costUSD }))
    .sort((a, b) => a.t - b.t);
  let total = 0;
  return costly.map((point) => {
    total += nano(point.added);
    return { ...point, usd: total / NANO, label: dollars(total) };
  });
}

export function runPage(name) {
  const path = `${api}/agentruns/${encodeURIComponent(name)}`;
  const open = new Set();
  let run = null, steps = [], readAt = 0, serverAt = null, answerBytes = null;
  document.getElementById("run-page").hidden = false;
  document.getElementById("detail-name").textContent = name;

  // The server's clock now: from a running step's reading, plus the time since it was read.
  function now() { return serverAt == null ? null : serverAt + (performance.now() - readAt); }

  function drawCharts() {
    const items = bars(steps), clock = now();
    const range = span(items, clock);
    const live = items.filter((b) => b.end == null).length;
    const legend = el("div", { className: "legend" },
      ...["route", "model", "command", "sandbox"].map((k) => el("span", {}, el("i", { style: `background: var(--${k})` }), k)),
      live ? el("span", {}, `${live} running`) : null);
    document.getElementById("timeline").replaceChildren(legend, timeline(items, range, clock),
      dataTable(`the ${items.length} step${items.length === 1 ? "" : "s"}`, ["step", "kind", "state", "started", "took"],
        items.map((b) => [b.id, b.kind, b.state, new Date(b.start).toISOString(),
          seconds(((b.end ?? clock ?? b.start) - b.start) / 1000)])));
    const points = spend(steps), cost = (run.status || {}).cost || {};
    document.getElementById("cost-chart").replaceChildren(costChart(points, cost.limitUSD ?? null, range),
      dataTable(`the ${points.length} step${points.length === 1 ? "" : "s"} that cost something`, ["step", "ended", "cost", "in all"],
        points.map((p) => [p.step, new Date(p.t).toISOString(), money(p.added), money(p.label)])));
  }

  function draw() {
    const s = run.status || {}, cost = s.cost || {};
    crumbs(...(run.spec.group ? [[`group ${run.spec.group}`, href({ group: run.spec.group })]] : []), [`run ${name}`, null]);
    const phase = document.getElementById("detail-phase");
    phase.textContent = `${s.phase || ""}${s.reason ? " (" + s.reason + ")" : ""}`;
    phase.className = `phase-${s.phase}`;
    // Model spend (what the caps count) and sandbox compute apart.
    document.getElementById("detail-cost").textContent =
      `agent ${run.spec.agent}; cost: model ${money(cost.modelUSD ?? cost.totalUSD)}` +
      `${cost.limitUSD ? ` of a ${money(cost.limitUSD)} cap` : ""}, sandbox ${money(cost.sandboxUSD ?? "0")}, ` +
      `billed ${money(cost.billedUSD ?? cost.totalUSD)}`;
    drawCharts();
    const byok = "listUSD" in cost;
    fill("turns", s.turns || [], (row, turn) => {
      cell(row, turn.index); cell(row, turn.model); cell(row, turn.routing);
      cell(row, `${turn.inputTokens} / ${turn.outputTokens}`); cell(row, turn.toolCalls); cell(row, turnCost(turn, byok));
    });
    fill("steps", steps, (row, step) => {
      cell(row, step.id); cell(row, step.kind);
      cell(row, step.state, `phase-${step.state === "Completed" ? "Succeeded" : step.state === "Failed" ? "Failed" : "Running"}`);
      cell(row, step.attempts); cell(row, stepSummary(step)); cell(row, step.startedAt || "");
      const took = step.finishedAt && step.state !== "Started" ? (ms(step.finishedAt) - ms(step.startedAt)) / 1000 : null;
      cell(row, seconds(took), "num"); cell(row, step.costUSD && step.costUSD !== "0" ? money(step.costUSD) : "", "num");
    });
    const onToggle = (id, isOpen) => { if (isOpen) open.add(id); else open.delete(id); };
    document.getElementById("transcript").replaceChildren(...transcript(run, steps, open, onToggle));
  }

  async function read() {
    const [fresh, listed] = await Promise.all([getJSON(path), getJSON(`${path}/steps`)]);
    run = fresh; steps = listed.items; readAt = performance.now();
    const running = steps.find((st) => st.state === "Started" && st.runningSeconds != null && st.runningSince);
    serverAt = running ? ms(running.runningSince) + running.runningSeconds * 1000 : null;
    draw();
    stamp();
    const answer = (run.status || {}).answer;
    if (answer && answer.bytes !== answerBytes) {
      const got = await getJSON(`${path}/answer`);
      answerBytes = answer.bytes;
      const pre = document.getElementById("answer");
      pre.textContent = got.answer; pre.className = "";
    }
  }

  read().catch(console.error);
  // A running step's bar grows between reads.
  setInterval(() => { if (run && serverAt != null && !TERMINAL.has((run.status || {}).phase)) drawCharts(); }, 500);
  const stream = new AbortController();
  let pending = null;
  followEvents(`${path}/events`, stream.signal, (kind) => {
    if (kind === "end") { read().catch(console.error); return; }
    clearTimeout(pending);
    pending = setTimeout(() => read().catch(console.error), 200);
  }).catch(console.error);
}
