// distcrawl web console: refreshes the crawl page from /api/crawl/<name>/status every
// 1.5 s and draws the history charts (from /api/crawl/<name>/history) on <canvas>.
// No library, no network beyond this console: the page works offline.
"use strict";

(function () {
  const root = document.getElementById("crawl");
  if (!root) return;
  const crawl = encodeURIComponent(root.dataset.crawl);
  const STATUS_EVERY = 1500;
  const HISTORY_EVERY = 10000;

  function text(el, value) {
    if (el && el.textContent !== String(value)) el.textContent = String(value);
  }

  function cell(row, value, cls) {
    const td = document.createElement("td");
    td.textContent = value;
    if (cls) td.className = cls;
    row.appendChild(td);
  }

  function render(snap) {
    document.querySelectorAll("[data-field]").forEach(function (el) {
      const value = snap[el.dataset.field];
      if (value !== undefined) text(el, value);
    });
    const state = document.getElementById("state");
    if (state) state.className = "state " + snap.state;
    document.querySelectorAll("[data-rate]").forEach(function (el) {
      text(el, snap.rates[el.dataset.rate]);
    });
    const totals = Object.keys(snap.totals).sort().map(function (k) {
      return k + " " + snap.totals[k];
    });
    text(document.getElementById("totals"), totals.join(", "));
    text(document.getElementById("updated"), new Date(snap.time * 1000).toISOString().slice(0, 19) + "+00:00");
    const workers = document.querySelector("#workers tbody");
    if (workers) {
      workers.replaceChildren();
      snap.workers.forEach(function (w) {
        const row = document.createElement("tr");
        cell(row, w.id);
        cell(row, w.status, w.status);
        cell(row, w.state || "");
        cell(row, w.pages || 0);
        cell(row, w.pages_per_s);
        cell(row, w.items || 0);
        cell(row, w.age === null ? "-" : w.age + "s ago");
        workers.appendChild(row);
      });
    }
    const domains = document.querySelector("#domains tbody");
    if (domains) {
      domains.replaceChildren();
      snap.domains.forEach(function (d) {
        const row = document.createElement("tr");
        cell(row, d[0]);
        cell(row, d[1]);
        domains.appendChild(row);
      });
    }
    root.dataset.polls = String(Number(root.dataset.polls || 0) + 1);
  }

  function poll() {
    fetch("/api/crawl/" + crawl + "/status", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(render)
      .catch(function () { /* the next poll tries again */ })
      .finally(function () { setTimeout(poll, STATUS_EVERY); });
  }

  // one series as a line chart: values by bucket, the y axis from 0 to the largest value
  function chart(canvas, times, values) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 28;
    ctx.clearRect(0, 0, w, h);
    const shown = values.map(function (v) { return v === null ? 0 : v; });
    const top = Math.max(1, ...shown);
    ctx.strokeStyle = "#bbb";
    ctx.beginPath(); ctx.moveTo(pad, 4); ctx.lineTo(pad, h - pad); ctx.lineTo(w - 4, h - pad); ctx.stroke();
    ctx.fillStyle = "#555"; ctx.font = "10px sans-serif";
    ctx.fillText(top.toFixed(top < 10 ? 1 : 0), 2, 12);
    ctx.fillText("0", 2, h - pad);
    if (times.length) {
      const fmt = function (t) { return new Date(t * 1000).toISOString().slice(11, 16); };
      ctx.fillText(fmt(times[0]), pad, h - pad + 14);
      ctx.fillText(fmt(times[times.length - 1]), w - 40, h - pad + 14);
    }
    ctx.strokeStyle = "#1565c0"; ctx.lineWidth = 1.5; ctx.beginPath();
    const step = (w - pad - 4) / Math.max(1, shown.length - 1);
    shown.forEach(function (v, i) {
      const x = pad + i * step, y = h - pad - (v / top) * (h - pad - 8);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    canvas.dataset.points = String(values.filter(function (v) { return v !== null && v > 0; }).length);
  }

  let historyTimer = null;

  function drawHistory() {
    clearTimeout(historyTimer);
    const span = (document.getElementById("span") || {}).value || "hour";
    fetch("/api/crawl/" + crawl + "/history?span=" + span, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (hist) {
        const per = hist.seconds;
        const s = hist.series;
        chart(document.getElementById("chart-pages"), hist.times, s.pages.map(function (v) { return v / per; }));
        chart(document.getElementById("chart-queue"), hist.times, s.queue);
        chart(document.getElementById("chart-errors"), hist.times, s.errors.map(function (v) { return v * 60 / per; }));
      })
      .catch(function () { /* the next refresh tries again */ })
      .finally(function () { historyTimer = setTimeout(drawHistory, HISTORY_EVERY); });
  }

  const select = document.getElementById("span");
  if (select) select.addEventListener("change", drawHistory);
  setTimeout(poll, STATUS_EVERY);
  drawHistory();
})();
