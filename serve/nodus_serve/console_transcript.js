// A run's transcript, read from its steps: the prompt of each turn, each model reply, each
// command with its output folded (a <details> a person opens), and the routing and sandbox as
// one-line notes. The steps listing holds what the journal recorded for each step (`detail`:
// a command's text when it started, its result with the output when it ended, a model call's
// reply), already redacted by the run before it was journaled.
"use strict";

import { el, seconds } from "./console_api.js";

function turnOf(id) {
  const match = /^turn-(\d+)\//.exec(id || "");
  return match ? Number(match[1]) : null;
}

function replyText(result) {
  const blocks = Array.isArray(result && result.content) ? result.content : [];
  return blocks.filter((b) => b && b.type === "text" && b.text).map((b) => b.text).join("\n\n");
}

function asked(result) {
  const blocks = Array.isArray(result && result.content) ? result.content : [];
  return blocks.filter((b) => b && b.type === "tool_use").length;
}

function ended(result) {
  if (result.cancelled) return ["killed: cancelled", "exit-bad"];
  if (result.timed_out) return [`killed: timeout after ${seconds(result.duration_seconds)}`, "exit-bad"];
  if (result.exit_code == null) return [`killed: ${result.limit || "stopped"}`, "exit-bad"];
  return [`exit ${result.exit_code}${result.limit ? ` (${result.limit})` : ""}`, result.exit_code === 0 ? "exit-ok" : "exit-bad"];
}

function entry(className, who, ...children) {
  return el("li", { className }, el("div", { className: "who" }, who), ...children);
}

function prompt(turn, step, run) {
  const result = (step.detail || {}).result;
  let text = result && typeof result.payload === "string" ? result.payload : null;
  if (text == null) {
    const turns = (run.status || {}).turns || [];
    text = turn === 1 ? run.spec.input : (turns[turn - 1] || {}).prompt;
  }
  return entry("prompt", `prompt, turn ${turn}`, el("div", { className: "text" }, text || "(not kept)"));
}

function command(step, open, onToggle) {
  const detail = step.detail || {}, result = detail.result;
  const text = detail.command || (step.summary || "").replace(/ -> .*$/, "");
  const summary = el("summary", {}, `$ ${String(text).replace(/^\$ /, "")}`);
  let body;
  if (step.state === "Started") {
    summary.append(el("span", { className: "muted" }, step.runningSeconds != null ? `  running ${seconds(step.runningSeconds)}` : "  interrupted"));
    body = el("pre", { className: "output muted" }, "(no output yet)");
  } else if (result && typeof result === "object") {
    const [how, cls] = ended(result);
    summary.append("  ", el("span", { className: cls }, how), el("span", { className: "muted" }, ` · ${seconds(result.duration_seconds)}`));
    body = el("pre", { className: "output" }, result.output ? result.output : "(no output)");
    if (result.truncated) body.append("\n… (output truncated at the sandbox's cap)");
  } else {
    body = el("pre", { className: "output muted" }, step.summary || "(output not kept)");
  }
  const details = el("details", { "data-step": step.id }, summary, body);
  details.open = open.has(step.id);
  details.addEventListener("toggle", () => onToggle(step.id, details.open));
  return entry("command", "command", details);
}

function reply(step) {
  const detail = step.detail || {}, result = detail.result;
  if (step.state === "Started") {
    return entry("reply", "model", el("div", { className: "muted" }, `${step.summary || "calling the model"}…`));
  }
  if (step.state === "Failed") {
    return entry("reply", "model", el("div", { className: "exit-bad" }, (detail.error || {}).message || step.summary || "the call failed"));
  }
  const text = replyText(result), commands = asked(result);
  const parts = [];
  if (text) parts.push(el("div", { className: "text" }, text));
  if (commands) parts.push(el("div", { className: "muted" }, `asks to run ${commands} command${commands === 1 ? "" : "s"}`));
  if (!parts.length) parts.push(el("div", { className: "muted" }, result ? "(no text)" : "(reply not kept)"));
  const meta = el("div", { className: "muted" }, step.summary || "");
  return entry("reply", `model reply${result && result.model ? `, ${result.model}` : ""}`, ...parts, meta);
}

/**
 * The transcript's entries (<li>) from the run and its steps, in the order the steps began.
 * ``open``: the ids of the commands whose output is unfolded (kept across live refreshes);
 * ``onToggle(id, open)`` is told when a person folds or unfolds one.
 */
export function transcript(run, steps, open, onToggle) {
  const items = [];
  const s = run.status || {};
  if (s.payloadsExpiredAt) {
    items.push(entry("note", "retention", `the run's payloads (prompt, replies, outputs) were deleted at ${s.payloadsExpiredAt}`));
  }
  let seen = 0;
  for (const step of steps) {
    const turn = turnOf(step.id);
    if (turn != null && turn > seen) {
      seen = turn;
      items.push(prompt(turn, step, run));
      if (step.kind === "inbox") continue; // its message is the prompt just shown
    }
    if (step.kind === "model") items.push(reply(step));
    else if (step.kind === "command") items.push(command(step, open, onToggle));
    else if (step.kind === "charge") continue; // billing records, not conversation
    else items.push(entry("note", step.kind, step.summary || step.id));
  }
  if (!seen && run.spec && run.spec.input && !steps.some((st) => st.kind === "step")) {
    items.unshift(entry("prompt", "prompt", el("div", { className: "text" }, run.spec.input)));
  }
  return items;
}
