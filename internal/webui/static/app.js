// fairshard console: read views of the /v1 API and a few actions, no
// framework, no build step. Every value from the API is put in the page
// as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "fairshard.api_token";
const state = { view: "cluster", delivered: {}, deadNs: "", deadAfter: "", deadNext: "", rowKey: "", pendingConfirm: null };

function $(sel) { return document.querySelector(sel); }
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function setStatus(text, isError) {
  const s = $("#status");
  s.textContent = text;
  s.classList.toggle("error", !!isError);
}

// syncRows keeps tbody's rows in step with items, keyed by key(item): a
// row that exists is updated in place (update), a new one is built
// (build, then update) and rows of items gone are removed. Rows are never
// rebuilt, so a click or an edit in progress survives a refresh.
function syncRows(tbody, items, key, build, update) {
  const old = new Map();
  for (const tr of tbody.children) old.set(tr.dataset.key, tr);
  const rows = items.map(item => {
    const k = key(item);
    let tr = old.get(k);
    if (!tr) {
      tr = build(item);
      tr.dataset.key = k;
    }
    update(tr, item);
    return tr;
  });
  // Reorder and drop without touching rows already in place.
  rows.forEach((tr, i) => {
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
  while (tbody.children.length > rows.length) tbody.lastChild.remove();
}

// cell returns the row's cell of class cls, for in-place updates.
function cell(tr, cls) { return tr.querySelector("td." + cls); }

class Unauthorized extends Error {}

// api calls the node's /v1 API with the session's token.
async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  // Every write carries application/json, body or not: the node refuses
  // a write without it (a web page of another site cannot send it
  // without a preflight).
  if (method !== "GET" && method !== "HEAD") headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
  if (resp.status === 401) {
    $("#token-form").hidden = false;
    throw new Unauthorized("the API token is missing or wrong");
  }
  if (resp.status === 204) return null;
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    const msg = data && data.error ? data.error.message : resp.status + " " + resp.statusText;
    const err = new Error(msg);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function enc(s) { return encodeURIComponent(s); }
function fmtTime(t) { return t ? new Date(t).toLocaleTimeString() : ""; }
function fmtRate(r) { return r === null ? "…" : r.toFixed(1); }
function fmtSeconds(s) { return s ? (s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s") : "–"; }

// ---- views ----

async function refreshCluster() {
  const c = await api("GET", "/v1/cluster");
  $("#cluster-summary").textContent = c.members.length + " members, " + c.shard_count + " shards, seen from " + c.node;
  syncRows($("#members tbody"), c.members, m => m.name, m => {
    const tr = el("tr");
    tr.dataset.member = m.name;
    tr.append(el("td", m.name, "name"), el("td", "", "state"), el("td", "", "addr"), el("td", "", "num owned"), el("td", "", "num fraction"));
    return tr;
  }, (tr, m) => {
    cell(tr, "state").textContent = m.state;
    cell(tr, "addr").textContent = m.api_addr;
    cell(tr, "owned").textContent = m.owned_shards;
    cell(tr, "fraction").textContent = (m.owned_shard_fraction * 100).toFixed(1) + " %";
  });
}

async function refreshNamespaces() {
  const data = await api("GET", "/v1/namespaces");
  const now = performance.now();
  const unreachable = data.unreachable_nodes || [];
  $("#ns-unreachable").textContent = unreachable.length ? "not answering: " + unreachable.join(", ") : "";
  syncRows($("#namespaces tbody"), data.namespaces, ns => ns.namespace, ns => {
    const name = ns.namespace;
    const tr = el("tr");
    tr.dataset.ns = name;
    const quota = el("input", null, "quota");
    quota.type = "number"; quota.min = "0"; quota.placeholder = "new quota";
    quota.setAttribute("aria-label", "new quota of " + name);
    const save = el("button", "Set", "save-quota");
    save.addEventListener("click", () => act(async () => {
      const v = Number(quota.value);
      if (quota.value === "" || !Number.isInteger(v) || v < 0) throw new Error("the quota must be a whole number of rows, 0 or more");
      await api("PUT", "/v1/namespaces/" + enc(name), { max_in_flight: v });
      quota.value = "";
    }));
    const quotaCell = el("td", null, "quota-cell");
    quotaCell.append(el("span", "", "num quota-now"), el("small", "", "note quota-default"), " ", quota, " ", save);
    const toggle = el("button", "", "toggle");
    toggle.addEventListener("click", () => act(() => api("PUT", "/v1/namespaces/" + enc(name), { paused: toggle.dataset.paused !== "true" })));
    const actions = el("td", null, "actions");
    actions.append(toggle);
    tr.append(el("td", name, "name"), el("td", "", "state"), quotaCell, el("td", "", "num inflight"), el("td", "", "num pending"),
      el("td", "", "num dead"), el("td", "", "num delivered-rate"), el("td", "", "num p99"), actions);
    return tr;
  }, (tr, ns) => {
    const c = ns.cluster;
    const prev = state.delivered[ns.namespace];
    let rate = null;
    if (prev && now > prev.at) rate = Math.max(c.delivered_total - prev.total, 0) / ((now - prev.at) / 1000);
    state.delivered[ns.namespace] = { total: c.delivered_total, at: now };
    const p99 = Math.max(0, ...c.nodes.map(n => n.delivery_p99_seconds));
    const st = cell(tr, "state");
    st.textContent = ns.paused ? "paused" : "active";
    st.classList.toggle("paused", ns.paused);
    tr.querySelector(".quota-now").textContent = ns.max_in_flight;
    tr.querySelector(".quota-default").textContent = ns.max_in_flight_default ? " default" : "";
    cell(tr, "inflight").textContent = c.claimed;
    cell(tr, "pending").textContent = c.pending;
    cell(tr, "dead").textContent = c.dead_letters;
    if (rate !== null) cell(tr, "delivered-rate").textContent = fmtRate(rate);
    else if (!cell(tr, "delivered-rate").textContent) cell(tr, "delivered-rate").textContent = "…";
    cell(tr, "p99").textContent = fmtSeconds(p99);
    const toggle = tr.querySelector("button.toggle");
    toggle.dataset.paused = String(ns.paused);
    toggle.textContent = ns.paused ? "Resume" : "Pause";
    toggle.classList.toggle("pause", !ns.paused);
    toggle.classList.toggle("resume", ns.paused);
  });
}

async function refreshRow() {
  if (!state.rowKey) return;
  let r;
  try {
    r = await api("GET", "/v1/rows/" + enc(state.rowKey));
  } catch (e) {
    if (e.status === 404) {
      $("#row-result").hidden = true;
      const nf = $("#row-notfound");
      nf.hidden = false;
      nf.textContent = "No node holds a row with dispatch_key " + state.rowKey + ".";
      return;
    }
    throw e;
  }
  $("#row-notfound").hidden = true;
  $("#row-result").hidden = false;
  $("#row-status").textContent = r.status;
  $("#row-node").textContent = r.node || "";
  $("#row-route").textContent = r.namespace + " / " + r.task_queue;
  $("#row-attempt").textContent = r.attempt;
  $("#row-reason").textContent = r.waiting ? r.waiting.reason : "finished";
  $("#row-message").textContent = r.waiting ? r.waiting.message + (r.waiting.also && r.waiting.also.length ? " (also: " + r.waiting.also.join(", ") + ")" : "") : "";
  $("#row-error").textContent = r.last_error || "";
  $("#row-cancel").hidden = r.status !== "pending";
  $("#row-attempts tbody").replaceChildren(...(r.attempts || []).slice().reverse().map(a => {
    const tr = el("tr");
    tr.append(el("td", a.attempt), el("td", fmtTime(a.finished_at)), el("td", a.outcome), el("td", a.status_code || "–"),
      el("td", a.duration_ms + " ms", "num"), el("td", a.error || ""));
    return tr;
  }));
}

async function refreshDead() {
  const ns = state.deadNs;
  if (!ns) return;
  const q = "?limit=50" + (state.deadAfter ? "&after=" + enc(state.deadAfter) : "");
  const page = await api("GET", "/v1/namespaces/" + enc(ns) + "/dead-letters" + q);
  state.deadNext = page.next;
  $("#dl-next").disabled = !page.next;
  $("#dl-unreachable").textContent = page.unreachable_nodes.length ? "not answering: " + page.unreachable_nodes.join(", ") : "";
  syncRows($("#dead-letters tbody"), page.rows, r => r.dispatch_key, r => {
    const tr = el("tr");
    const key = r.dispatch_key;
    const redrive = el("button", "Redrive", "redrive");
    redrive.addEventListener("click", () => act(async () => {
      const res = await api("POST", "/v1/namespaces/" + enc(ns) + "/dead-letters/redrive", { keys: [key] });
      $("#dl-result").textContent = "Redriven: " + res.redriven + " (" + key + ").";
    }));
    tr.append(el("td", key, "key"), el("td", "", "tq"), el("td", "", "num attempt"), el("td", "", "failed"),
      el("td", "", "error"), el("td", "", "node"), el("td", null, "actions"));
    tr.lastChild.append(redrive);
    return tr;
  }, (tr, r) => {
    cell(tr, "tq").textContent = r.task_queue;
    cell(tr, "attempt").textContent = r.attempt;
    cell(tr, "failed").textContent = fmtTime(r.finished_at);
    cell(tr, "error").textContent = r.last_error || "";
    cell(tr, "node").textContent = r.node || "";
  });
}

const views = { cluster: refreshCluster, namespaces: refreshNamespaces, row: refreshRow, dead: refreshDead };

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    await views[state.view]();
    setStatus("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    refreshing = false;
  }
}

// act runs an action, then refreshes at once.
async function act(fn) {
  try {
    await fn();
  } catch (e) {
    setStatus(e.message, true);
    return;
  }
  await refresh();
}

function show(view) {
  if (!views[view]) view = "cluster";
  state.view = view;
  for (const v of Object.keys(views)) {
    $("#view-" + v).hidden = v !== view;
    $("#tab-" + v).classList.toggle("active", v === view);
  }
  refresh();
}

function askConfirm(text, fn) {
  state.pendingConfirm = fn;
  $("#dl-confirm-text").textContent = text;
  $("#dl-confirm").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token-input").value);
    $("#token-input").value = "";
    $("#token-form").hidden = true;
    refresh();
  });
  $("#row-form").addEventListener("submit", ev => {
    ev.preventDefault();
    state.rowKey = $("#row-key").value.trim();
    refresh();
  });
  $("#row-cancel").addEventListener("click", () => act(async () => {
    await api("POST", "/v1/rows/cancel", { dispatch_key: state.rowKey, reason: "cancelled from the console" });
  }));
  $("#dl-form").addEventListener("submit", ev => {
    ev.preventDefault();
    state.deadNs = $("#dl-ns").value.trim();
    state.deadAfter = "";
    $("#dl-result").textContent = "";
    refresh();
  });
  $("#dl-next").addEventListener("click", () => { state.deadAfter = state.deadNext; refresh(); });
  $("#dl-first").addEventListener("click", () => { state.deadAfter = ""; refresh(); });
  $("#dl-redrive-all").addEventListener("click", () => {
    const ns = $("#dl-ns").value.trim();
    if (!ns) return;
    askConfirm("Redrive every dead letter of " + ns + " on every node?", async () => {
      const res = await api("POST", "/v1/namespaces/" + enc(ns) + "/dead-letters/redrive");
      $("#dl-result").textContent = "Redriven: " + res.redriven + ".";
    });
  });
  $("#dl-purge-all").addEventListener("click", () => {
    const ns = $("#dl-ns").value.trim();
    if (!ns) return;
    askConfirm("Purge every dead letter of " + ns + " on every node? They will never be delivered.", async () => {
      const res = await api("POST", "/v1/namespaces/" + enc(ns) + "/dead-letters/purge");
      $("#dl-result").textContent = "Purged: " + res.purged + ".";
    });
  });
  $("#dl-confirm-yes").addEventListener("click", () => {
    const fn = state.pendingConfirm;
    state.pendingConfirm = null;
    $("#dl-confirm").hidden = true;
    if (fn) act(fn);
  });
  $("#dl-confirm-no").addEventListener("click", () => {
    state.pendingConfirm = null;
    $("#dl-confirm").hidden = true;
  });
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  show(location.hash.slice(1) || "cluster");
  setInterval(refresh, 1000);
});
