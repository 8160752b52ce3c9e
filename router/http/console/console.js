// The operator console: plain DOM, no framework, no build step. It reads the REST API of
// the http listener it was served by (docs/http.md) with the credentials typed at login.
"use strict";

const API = new URL("../", document.baseURI);  // the console lives at <api>/console/
const STATS_EVERY_MS = 2000;
const LISTS_EVERY_MS = 5000;
const CHART_POINTS = 90;
const RETAINED_PAGE = 50;
const LIST_PAGE = 200;  // sessions and subscriptions shown
const INCIDENTS_SHOWN = 50;

const $ = (id) => document.getElementById(id);

const state = {
  auth: null,          // the Authorization header value, or null for anonymous
  who: "",             // what the header shows
  loggedIn: false,
  timers: [],
  lastStats: null,     // {at, received, delivered}
  rates: [],           // [{received, delivered}] per poll, oldest first
  retainedQuery: {},    // the pattern of the listed pages
  retainedCursor: null,
  retainedRequests: 0,  // numbers the retained queries: an answer to an older one is dropped
  problems: {},        // source -> message, see report()
};

// --- talking to the API --------------------------------------------------------------

class ApiError extends Error {
  constructor(status, uri, message) {
    super(message);
    this.status = status;
    this.uri = uri;
  }
}

async function api(method, path, params) {
  const url = new URL(path, API);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null) url.searchParams.set(key, value);
  }
  const headers = {Accept: "application/json"};
  if (state.auth) headers.Authorization = state.auth;
  let response;
  try {
    response = await fetch(url, {method, headers, cache: "no-store"});
  } catch (error) {
    throw new ApiError(0, "", `The router did not answer (${error.message}).`);
  }
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (error) { body = null; }
  if (!response.ok) {
    const uri = (body && body.error) || "";
    const detail = (body && body.message) || text.slice(0, 200) || response.statusText;
    if (response.status === 401 && state.loggedIn) {  // a revoked token, a changed ticket
      logOut();
      report("login", `The router no longer accepts these credentials (401 ${uri}): log in again.`);
    }
    throw new ApiError(response.status, uri, detail);
  }
  return body;
}

function explain(error, what) {
  if (!(error instanceof ApiError)) return `${what}: ${error.message}`;
  if (error.status === 401) {
    return `${what}: not logged in or the credentials were refused (401${
      error.uri ? " " + error.uri : ""}). Check the principal and ticket, or the token.`;
  }
  if (error.status === 403) {
    return `${what}: ${state.who || "anonymous"} may not do this (403${
      error.uri ? " " + error.uri : ""}). ${error.message}`;
  }
  if (error.status === 0) return `${what}: ${error.message}`;
  return `${what}: ${error.status} ${error.uri} ${error.message}`.trim();
}

// What went wrong, per source ("login", "stats", "sessions", ...): every current problem
// is shown at once, and a source clears its own when it next succeeds. Once logged out,
// only the login speaks.
function report(source, message) {
  if (!state.loggedIn && source !== "login") return;
  if (message) state.problems[source] = message;
  else delete state.problems[source];
  const box = $("error");
  box.replaceChildren(...Object.values(state.problems).map((text) => {
    const line = document.createElement("p");
    line.textContent = text;
    return line;
  }));
  box.hidden = !box.childNodes.length;
}

// --- login ---------------------------------------------------------------------------

function basic(authid, ticket) {
  const bytes = new TextEncoder().encode(`${authid}:${ticket}`);
  return "Basic " + btoa(String.fromCharCode(...bytes));
}

async function logIn(auth, who) {
  if (state.loggedIn) return;
  state.auth = auth;
  state.who = who;
  let refused = "";
  const buttons = [$("login-submit"), $("login-anonymous")];
  buttons.forEach((b) => { b.disabled = true; });  // one login at a time
  try {
    await api("GET", "stats");
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 403) {
      state.auth = null;
      report("login", explain(error, "Login"));
      return;
    }
    refused = explain(error, "Stats");  // logged in, but this role may not read the figures
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
  sessionStorage.setItem("console.login", JSON.stringify({auth, who}));
  report("login", "");
  enterConsole();
  report("stats", refused);
}

