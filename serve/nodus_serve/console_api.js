// The console's access to the REST API and the small helpers every page uses.
//
// Everything is read from the API and put on the page as text (never as HTML): run names,
// answers, model replies and command output are data, not markup.
"use strict";

export const params = new URLSearchParams(location.search);
export const project = params.get("project") || "default";
export const api = `/v1/projects/${encodeURIComponent(project)}`;

// The API token arrives in the link's fragment (#token=...), which browsers never send to a
// server, so it reaches no log; it is kept for this tab only and removed from the address bar.
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) {
  sessionStorage.setItem("nodus-token", fragment.get("token"));
  history.replaceState(null, "", `${location.pathname}${location.search}`);
}

export function authHeaders(extra) {
  const token = sessionStorage.getItem("nodus-token");
  return token ? { ...extra, Authorization: `Bearer ${token}` } : { ...extra };
}

export function askForToken(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("nodus-token", document.getElementById("token").value.trim());
  location.reload();
});

/** An API refusal: the server's {code, message, details}, shown as it is. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: authHeaders({ Accept: "application/json" }) });
  if (response.status === 401) askForToken("the token was refused (unknown, revoked or expired)");
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    throw new ApiError(response.status, body);
  }
  return response.json();
}

/** A link to another page of the console, keeping the project. */
export function href(extra) {
  const next = new URLSearchParams({ project });
  for (const [key, value] of Object.entries(extra)) if (value) next.set(key, value);
  return `?${next}`;
}

// Server-sent events read with fetch, because EventSource cannot send the Authorization header.
export async function followEvents(path, signal, onEvent) {
  let lastId = null;
  while (!signal.aborted) {
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (lastId) headers["Last-Event-ID"] = lastId;
    const response = await fetch(path, { headers, signal });
    if (!response.ok || !response.body) throw new Error(`${path}: HTTP ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "", kind = "message";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, "");
        buffer = buffer.slice(newline + 1);
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("id: ")) lastId = line.slice(4);
        else if (line === "") {
          onEvent(kind);
          if (kind === "end") return;
          kind = "message";
        }
      }
    }
  }
}

// -- the DOM, as text -----------------------------------------------------------------------

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value == null) continue;
    if (key === "className") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child == null) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

export function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text == null ? "" : String(text);
  if (className) td.className = className;
  return td;
}

export function fill(tbodyId, items, render) {
  const body = document.getElementById(tbodyId);
  body.replaceChildren();
  for (const item of items) render(body.insertRow(), item);
  const empty = document.getElementById(`${tbodyId}-empty`);
  if (empty) empty.hidden = items.length > 0;
}

/** A table row that opens another page: a click, or Enter when it has the focus. */
export function linkRow(row, target) {
  row.tabIndex = 0;
  row.onclick = () => { location.href = target; };
  row.onkeydown = (event) => { if (event.key === "Enter") location.href = target; };
}

// -- numbers and times ----------------------------------------------------------------------

export function money(value) { return value == null ? "" : `$${value}`; }

export function percent(value) { return value == null ? "-" : `${(value * 100).toFixed(1)}%`; }

/** Milliseconds since the epoch of an API timestamp (ISO 8601, microseconds, Z), or null. */
export function ms(text) {
  if (!text) return null;
  const value = Date.parse(text);
  return Number.isNaN(value) ? null : value;
}

/** A duration in seconds, as people read it: 0.42 s, 12.3 s, 4m05s, 2h03m. */
export function seconds(value) {
  if (value == null || Number.isNaN(value)) return "";
  if (value < 10) return `${value.toFixed(2)} s`;
  if (value < 60) return `${value.toFixed(1)} s`;
  const s = Math.floor(value);
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
}

/** A run's wall time: from its start to its end (or to now while it runs), in seconds. */
export function runSeconds(run, now) {
  const s = run.status || {};
  const start = ms(s.startedAt), end = ms(s.finishedAt) ?? (s.phase === "Running" ? now : null);
  return start == null || end == null ? null : Math.max(0, (end - start) / 1000);
}

export function stamp() {
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

/** The crumbs in the header: project > group > run, each a link. */
export function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(el("a", { href: href({}) }, "runs"));
  for (const [label, target] of parts) {
    nav.append(" / ", target ? el("a", { href: target }, label) : el("b", {}, label));
  }
}
