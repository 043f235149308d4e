// The node page (GET /). Reads /v1/status (every STATUS_MS while the tab is visible, and soon after each event),
// /v1/events (the last MAX_EVENTS, then the websocket from the newest one on) and /v1/history (one plot per kept
// metric). Everything shown is put in the page with textContent: no text from the agent is ever parsed as HTML.
// The token (server.apiTokenFile) comes from the address (#token=..., never sent to the server) or the form; it is
// kept in this tab's sessionStorage, sent as "Authorization: Bearer" and, on the websocket, as the subprotocol
// nvdaemon.bearer.<base64url> (a browser cannot set headers there).
"use strict";
(() => {
  const STATUS_MS = 5000;
  const HISTORY_MS = 60000;
  const MAX_EVENTS = 50;
  const MAX_SERIES = 8;
  const TOKEN_KEY = "nvdaemon.token";
  const SEVERITY_RANK = { critical: 0, warning: 1, info: 2 };
  const $ = (id) => document.getElementById(id);
  const body = document.body;

  let token = null;
  let status = null;
  let statusAt = 0;
  let streamOff = false;
  let streamStarted = false;
  const events = new Map(); // id -> {event, source}
  let socket = null;
  let retryMs = 1000;
  let statusTimer = 0;
  let historyTimer = 0;

  class AuthError extends Error {}

  // ---- small helpers ---------------------------------------------------------------------------------------
  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  function fill(table, rows) {
    // Each cell is labelled with its column's heading: on a phone a row is shown as a card (node.css).
    const heads = [...table.tHead.rows[0].cells].map((c) => c.textContent);
    for (const tr of rows) [...tr.cells].forEach((td, i) => { td.dataset.label = heads[i] || ""; });
    table.tBodies[0].replaceChildren(...rows);
  }
  function svg(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  function seconds(v) {
    if (typeof v === "number" && isFinite(v)) return v;
    if (typeof v === "string") {
      const t = Date.parse(v);
      return isNaN(t) ? NaN : t / 1000;
    }
    return NaN;
  }
  function span(sec) {
    if (!isFinite(sec)) return "?";
    sec = Math.max(0, Math.round(sec));
    const d = Math.floor(sec / 86400), h = Math.floor((sec % 86400) / 3600);
    const m = Math.floor((sec % 3600) / 60), s = sec % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }
  function ago(t) {
    return isFinite(t) ? `${span(Date.now() / 1000 - t)} ago` : "?";
  }
  function iso(t) {
    return isFinite(t) ? new Date(t * 1000).toISOString() : "";
  }
  function num(v) {
    if (typeof v !== "number" || !isFinite(v)) return v === undefined || v === null ? "?" : String(v);
    const a = Math.abs(v);
    if (a >= 1e12) return (v / 1e12).toPrecision(3) + "T";
    if (a >= 1e9) return (v / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return (v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return (v / 1e3).toPrecision(3) + "k";
    return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  }
  function text(v) {
    return typeof v === "string" ? v : v === undefined || v === null ? "?" : String(v);
  }
  function showError(message) {
    const e = $("error");
    e.hidden = !message;
    e.textContent = message || "";
  }

  // ---- the token -------------------------------------------------------------------------------------------
  function takeToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (m) {
      token = decodeURIComponent(m[1]) || null;
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      history.replaceState(null, "", location.pathname + location.search); // out of the address bar at once
    } else {
      token = sessionStorage.getItem(TOKEN_KEY);
    }
  }
  function b64url(s) {
    const bytes = new TextEncoder().encode(s);
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function askToken(refused) {
    $("auth").hidden = false;
    const e = $("auth-error");
    e.hidden = !refused;
    e.textContent = refused ? "The agent refused this token." : "";
  }
  $("use-token").addEventListener("click", () => {
    token = $("token").value.trim() || null;
    $("token").value = "";
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("auth").hidden = true;
    if (streamStarted) restartStream(); // else the first status read starts it
    refreshStatus();
    refreshHistory();
  });

  async function api(path) {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const r = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    if (r.status === 401) throw new AuthError();
    return r;
  }

  // ---- /v1/status ------------------------------------------------------------------------------------------
  async function refreshStatus() {
    clearTimeout(statusTimer);
    if (document.hidden) { // a tab in the background asks for nothing
      statusTimer = setTimeout(refreshStatus, STATUS_MS);
      return;
    }
    try {
      const r = await api("/v1/status");
      if (!r.ok) throw new Error(`/v1/status answered ${r.status}`);
      status = await r.json();
      statusAt = Date.now() / 1000;
      $("auth").hidden = true;
      showError("");
      render();
      body.dataset.statusLoads = String(Number(body.dataset.statusLoads || 0) + 1);
      if (!streamStarted) {
        // The stream starts once the API answered: a token that is missing or wrong is asked for first.
        streamStarted = true;
        if ((status.sinks || {}).stream) loadRecentEvents().then((on) => { if (on) connectStream(); });
        else streamIsOff();
      }
    } catch (err) {
      if (err instanceof AuthError) askToken(token !== null);
      else showError(`Cannot read /v1/status: ${err.message}. Retrying.`);
    }
    // Cleared again here: a read started meanwhile (one soon after an event) must not leave a second polling chain.
    clearTimeout(statusTimer);
    statusTimer = setTimeout(refreshStatus, STATUS_MS);
  }
  let soon = 0;
  function refreshStatusSoon() {
    clearTimeout(soon);
    soon = setTimeout(refreshStatus, 200);
  }

  function render() {
    if (!status) return;
    renderHeader();
    renderConditions();
    renderTiers();
    renderSinks();
    if (streamOff) {
      for (const ev of status.recentEvents || []) addEvent(ev, "status");
      renderEvents();
    }
    const h = (status.sinks || {}).history;
    const wasHidden = $("history-section").hidden;
    $("history-section").hidden = !h;
    if (h && wasHidden) refreshHistory();
  }

  function renderHeader() {
    $("node").textContent = text(status.node);
    document.title = `${text(status.node)} · nvdaemon`;
    const r = $("readiness");
    r.textContent = status.ready ? "ready" : "not ready";
    r.className = "badge " + (status.ready ? "good" : "bad");
    const notRunning = Object.entries(status.tasks || {}).filter(([, t]) => t && t.state !== "running");
    const parts = [
      `version ${text(status.version)}`,
      `up ${span(statusAt - seconds(status.startedAt))}`,
      `config ${text(status.config)}`,
      `reloads ${num((status.reloads || {}).ok)} ok, ${num((status.reloads || {}).rejected)} rejected`,
    ];
    if (notRunning.length) parts.push("not running: " + notRunning.map(([n, t]) => `${n} (${text(t.state)})`).join(", "));
    $("meta").textContent = parts.join(" · ");
  }

  function renderConditions() {
    const list = (status.conditions || []).slice().sort((a, b) =>
      (SEVERITY_RANK[a.severity] ?? 9) - (SEVERITY_RANK[b.severity] ?? 9) || seconds(a.startedAt) - seconds(b.startedAt));
    fill($("conditions"), list.map((c) => {
      const tr = el("tr", c.stale ? "stale" : "");
      tr.dataset.condition = text(c.condition);
      tr.dataset.device = text(c.device);
      tr.append(
        el("td", "", el("span", "badge " + text(c.severity), text(c.severity))),
        el("td", "", text(c.condition)),
        el("td", "device", text(c.device)),
        el("td", "", `${num(c.value)} (threshold ${num(c.threshold)})`),
      );
      const since = el("td", "", span(Date.now() / 1000 - seconds(c.startedAt)) + (c.stale ? " (stale)" : ""));
      since.title = `since ${iso(seconds(c.startedAt))}` + (c.stale ? `, last seen ${iso(seconds(c.lastSeen))}` : "");
      tr.append(since);
      return tr;
    }));
    $("conditions-count").textContent = `(${list.length})`;
    $("conditions-empty").hidden = list.length > 0;
    $("conditions").hidden = list.length === 0;
  }

  function renderTiers() {
    const box = $("tiers");
    const tiers = Object.entries(status.tiers || {});
    if (!tiers.length) {
      box.replaceChildren(el("p", "muted", "No tier has collected yet."));
      return;
    }
    box.replaceChildren(...tiers.map(([name, t]) => {
      const div = el("div", "tier");
      div.dataset.tier = name;
      const collectors = Object.entries(t.collectors || {});
      const broken = collectors.filter(([, c]) => c && c.success === false);
      const absent = collectors.filter(([, c]) => c && c.present === false).map(([n]) => n);
      const ms = typeof t.durationSeconds === "number" ? `${num(t.durationSeconds * 1000)} ms` : "?";
      div.append(
        el("strong", "", name),
        ` · last collection ${ago(seconds(t.collectedAt))}, took ${ms}, every ${num(t.intervalSeconds)} s, ` +
          `${num(t.ticks)} ticks, ${num(t.samples)} samples, ${collectors.length - broken.length}/${collectors.length} collectors ok`,
      );
      if (absent.length) div.append(el("div", "muted", "not on this node: " + absent.join(", ")));
      if (broken.length) {
        div.append(el("ul", "", ...broken.map(([n, c]) => el("li", "bad",
          `${n}: ${text((c.errors || [])[0])}` + (c.errorTotal ? ` (${num(c.errorTotal)} errors so far)` : "")))));
      }
      return div;
    }));
  }

  function renderSinks() {
    const sinks = Object.entries(status.sinks || {});
    const tasks = status.tasks || {};
    fill($("sinks"), sinks.map(([name, s]) => {
      s = s || {};
      const backlog = ["backlog", "pending"].filter((k) => k in s).map((k) => `${k} ${num(s[k])}`);
      if (s.deadLetters) backlog.push(`${num(s.deadLetters)} dead letters`);
      const task = tasks[name] || {};
      const err = s.disabledReason ?? s.storageError ?? s.lastError ?? task.lastError ?? null;
      const tr = el("tr", "", el("td", "", name), el("td", task.state === "running" ? "" : "bad", text(task.state)),
        el("td", "", backlog.join(", ") || "—"), el("td", err ? "error" : "muted", err === null ? "none" : text(err)));
      return tr;
    }));
    $("sinks-section").hidden = sinks.length === 0;
  }

  // ---- events ----------------------------------------------------------------------------------------------
  function addEvent(ev, source) {
    if (!ev || typeof ev.id !== "string" || events.has(ev.id)) return;
    events.set(ev.id, { ev, source });
    if (events.size > MAX_EVENTS * 2) {
      const keep = [...events.values()].sort((a, b) => (b.ev.seq || 0) - (a.ev.seq || 0)).slice(0, MAX_EVENTS);
      events.clear();
      for (const k of keep) events.set(k.ev.id, k);
    }
  }
  function renderEvents() {
    const list = [...events.values()].sort((a, b) => (b.ev.seq || 0) - (a.ev.seq || 0)).slice(0, MAX_EVENTS);
    fill($("events"), list.map(({ ev, source }) => {
      const exit = ev.phase === "EXIT";
      const t = seconds(exit && ev.ended_at != null ? ev.ended_at : ev.started_at);
      const tr = el("tr", "");
      Object.assign(tr.dataset, { id: ev.id, phase: text(ev.phase), condition: text(ev.condition), source });
      const when = el("td", "", isFinite(t) ? new Date(t * 1000).toLocaleTimeString() : "?");
      when.title = iso(t);
      const detail = ev.detail || {};
      const what = "xid" in detail ? `xid ${text(detail.xid)}` : `value ${num(detail.value)}`;
      tr.append(when, el("td", exit ? "good" : "bad", text(ev.phase)),
        el("td", "", el("span", "badge " + text(ev.severity), text(ev.severity))),
        el("td", "", text(ev.condition)), el("td", "device", `${text(ev.device)} (${what})`));
      return tr;
    }));
    $("events-empty").hidden = list.length > 0;
    $("events").hidden = list.length === 0;
  }

  function newestId() {
    let best = null;
    for (const { ev } of events.values()) if (!best || (ev.seq || 0) > (best.seq || 0)) best = ev;
    return best ? best.id : null;
  }

  function setLive(state, label) {
    const b = $("live");
    b.textContent = label;
    b.className = "badge " + (state === "open" ? "good" : state === "off" ? "muted" : "warning");
    body.dataset.ws = state;
  }

  function streamIsOff() {
    // sinks.stream is not enabled: the events shown are /v1/status's recent ones, as often as it is read.
    streamOff = true;
    setLive("off", "events: stream off (from /v1/status)");
    render();
  }

  async function loadRecentEvents() {
    try {
      const r = await api(`/v1/events?replay=${MAX_EVENTS}`);
      if (r.status === 404) {
        streamIsOff();
        return false;
      }
      if (!r.ok) throw new Error(`/v1/events answered ${r.status}`);
      const doc = await r.json();
      for (const msg of doc.events || []) addEvent(msg.data, "replay");
      renderEvents();
      return true;
    } catch (err) {
      if (err instanceof AuthError) {
        askToken(token !== null);
        streamStarted = false; // started again by the next status read that the token lets through
        return false;
      }
      return true; // the websocket is tried anyway; it retries on its own
    }
  }

  function restartStream() {
    if (socket) {
      socket.onclose = null;
      socket.close();
      socket = null;
    }
    if (!streamOff) connectStream();
  }

  function connectStream() {
    const since = newestId();
    const query = since ? `since=${encodeURIComponent(since)}` : `replay=${MAX_EVENTS}`;
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/events?${query}`;
    const protocols = ["nvdaemon.events"];
    if (token) protocols.push("nvdaemon.bearer." + b64url(token));
    setLive("connecting", "events: connecting");
    const ws = (socket = new WebSocket(url, protocols));
    ws.onopen = () => {
      retryMs = 1000;
      setLive("open", "events: live");
    };
    ws.onmessage = (m) => {
      let msg;
      try {
        msg = JSON.parse(m.data);
      } catch {
        return;
      }
      if (!msg || msg.type === "ping" || msg.type === "control") return;
      addEvent(msg.data, "stream");
      renderEvents();
      refreshStatusSoon();
    };
    ws.onclose = () => {
      if (socket !== ws) return;
      socket = null;
      setLive("closed", `events: reconnecting in ${Math.round(retryMs / 1000)} s`);
      setTimeout(connectStream, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  // ---- history ---------------------------------------------------------------------------------------------
  function stepFor(range, intervalMinutes) {
    const m = /^(\d+)([hd])$/.exec(range);
    const minutes = m ? Number(m[1]) * (m[2] === "d" ? 1440 : 60) : 1440;
    return `${Math.max(intervalMinutes || 1, Math.ceil(minutes / 240))}m`;
  }

  let historyRun = 0;
  async function refreshHistory() {
    clearTimeout(historyTimer);
    if (document.hidden) { // a tab in the background asks for nothing
      historyTimer = setTimeout(refreshHistory, HISTORY_MS);
      return;
    }
    const h = status && (status.sinks || {}).history;
    if (!h) return;
    const run = ++historyRun; // a newer run (the range changed) takes over: this one stops at its next answer
    const range = $("range").value;
    const step = stepFor(range, h.intervalMinutes);
    const metrics = (h.metrics || []).slice().sort();
    $("history-note").textContent = `one point per ${step}, the average of each window`;
    const plots = $("plots");
    const seen = new Set();
    for (const metric of metrics) {
      seen.add(metric);
      let box = plots.querySelector(`[data-metric="${CSS.escape(metric)}"]`);
      if (!box) {
        box = el("div", "plot");
        box.dataset.metric = metric;
        plots.append(box);
      }
      try {
        const r = await api(`/v1/history/${encodeURIComponent(metric)}?range=${range}&step=${step}`);
        const doc = await r.json();
        if (run !== historyRun) return;
        if (!r.ok) throw new Error(text(doc.error));
        drawPlot(box, metric, doc);
      } catch (err) {
        if (err instanceof AuthError) {
          askToken(token !== null);
          break;
        }
        box.replaceChildren(el("h3", "", metric), el("p", "error", `history: ${err.message}`));
      }
    }
    for (const box of [...plots.children]) if (!seen.has(box.dataset.metric)) box.remove();
    body.dataset.historyLoads = String(Number(body.dataset.historyLoads || 0) + 1);
    clearTimeout(historyTimer);
    historyTimer = setTimeout(refreshHistory, HISTORY_MS);
  }
  $("range").addEventListener("change", refreshHistory);

  function drawPlot(box, metric, series) {
    const W = 300, H = 120, L = 42, B = 16, T = 6;
    const shown = series.filter((s) => (s.points || []).length).slice(0, MAX_SERIES);
    const title = el("h3", "", metric);
    if (!shown.length) {
      box.replaceChildren(title, el("p", "muted", "no points in this range yet"));
      box.dataset.points = "0";
      return;
    }
    let t0 = Infinity, t1 = -Infinity, lo = Infinity, hi = -Infinity, count = 0;
    for (const s of shown) for (const p of s.points) {
      const t = seconds(p.timestamp);
      if (!isFinite(t) || typeof p.value !== "number") continue;
      t0 = Math.min(t0, t); t1 = Math.max(t1, t); lo = Math.min(lo, p.value); hi = Math.max(hi, p.value); count++;
    }
    if (hi === lo) { hi += 1; lo -= lo === 0 ? 0 : 1; }
    if (t1 === t0) t1 = t0 + 1;
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - 4);
    const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${metric} over time` });
    for (const v of [lo, hi]) {
      plot.append(svg("line", { x1: L, x2: W - 4, y1: y(v), y2: y(v), class: "grid-line" }));
      const label = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end", class: "axis" });
      label.textContent = num(v);
      plot.append(label);
    }
    for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
      const label = svg("text", { x: x(t), y: H - 3, "text-anchor": anchor, class: "axis" });
      label.textContent = new Date(t * 1000).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
      plot.append(label);
    }
    const legend = el("div", "legend");
    shown.forEach((s, i) => {
      const pts = s.points.map((p) => [seconds(p.timestamp), p.value]).filter(([t, v]) => isFinite(t) && typeof v === "number");
      plot.append(svg("polyline", { class: `s${i}`, points: pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
      legend.append(el("span", "item", el("span", `s${i}`, "■ "), text(s.device)));
    });
    const more = series.length - shown.length;
    if (more > 0) legend.append(`(+${more} more devices)`);
    box.dataset.points = String(count);
    box.replaceChildren(title, plot, legend);
  }

  // ---- start -----------------------------------------------------------------------------------------------
  setInterval(() => { if (status && !document.hidden) { renderConditions(); renderTiers(); } }, 1000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshStatus(); });
  takeToken();
  renderEvents();
  refreshStatus();
})();