function enterConsole() {
  state.loggedIn = true;
  $("login").hidden = true;
  $("console").hidden = false;
  $("logout").hidden = false;
  $("identity").textContent = state.who ? `as ${state.who}` : "anonymous";
  refreshStats();
  refreshLists();
  loadRetained();
  state.timers.push(setInterval(refreshStats, STATS_EVERY_MS));
  state.timers.push(setInterval(refreshLists, LISTS_EVERY_MS));
}

function logOut() {
  sessionStorage.removeItem("console.login");
  state.timers.forEach(clearInterval);
  Object.assign(state, {auth: null, who: "", loggedIn: false, timers: [], lastStats: null,
                        rates: [], problems: {}});
  report("login", "");
  $("console").hidden = true;
  $("logout").hidden = true;
  $("identity").textContent = "";
  $("login").hidden = false;
}

function setUpLogin() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const authid = $("login-authid").value.trim();
    const ticket = $("login-ticket").value;
    const token = $("login-token").value.trim();
    if (token) logIn(`Bearer ${token}`, "token");
    else if (authid) logIn(basic(authid, ticket), authid);
    else report("login", "Type a principal and its ticket, or a token, or continue anonymously.");
  });
  $("login-anonymous").addEventListener("click", () => logIn(null, ""));
  $("logout").addEventListener("click", logOut);
  const saved = sessionStorage.getItem("console.login");
  if (saved) {
    const {auth, who} = JSON.parse(saved);
    logIn(auth, who);
  } else {
    $("login").hidden = false;
  }
}

// --- DOM helpers ---------------------------------------------------------------------

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (className) td.className = className;
  return td;
}

function fillRows(tbody, items, makeRow, emptyText, columns) {
  tbody.replaceChildren(...items.map(makeRow));
  if (!items.length) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty");
    td.colSpan = columns;
    tr.append(td);
    tbody.append(tr);
  }
}

