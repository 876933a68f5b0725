// The project page (?project=P): its groups, and its runs a page at a time, filtered.
//
// The runs come from the list API: `labelSelector`, `fieldSelector` (status.phase, spec.agent,
// spec.group), `limit` and the `continue` token of the page before. The filters and the page's
// token are in the address, so a view is a link; the tokens of the pages before this one are a
// stack in the history entry, so Previous (and the browser's Back) walk back. A selector the
// server refuses shows its message under the filters. A page without a `continue` token is the
// last one, so a server that ignores the parameters shows every run on one page.
"use strict";

import { api, ApiError, cell, crumbs, fill, getJSON, href, linkRow, money, params, runSeconds, seconds, stamp } from "./console_api.js";

const FILTERS = { phase: "f-phase", agent: "f-agent", ingroup: "f-group", labels: "f-labels", limit: "f-limit" };

/** One group as a row of the groups table; it opens the group's page. */
export function groupRow(row, group, link = true) {
  const s = group.status || {}, counts = s.counts || {}, cost = s.cost || {};
  cell(row, group.metadata.name);
  cell(row, s.phase, `phase-${s.phase}`);
  cell(row, `${counts.succeeded || 0}/${counts.total || 0}`);
  cell(row, (counts.active || 0) + (counts.waiting || 0));
  cell(row, counts.queued || 0);
  cell(row, cost.limitUSD ? `${money(cost.totalUSD)} of ${money(cost.limitUSD)}` : money(cost.totalUSD));
  const e = s.evaluation;
  cell(row, e ? `${e.passed}/${e.scored} pass` + (e.unscored ? `, ${e.unscored} unscored` : "") +
                (e.pending ? `, ${e.pending} pending` : "") : "");
  if (link) {
    row.className = "group" + (e ? " evaluation" : "");
    linkRow(row, href({ group: group.metadata.name }));
  }
}

/** One run as a row of a runs table; it opens the run's page. */
export function runRow(row, run) {
  const s = run.status || {}, turns = s.turns || [];
  row.className = "run";
  row.dataset.name = run.metadata.name;
  linkRow(row, href({ run: run.metadata.name }));
  cell(row, run.metadata.name);
  cell(row, run.spec.agent);
  cell(row, s.phase, `phase-${s.phase}`);
  cell(row, s.reason);
  cell(row, turns.length ? turns[turns.length - 1].model : "");
  cell(row, money((s.cost || {}).totalUSD));
  cell(row, seconds(runSeconds(run, Date.now())), "num");
}

/** The list API's query for the filters in ``state`` and a page's ``token``. */
export function listQuery(state, token) {
  const query = new URLSearchParams({ limit: state.limit || "50" });
  const fields = [];
  if (state.phase) fields.push(`status.phase=${state.phase}`);
  if (state.agent) fields.push(`spec.agent=${state.agent}`);
  if (state.ingroup) fields.push(`spec.group=${state.ingroup}`);
  if (fields.length) query.set("fieldSelector", fields.join(","));
  if (state.labels) query.set("labelSelector", state.labels);
  if (token) query.set("continue", token);
  return query;
}

function options(selectId, names, chosen) {
  const select = document.getElementById(selectId);
  const want = ["", ...names];
  if (chosen && !want.includes(chosen)) want.push(chosen);
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") !== want.join("\n")) {
    select.replaceChildren(...want.map((name) => new Option(name || "any", name)));
  }
  select.value = chosen || "";
}

async function refreshBudget() {
  const budgets = await getJSON(`${api}/budgets`);
  const budget = budgets.items[0], span = document.getElementById("budget");
  if (!budget) { span.textContent = ""; return; }
  const s = budget.status || {}, period = budget.spec.period || "total";
  span.textContent = `budget ${money(s.spentUSD)} spent of ${money(budget.spec.maxCostUSD)}` +
    `${period === "total" ? "" : " this " + period}, ${money(s.leftUSD)} left` +
    (Number(s.reservedUSD) > 0 ? ` (${money(s.reservedUSD)} held)` : "");
}
export { refreshBudget };

