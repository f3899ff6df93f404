// Switchyard dashboard: polls api/state every second and api/history every
// two seconds, and redraws. Plain JavaScript, no dependencies.
"use strict";

(function () {
  const PALETTE = ["#4cb3ff", "#f2b84b", "#3ccf8e", "#e56bd3", "#f0605d", "#9d8cff",
    "#5fd4d0", "#c9d65c", "#ff9463", "#8fb0c8"];
  const STATE_EVERY_MS = 1000;
  const HISTORY_EVERY_MS = 2000;

  let state = null;        // newest /api/state
  let samples = [];        // history samples, oldest first
  let windowS = 300;       // history window, seconds
  let model = decodeURIComponent(location.hash.slice(1)) || "";

  const $ = (id) => document.getElementById(id);

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function fmt(v, digits) {
    if (v === undefined || v === null || !isFinite(v)) return "–";
    return v.toFixed(digits === undefined ? 1 : digits);
  }
  function pct(v) { return fmt(100 * v, 1) + "%"; }
  function age(s) {
    if (s === undefined || s === null || s < 0) return "–";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function color(engines, e) {
    const i = engines.indexOf(e);
    return PALETTE[(i < 0 ? engines.length : i) % PALETTE.length];
  }
  function pill(text, cls) {
    return '<span class="pill pill-' + esc(cls || text) + '">' + esc(text) + "</span>";
  }

  function currentModel() {
    if (!state || state.models.length === 0) return null;
    let m = state.models.find((x) => x.model === model);
    if (!m) { m = state.models[0]; model = m.model; }
    return m;
  }

  // ---- header ----
  function renderHeader() {
    const sel = $("model");
    const names = state.models.map((m) => m.model);
    $("model-label").hidden = names.length < 2;
    $("model-name").textContent = names.length === 1 ? "model " + names[0] : (names.length === 0 ? "no model yet" : "");
    if (sel.dataset.names !== names.join(",")) {
      sel.innerHTML = names.map((n) => "<option>" + esc(n) + "</option>").join("");
      sel.dataset.names = names.join(",");
    }
    sel.value = model;
    const w = state.watching || {};
    const off = Object.keys(w).filter((b) => !w[b]);
    $("watching").textContent = off.length ? "not watching " + off.join(", ") : "watching " + Object.keys(w).join(", ");
    const st = $("status");
    if (!state.connected) { st.className = "pill pill-error"; st.textContent = "NATS disconnected"; }
    else { st.className = "pill pill-live"; st.textContent = "live " + new Date(state.time_ms).toLocaleTimeString(); }
  }

  // ---- weights matrix ----
  function shade(w) {
    const a = Math.max(0, Math.min(1, w));
    return "background: rgba(76, 179, 255, " + (0.08 + 0.82 * a).toFixed(3) + ")";
  }
  function renderWeights(m) {
    if (!m || (m.snapshots.length === 0 && m.clusters.length === 0)) {
      $("weights").innerHTML = '<p class="muted">waiting for snapshots…</p>';
      return;
    }
    const snaps = {};
    m.snapshots.forEach((s) => { snaps[s.cluster] = s; });
    let h = '<table id="weights-table" data-model="' + esc(m.model) + '"><thead><tr><th>cluster</th>';
    m.engines.forEach((e) => { h += '<th><span class="swatch" style="background:' + color(m.engines, e) + '"></span>' + esc(e) + "</th>"; });
    h += "<th>shed</th><th>demand</th><th>gen</th><th>age</th></tr></thead><tbody>";
    m.clusters.forEach((c) => {
      const s = snaps[c];
      h += '<tr data-cluster="' + esc(c) + '"' + (s ? ' data-generation="' + s.generation + '"' : "") + '><td class="cl">' + esc(c) + "</td>";
      if (!s) {
        h += '<td colspan="' + (m.engines.length + 4) + '" class="muted" style="text-align:center">no snapshot</td></tr>';
        return;
      }
      m.engines.forEach((e) => {
        const w = s.weights[e] || 0;
        const tip = [c + " → " + e + ": " + pct(w)];
        if (s.utilisation && s.utilisation[e] !== undefined) tip.push("predicted utilisation " + pct(s.utilisation[e]));
        if (s.latency_ms && s.latency_ms[e] !== undefined) tip.push("predicted latency " + fmt(s.latency_ms[e]) + " ms");
        h += '<td class="w' + (w === 0 ? " zero" : "") + '" data-model="' + esc(m.model) + '" data-cluster="' + esc(c) +
          '" data-engine="' + esc(e) + '" data-weight="' + w.toFixed(4) + '" style="' + shade(w) + '" title="' + esc(tip.join("\n")) + '">' +
          pct(w) + "</td>";
      });
      h += '<td class="num" data-shed="' + s.shed_fraction.toFixed(4) + '">' + pct(s.shed_fraction) + "</td>" +
        '<td class="num">' + fmt(s.demand_rps) + "</td>" +
        '<td class="num">' + s.generation + "</td>" +
        '<td class="num">' + age(s.age_s) + "</td></tr>";
    });
    $("weights").innerHTML = h + "</tbody></table>";
  }

  // ---- engine cards ----
  function renderEngines(m) {
    if (!m || m.engine_states.length === 0) {
      $("engines").innerHTML = '<p class="muted">waiting for engine state…</p>';
      return;
    }
    let h = "";
    m.engine_states.forEach((e) => {
      const util = e.utilisation;
      const cls = util > 1 ? "over" : (util > 0.85 ? "hot" : "");
      const width = Math.min(100, 100 * util);
      h += '<div class="card" data-engine="' + esc(e.engine) + '" data-status="' + esc(e.status) + '" data-state="' + esc(e.state) +
        '" style="border-left-color:' + color(m.engines, e.engine) + '">' +
        '<div class="top"><span><span class="name">' + esc(e.engine) + "</span>" +
        (e.region ? '<span class="region">' + esc(e.region) + "</span>" : "") + "</span>" + pill(e.state) + "</div>" +
        (e.detail ? '<div class="detail">' + esc(e.detail) + "</div>" : "") +
        '<div class="bar" title="load ' + fmt(e.load_rps) + " req/s of " + fmt(e.effective_capacity_rps) + ' req/s effective capacity">' +
        '<div class="fill ' + cls + '" style="width:' + width.toFixed(1) + '%"></div>' +
        '<div class="txt">' + fmt(e.load_rps) + " / " + fmt(e.effective_capacity_rps, 0) + " req/s · " + pct(util) + "</div></div>" +
        '<div class="kv">' +
        "<span>health</span><span>" + pct(e.health) + "</span>" +
        "<span>capacity</span><span>" + fmt(e.capacity_rps, 0) + " req/s</span>" +
        "<span>errors · timeouts</span><span>" + pct(e.error_rate) + " · " + pct(e.timeout_rate) + "</span>" +
        (e.multiplier < 1 ? "<span>capacity ×</span><span>" + fmt(e.multiplier, 2) + "</span>" : "") +
        "<span>queue · run</span><span>" + fmt(e.queue) + " · " + fmt(e.running) + "</span>" +
        "<span>TTFT · TBT ms</span><span>" + fmt(e.ttft_ms, 0) + " · " + fmt(e.tbt_ms, 1) + "</span>" +
        "<span>KV cache</span><span>" + pct(e.kv_use) + "</span>" +
        "<span>last signal</span><span>" + age(e.signal_age_s) + "</span>" +
        "</div></div>";
    });
    $("engines").innerHTML = h;
  }

  // ---- demand ----
  function renderDemand(m) {
    if (!m || m.demand.length === 0) {
      $("demand").innerHTML = '<p class="muted">waiting for demand…</p>';
      return;
    }
    let h = "<table><thead><tr><th>cluster</th><th>demand req/s</th><th>shed req/s</th><th>shed</th><th>retries req/s</th><th>retries</th><th>routers</th><th>last report</th></tr></thead><tbody>";
    m.demand.forEach((d) => {
      h += '<tr data-cluster="' + esc(d.cluster) + '"><td class="cl">' + esc(d.cluster) + "</td>" +
        '<td class="num">' + fmt(d.rps) + "</td>" +
        '<td class="num">' + fmt(d.shed_rps, 2) + "</td>" +
        '<td class="num" data-shed-ratio="' + d.shed_ratio.toFixed(4) + '">' + pct(d.shed_ratio) + "</td>" +
        '<td class="num">' + fmt(d.retry_rps, 2) + "</td>" +
        '<td class="num" data-retry-ratio="' + d.retry_ratio.toFixed(4) + '">' + pct(d.retry_ratio) + "</td>" +
        '<td class="num">' + d.routers.length + "</td>" +
        '<td class="num">' + age(d.age_s) + "</td></tr>";
    });
    $("demand").innerHTML = h + "</tbody></table>";
  }

  // ---- routers ----
  function renderRouters(m) {
    const own = (state.routers || []).filter((r) => !r.model || !m || r.model === m.model);
    let h = "";
    if (own.length > 0) {
      h += "<table><thead><tr><th>router</th><th>cluster</th><th>mode</th><th>generation</th><th>snapshot age</th></tr></thead><tbody>";
      own.forEach((r) => {
        h += '<tr data-router="' + esc(r.router) + '" data-generation="' + r.generation + '"><td class="cl">' + esc(r.router) + "</td>" +
          "<td>" + esc(r.cluster) + "</td><td>" + pill(r.mode || "none") + "</td>" +
          '<td class="num">' + r.generation + '</td><td class="num">' + age(r.age_s) + "</td></tr>";
      });
      h += "</tbody></table>";
    }
    const reporting = [];
    if (m) m.demand.forEach((d) => d.routers.forEach((r) => reporting.push([d.cluster, r])));
    if (own.length === 0 && reporting.length > 0) {
      h += "<table><thead><tr><th>reporting router</th><th>cluster</th><th>req/s</th><th>shed req/s</th><th>retries req/s</th><th>last report</th></tr></thead><tbody>";
      reporting.forEach(([c, r]) => {
        h += '<tr><td class="cl">' + esc(r.router) + "</td><td>" + esc(c) + '</td><td class="num">' + fmt(r.rps) +
          '</td><td class="num">' + fmt(r.shed_rps, 2) + '</td><td class="num">' + fmt(r.retry_rps, 2) +
          '</td><td class="num">' + age(r.report_age_s) + "</td></tr>";
      });
      h += "</tbody></table>";
    }
    $("routers").innerHTML = h || '<p class="muted">no routers yet</p>';
  }

  // ---- charts ----
  // canvasFor sizes a canvas to its CSS width at the device pixel ratio and
  // returns its 2D context in CSS pixels.
  function canvasFor(cv, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(100, cv.clientWidth || cv.parentNode.clientWidth || 300);
    cv.style.height = cssHeight + "px";
    if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(cssHeight * dpr)) {
      cv.width = Math.round(w * dpr);
      cv.height = Math.round(cssHeight * dpr);
    }
    const ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, cssHeight);
    return { ctx: ctx, w: w, h: cssHeight };
  }

  // plot draws series ({color, dash, points: [[tMs, v]...]}) on a canvas,
  // with time on x ending at endMs and spanning windowS, y from 0 to yMax.
  function plot(cv, height, series, endMs, yMax, yFmt) {
    const c = canvasFor(cv, height);
    const ctx = c.ctx;
    const L = 40, R = 8, T = 6, B = 18;
    const pw = c.w - L - R, ph = c.h - T - B;
    const x = (t) => L + pw * (1 - (endMs - t) / (windowS * 1000));
    const y = (v) => T + ph * (1 - Math.min(v, yMax * 1.05) / yMax);
    ctx.font = "10px system-ui, sans-serif";
    ctx.lineWidth = 1;
    ctx.strokeStyle = "#2a3440";
    ctx.fillStyle = "#8a99a8";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = yMax * i / 4, yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(L + pw, yy); ctx.stroke();
      ctx.fillText(yFmt(v), L - 4, yy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const ticks = 5;
    for (let i = 0; i <= ticks; i++) {
      const ago = windowS * (ticks - i) / ticks, xx = L + pw * i / ticks;
      ctx.textAlign = i === ticks ? "right" : "center";
      ctx.fillText(ago === 0 ? "now" : "-" + (ago >= 120 ? (ago / 60).toFixed(0) + "m" : ago.toFixed(0) + "s"), xx, T + ph + 4);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(L, T - 2, pw, ph + 4); ctx.clip();
    series.forEach((s) => {
      if (s.points.length === 0) return;
      ctx.strokeStyle = s.color;
      ctx.lineWidth = s.width || 1.6;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let prev = null;
      s.points.forEach(([t, v]) => {
        const xx = x(t), yy = y(v);
        if (prev === null) ctx.moveTo(xx, yy);
        else { ctx.lineTo(xx, y(prev)); ctx.lineTo(xx, yy); } // steps: values hold until they change
        prev = v;
      });
      if (prev !== null) ctx.lineTo(x(endMs), y(prev));
      ctx.stroke();
      if (s.points.length === 1) { // a lone point: mark it
        const [t, v] = s.points[0];
        ctx.fillStyle = s.color;
        ctx.fillRect(x(t) - 2, y(v) - 2, 4, 4);
      }
    });
    ctx.restore();
    ctx.setLineDash([]);
  }

  function renderCharts(m) {
    const endMs = state ? state.time_ms : Date.now();
    const charts = $("weight-charts");
    $("window-label").textContent = "last " + (windowS >= 120 ? (windowS / 60).toFixed(0) + " minutes" : windowS.toFixed(0) + " s") +
      ", one line per engine, grey dashed: shed";
    if (!m) { charts.innerHTML = ""; $("legend").innerHTML = ""; return; }
    $("legend").innerHTML = m.engines.map((e) => '<span><span class="swatch" style="background:' + color(m.engines, e) + '"></span>' + esc(e) + "</span>").join("");
    const key = m.model + "|" + m.clusters.join(",");
    if (charts.dataset.key !== key) {
      charts.innerHTML = m.clusters.map((c) => '<div class="chart"><div class="title">cluster ' + esc(c) +
        '</div><canvas data-chart-cluster="' + esc(c) + '"></canvas></div>').join("");
      charts.dataset.key = key;
    }
    const cut = endMs - windowS * 1000;
    const recent = samples.filter((s) => s.t >= cut);
    charts.querySelectorAll("canvas").forEach((cv) => {
      const c = cv.dataset.chartCluster;
      const series = m.engines.map((e) => ({
        color: color(m.engines, e),
        points: recent.filter((s) => s.weights[m.model] && s.weights[m.model][c]).map((s) => [s.t, s.weights[m.model][c][e] || 0]),
      }));
      series.push({ color: "#8a99a8", dash: [4, 3], width: 1.2,
        points: recent.filter((s) => s.shed[m.model] && s.shed[m.model][c] !== undefined).map((s) => [s.t, s.shed[m.model][c]]) });
      plot(cv, 120, series, endMs, 1, (v) => (100 * v).toFixed(0) + "%");
    });
    let yMax = 1;
    recent.forEach((s) => {
      const l = s.load_rps[m.model] || {}, cap = s.capacity_rps[m.model] || {};
      Object.keys(l).forEach((e) => { yMax = Math.max(yMax, l[e]); });
      Object.keys(cap).forEach((e) => { yMax = Math.max(yMax, cap[e]); });
    });
    yMax = niceCeil(yMax);
    const load = [];
    m.engines.forEach((e) => {
      const col = color(m.engines, e);
      load.push({ color: col, points: recent.filter((s) => s.load_rps[m.model] && s.load_rps[m.model][e] !== undefined).map((s) => [s.t, s.load_rps[m.model][e]]) });
      load.push({ color: col, dash: [5, 4], width: 1.1, points: recent.filter((s) => s.capacity_rps[m.model] && s.capacity_rps[m.model][e] !== undefined).map((s) => [s.t, s.capacity_rps[m.model][e]]) });
    });
    plot($("load-chart"), 170, load, endMs, yMax, (v) => v.toFixed(0));
  }

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const f of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (f * p >= v) return f * p;
    return 10 * p;
  }

  function render() {
    if (!state) return;
    renderHeader();
    const m = currentModel();
    renderWeights(m);
    renderEngines(m);
    renderDemand(m);
    renderRouters(m);
    renderCharts(m);
  }

  // ---- polling ----
  async function pollState() {
    try {
      const r = await fetch("api/state", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      state = await r.json();
      render();
    } catch (err) {
      const st = $("status");
      st.className = "pill pill-error";
      st.textContent = "dashboard unreachable";
    }
  }

  async function pollHistory() {
    try {
      const since = samples.length ? samples[samples.length - 1].t : 0;
      const r = await fetch("api/history?since=" + since, { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const h = await r.json();
      windowS = h.window_s || windowS;
      samples = samples.concat(h.samples);
      const last = samples.length ? samples[samples.length - 1].t : 0;
      samples = samples.filter((s) => s.t >= last - windowS * 1000);
      if (state) renderCharts(currentModel());
    } catch (err) {
      // the state poll reports the outage
    }
  }

  $("model").addEventListener("change", (ev) => {
    model = ev.target.value;
    location.hash = encodeURIComponent(model);
    render();
  });
  window.addEventListener("resize", () => { if (state) renderCharts(currentModel()); });

  pollHistory().then(pollState);
  setInterval(pollState, STATE_EVERY_MS);
  setInterval(pollHistory, HISTORY_EVERY_MS);
})();