function button(label, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

// --- stats and the rate chart ------------------------------------------------------

async function refreshStats() {
  if (document.hidden || !state.loggedIn) return;
  let stats;
  try {
    stats = await api("GET", "stats");
  } catch (error) {
    report("stats", explain(error, "Stats"));
    return;
  }
  report("stats", "");
  const now = performance.now();
  const totals = {received: sum(stats.received), delivered: sum(stats.delivered)};
  if (state.lastStats) {
    const seconds = (now - state.lastStats.at) / 1000;
    state.rates.push({
      received: Math.max(0, totals.received - state.lastStats.received) / seconds,
      delivered: Math.max(0, totals.delivered - state.lastStats.delivered) / seconds,
    });
    if (state.rates.length > CHART_POINTS) state.rates.shift();
  }
  state.lastStats = {at: now, ...totals};
  drawChart();
}

function sum(perProtocol) {
  // /stats counts messages per protocol family: {"wamp": 120, "mqtt": 48, ...}
  return Object.values(perProtocol || {}).reduce((total, n) => total + n, 0);
}

function drawChart() {
  const canvas = $("rate-chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const style = getComputedStyle(document.documentElement);
  const left = 48, bottom = height - 18, top = 8, right = width - 8;
  // at least 4, so that the four grid steps of a quiet realm are whole messages per second
  const peak = Math.max(4, ...state.rates.flatMap((r) => [r.received, r.delivered]));
  const scale = niceCeiling(peak);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = style.getPropertyValue("--muted");
  ctx.strokeStyle = style.getPropertyValue("--line");
  ctx.lineWidth = 1;
  for (let step = 0; step <= 4; step += 1) {
    const y = bottom - (bottom - top) * step / 4;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(right, y);
    ctx.stroke();
    ctx.fillText(shortNumber(scale * step / 4), 4, y + 4);
  }
  const seconds = CHART_POINTS * STATS_EVERY_MS / 1000;
  ctx.fillText(`last ${seconds / 60} min`, left, height - 4);
  for (const [key, color] of [["received", "--in"], ["delivered", "--out"]]) {
    ctx.strokeStyle = style.getPropertyValue(color);
    ctx.lineWidth = 2;
    ctx.beginPath();
    state.rates.forEach((rate, index) => {
      const x = right - (state.rates.length - 1 - index) * (right - left) / (CHART_POINTS - 1);
      const y = bottom - (bottom - top) * rate[key] / scale;
      if (index === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
  const last = state.rates[state.rates.length - 1];
  $("rate-now").textContent = last
    ? `now ${shortNumber(last.received)} in / ${shortNumber(last.delivered)} out` : "";
}

function niceCeiling(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 1.5, 2, 3, 4, 5, 6, 8, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function shortNumber(value) {
  if (value >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (value >= 1e3) return `${(value / 1e3).toFixed(1)}k`;
  return value >= 10 ? value.toFixed(0) : value.toFixed(1).replace(/\.0$/, "");
}

// --- sessions, subscriptions, incidents ---------------------------------------------

async function refreshLists() {
  if (document.hidden || !state.loggedIn) return;
  await Promise.all([[loadSessions, "Sessions"], [loadSubscriptions, "Subscriptions"],
                     [loadIncidents, "Incidents"]].map(([load, what]) => load().then(
    () => report(what, ""), (error) => report(what, explain(error, what)))));
}

async function loadSessions() {
  const listing = await api("GET", "sessions", {limit: LIST_PAGE});
  const sessions = listing.sessions;
  $("session-count").textContent = listing.total;
  $("protocol-counts").replaceChildren(...Object.entries(listing.by_protocol).sort().map(([name, n]) => {
    const li = document.createElement("li");
    li.dataset.protocol = name;
    li.textContent = name;
    const b = document.createElement("b");
    b.textContent = n;
    li.append(b);
    return li;
  }));
  fillRows($("session-rows"), sessions, (session) => {
    const tr = document.createElement("tr");
    tr.dataset.session = session.session;
    const kick = button("Kick", "danger small", () => kickSession(session));
    const actions = cell("", "actions");
    actions.append(kick);
    tr.append(cell(session.session), cell(session.protocol), cell(session.authid),
              cell(session.authrole), cell((session.transport || {}).peer),
              cell(session.subscriptions), actions);
    return tr;
  }, "no sessions", 7);
  $("session-more").textContent = listing.total > sessions.length
    ? `showing ${sessions.length} of ${listing.total}` : "";
}

async function kickSession(session) {
  if (!confirm(`Close session ${session.session} (${session.authid || "anonymous"}, ${
    session.protocol})?`)) return;
  try {
    await api("DELETE", `sessions/${session.session}`);
    report("kick", "");
  } catch (error) {
    report("kick", explain(error, "Kick"));
  }
  refreshLists();
}

async function loadSubscriptions() {
  const listing = await api("GET", "subscriptions", {limit: LIST_PAGE});
  const subscriptions = listing.subscriptions;
  $("subscription-count").textContent = listing.total;
  fillRows($("subscription-rows"), subscriptions, (subscription) => {
    const tr = document.createElement("tr");
    tr.append(cell(subscription.uri, "topic"), cell(subscription.match),
              cell(subscription.subscribers.length));
    return tr;
  }, "no subscriptions", 3);
}

async function loadIncidents() {
  const incidents = (await api("GET", "incidents", {limit: INCIDENTS_SHOWN})).recent;
  fillRows($("incident-rows"), incidents, (incident) => {
    const tr = document.createElement("tr");
    tr.append(cell(new Date(incident.time).toLocaleTimeString()), cell(incident.reason),
              cell(incident.protocol), cell(incident.count), cell(incident.detail, "detail"));
    return tr;
  }, "none since start", 5);
}

// --- the retained browser ------------------------------------------------------------

async function loadRetained(more) {
  // More goes on with the query of the first page, whatever the form says meanwhile; an
  // empty prefix is every topic the principal may see
  if (!more) state.retainedQuery = {[$("retained-mode").value]: $("retained-pattern").value.trim()};
  const params = {...state.retainedQuery, limit: RETAINED_PAGE};
  if (more) params.cursor = state.retainedCursor;
  const request = ++state.retainedRequests;
  let page;
  try {
    page = await api("GET", "retained", params);
  } catch (error) {
    if (request === state.retainedRequests) report("retained", explain(error, "Retained"));
    return;
  }
  if (request !== state.retainedRequests) return;  // a later query's answer is the one to show
  report("retained", "");
  if (more) $("retained-rows").append(...page.topics.map(retainedRow));
  else fillRows($("retained-rows"), page.topics, retainedRow, "no retained topic here", 4);
  state.retainedCursor = page.next || null;
  $("retained-more").hidden = !state.retainedCursor;
  $("retained-count").textContent =
    $("retained-rows").querySelectorAll("tr[data-topic]").length + (page.next ? "+" : "");
}

function retainedRow(event) {
  const tr = document.createElement("tr");
  tr.dataset.topic = event.topic;
  const actions = cell("", "actions");
  actions.append(button("View", "secondary small", () => viewRetained(event)),
                 button("Delete", "danger small", () => deleteRetained(event, tr)));
  tr.append(cell(event.topic, "topic"), cell(decode(event).kind),
            cell(event.timestamp ? new Date(event.timestamp).toLocaleString() : "", "when"),
            actions);
  return tr;
}

function viewRetained(event) {
  const {kind, text} = decode(event);
  $("retained-view-topic").textContent = event.topic;
  $("retained-view-kind").textContent = kind;
  $("retained-view-body").textContent = text;
  $("retained-view").hidden = false;
}

async function deleteRetained(event, row) {
  if (!confirm(`Delete the retained event of ${event.topic}?`)) return;
  try {
    await api("DELETE", `retained/${encodeURIComponent(event.topic)}`);
  } catch (error) {
    report("delete", explain(error, "Delete"));
    return;
  }
  report("delete", "");
  row.remove();
  if ($("retained-view-topic").textContent === event.topic) $("retained-view").hidden = true;
  loadRetained();
}

// A payload as the API gives it: args/kwargs, where binary is a string of a NUL character
// then base64 (WAMP's JSON convention), with the MQTT content type when there was one.
function decode(event) {
  const args = event.args || [];
  const kwargs = event.kwargs || {};
  const type = (event.content_type || "").toLowerCase();
  if (args.length === 1 && !Object.keys(kwargs).length && isBinary(args[0])) {
    const bytes = Uint8Array.from(atob(args[0].slice(1)), (c) => c.charCodeAt(0));
    const text = utf8(bytes);
    if (text !== null && (type.includes("json") || (!type && looksLikeJson(text)))) {
      try { return {kind: type || "JSON", text: JSON.stringify(JSON.parse(text), null, 2)}; }
      catch (error) { /* not JSON after all: text or hex below */ }
    }
    if (text !== null && (type.startsWith("text/") || (!type && printable(text)))) {
      return {kind: type || "text", text};
    }
    return {kind: `${type || "binary"}, ${bytes.length} bytes`, text: hexDump(bytes)};
  }
  const named = Object.keys(kwargs).length > 0;
  const value = named ? (args.length ? {args, kwargs} : kwargs) : args.length === 1 ? args[0] : args;
  if (typeof value === "string") return {kind: type || "text", text: value};
  return {kind: type || "JSON", text: JSON.stringify(value, null, 2)};
}

function isBinary(value) {
  return typeof value === "string" && value.charCodeAt(0) === 0;
}

function utf8(bytes) {
  try { return new TextDecoder("utf-8", {fatal: true}).decode(bytes); }
  catch (error) { return null; }
}

function looksLikeJson(text) {
  return /^\s*[[{"]/.test(text);
}

function printable(text) {
  return !/[\u0000-\u0008\u000e-\u001f]/.test(text);
}

function hexDump(bytes) {
  const lines = [];
  for (let offset = 0; offset < bytes.length; offset += 16) {
    const chunk = Array.from(bytes.slice(offset, offset + 16));
    const hex = chunk.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = chunk.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${offset.toString(16).padStart(6, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n");
}

function setUpRetained() {
  $("retained-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadRetained();
  });
  $("retained-more").addEventListener("click", () => loadRetained(true));
  $("retained-view-close").addEventListener("click", () => { $("retained-view").hidden = true; });
}

document.addEventListener("DOMContentLoaded", () => {
  setUpLogin();
  setUpRetained();
  window.addEventListener("resize", drawChart);
});