export function projectPage() {
  document.getElementById("project-page").hidden = false;
  crumbs();
  const state = {};
  for (const key of Object.keys(FILTERS)) state[key] = params.get(key) || "";
  let token = params.get("continue") || null;
  let stack = (history.state && history.state.stack) || [];
  let agents = [], groups = [];

  function address(nextToken) {
    const next = new URLSearchParams(href({ ...state, continue: nextToken }).slice(1));
    if (next.get("limit") === "50") next.delete("limit");
    return `?${next}`;
  }

  function formToState() {
    for (const [key, id] of Object.entries(FILTERS)) state[key] = document.getElementById(id).value.trim();
  }

  function stateToForm() {
    options("f-agent", agents, state.agent);
    options("f-group", groups, state.ingroup);
    document.getElementById("f-phase").value = state.phase;
    document.getElementById("f-labels").value = state.labels;
    document.getElementById("f-limit").value = state.limit || "50";
  }

  async function readRuns() {
    const error = document.getElementById("runs-error");
    let page;
    try {
      page = await getJSON(`${api}/agentruns?${listQuery(state, token)}`);
    } catch (failure) {
      if (!(failure instanceof ApiError)) throw failure;
      error.textContent = failure.message; error.hidden = false;
      fill("runs", [], runRow);
      document.getElementById("page-next").disabled = true;
      document.getElementById("page-prev").disabled = stack.length === 0 && !token;
      document.getElementById("page-info").textContent = "";
      return;
    }
    error.hidden = true; error.textContent = "";
    fill("runs", page.items, runRow);
    const meta = page.metadata || {}, limit = Number(state.limit || "50");
    const next = meta.continue || null, first = stack.length * limit + 1;
    const left = meta.remainingItemCount;
    document.getElementById("page-info").textContent = page.items.length
      ? `runs ${first} to ${first + page.items.length - 1}` + (left != null ? ` of ${first + page.items.length - 1 + left}` : "") + `, page ${stack.length + 1}`
      : `no runs on page ${stack.length + 1}`;
    const nextButton = document.getElementById("page-next"), prevButton = document.getElementById("page-prev");
    nextButton.disabled = !next;
    nextButton.onclick = () => go(next, [...stack, token || ""]);
    prevButton.disabled = !token;
    prevButton.onclick = () => go(stack.length ? stack[stack.length - 1] || null : null, stack.slice(0, -1));
  }

  async function readAll() {
    refreshBudget().catch(console.error);
    const [groupList, agentList] = await Promise.all([getJSON(`${api}/agentgroups`), getJSON(`${api}/agents`)]);
    groups = groupList.items.map((g) => g.metadata.name);
    agents = agentList.items.map((a) => a.metadata.name);
    fill("groups", groupList.items, (row, group) => groupRow(row, group));
    if (document.activeElement == null || !document.getElementById("filters").contains(document.activeElement)) stateToForm();
    await readRuns();
    stamp();
  }

  function go(nextToken, nextStack) {
    token = nextToken; stack = nextStack;
    history.pushState({ stack }, "", address(token));
    readRuns().catch(console.error);
  }

  document.getElementById("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    formToState();
    go(null, []);
  });
  document.getElementById("f-clear").addEventListener("click", () => {
    for (const key of Object.keys(FILTERS)) state[key] = "";
    stateToForm();
    go(null, []);
  });
  for (const id of ["f-phase", "f-agent", "f-group", "f-limit"]) {
    document.getElementById(id).addEventListener("change", () => { formToState(); go(null, []); });
  }
  window.addEventListener("popstate", () => {
    const now = new URLSearchParams(location.search);
    for (const key of Object.keys(FILTERS)) state[key] = now.get(key) || "";
    token = now.get("continue") || null;
    stack = (history.state && history.state.stack) || [];
    stateToForm();
    readRuns().catch(console.error);
  });

  stateToForm();
  readAll().catch(console.error);
  setInterval(() => readAll().catch(console.error), 2000);
}
