// A group's page (?group=NAME): the group's row, histograms of its runs' durations and costs,
// and, for an evaluation, its pass rate with the 95% interval and its cases.
//
// The runs come from the paged list API (`fieldSelector=spec.group=G`, every page); a server
// that predates selectors answers the plain `group=` filter, which is sent too, and the page
// keeps only the group's runs either way.
"use strict";

import { api, cell, crumbs, el, fill, getJSON, href, linkRow, money, percent, runSeconds, seconds, stamp } from "./console_api.js";
import { histogram, interval } from "./console_charts.js";
import { groupRow, runRow } from "./console_project.js";

const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);
const PAGE = 500, MAX_PAGES = 20; // at most 10,000 runs drawn
const SHOWN = 200; // rows in the table; the project page pages through the rest

async function groupRuns(name) {
  const runs = [];
  let token = null, pages = 0;
  do {
    const query = new URLSearchParams({ fieldSelector: `spec.group=${name}`, group: name, limit: String(PAGE) });
    if (token) query.set("continue", token);
    const page = await getJSON(`${api}/agentruns?${query}`);
    runs.push(...page.items.filter((run) => run.spec.group === name));
    token = (page.metadata || {}).continue || null;
    pages += 1;
  } while (token && pages < MAX_PAGES);
  return { runs, more: Boolean(token) };
}

function passRate(e) {
  const stats = (e.statistics || {}).passRate;
  const figure = document.getElementById("pass-rate-figure");
  if (stats && Array.isArray(stats.ci95)) {
    const [lo, hi] = stats.ci95;
    const text = `pass rate ${percent(stats.value)}, 95% interval ${percent(lo)} to ${percent(hi)}` +
      ` (standard error ${percent(stats.standardError)}, n ${stats.n}` +
      `${stats.clusteredBy ? `, clustered by ${stats.clusteredBy}` : ""})`;
    figure.replaceChildren(interval(stats.value, lo, hi, text), el("figcaption", { id: "pass-rate-interval" }, text));
  } else if (e.passRate != null) {
    const why = stats ? "fewer than two tasks scored" : "the server reports none";
    const text = `pass rate ${percent(e.passRate)} (no interval: ${why})`;
    figure.replaceChildren(interval(e.passRate, null, null, text), el("figcaption", { id: "pass-rate-interval" }, text));
  } else {
    figure.replaceChildren(el("figcaption", { className: "muted" }, "no case scored yet"));
  }
}

async function evaluation(name, group) {
  const s = group.status || {}, e = s.evaluation;
  document.getElementById("evaluation").hidden = !e;
  if (!e) return;
  const results = await getJSON(`${api}/agentgroups/${encodeURIComponent(name)}/results`);
  document.getElementById("evaluation-name").textContent = `${name} (${e.environment}, ${e.split}, seed ${e.seed})`;
  const phase = document.getElementById("evaluation-phase");
  phase.textContent = s.phase || ""; phase.className = `phase-${s.phase}`;
  const failures = Object.entries(e.unscoredReasons || {}).map(([state, n]) => `${state} ${n}`).join(", ");
  document.getElementById("evaluation-summary").textContent =
    `pass rate ${percent(e.passRate)}, mean reward ${e.meanReward == null ? "-" : e.meanReward.toFixed(3)}; ` +
    `${e.scored} scored, ${e.pending} pending, ${e.unscored} unscored` + (failures ? ` (${failures})` : "");
  passRate(e);
  fill("cases", results.items, (row, item) => {
    row.className = "run";
    linkRow(row, href({ run: item.run }));
    cell(row, item.repetition > 1 ? `${item.taskId} #${item.repetition}` : item.taskId);
    cell(row, item.run);
    const scored = ["Scored", "Pending", "Grading"].includes(item.state);
    cell(row, item.state, `state-${scored ? item.state : "unscored"}`);
    cell(row, item.verdict || "");
    cell(row, item.reward == null ? "" : item.reward);
    cell(row, item.evidence || item.reason || "");
  });
}

function histograms(runs, more) {
  const now = Date.now();
  const durations = runs.map((run) => ((run.status || {}).finishedAt ? runSeconds(run, now) : null)).filter((v) => v != null);
  const costs = runs.map((run) => Number(((run.status || {}).cost || {}).totalUSD || "0"));
  const unfinished = runs.length - durations.length;
  const note = (text) => el("figcaption", { className: "muted" }, text);
  const [dNode, dTable] = histogram(durations, seconds, "run", `durations of ${durations.length} finished runs`);
  document.getElementById("duration-histogram").replaceChildren(dNode,
    note(`${durations.length} finished run${durations.length === 1 ? "" : "s"}` +
      (unfinished ? `; ${unfinished} not finished (not drawn)` : "") + (more ? "; more runs than drawn" : "")), dTable);
  const [cNode, cTable] = histogram(costs, (v) => money(v < 0.01 ? v.toPrecision(2) : v.toFixed(4)), "run", `model cost of ${costs.length} runs`);
  document.getElementById("cost-histogram").replaceChildren(cNode,
    note(`${costs.length} run${costs.length === 1 ? "" : "s"}, model spend (what the caps count)`), cTable);
}

export function groupPage(name) {
  document.getElementById("group-page").hidden = false;
  document.getElementById("group-name").textContent = name;
  crumbs([`group ${name}`, null]);
  let timer = null;

  async function read() {
    const [group, { runs, more }] = await Promise.all([
      getJSON(`${api}/agentgroups/${encodeURIComponent(name)}`), groupRuns(name)]);
    const s = group.status || {};
    const phase = document.getElementById("group-phase");
    phase.textContent = s.phase || ""; phase.className = `phase-${s.phase}`;
    fill("group-row", [group], (row, g) => groupRow(row, g, false));
    histograms(runs, more);
    fill("group-runs", runs.slice(0, SHOWN), runRow);
    const count = document.getElementById("group-runs-count");
    count.replaceChildren(`${runs.length}${more ? "+" : ""} run${runs.length === 1 ? "" : "s"}`);
    if (runs.length > SHOWN) {
      count.append("; the first ", String(SHOWN), " shown, ", el("a", { href: href({ ingroup: name }) }, "page through all"));
    }
    await evaluation(name, group);
    stamp();
    if (TERMINAL.has(s.phase) && timer) { clearInterval(timer); timer = null; }
  }

  read().catch(console.error);
  timer = setInterval(() => read().catch(console.error), 3000);
}
