// execgate console: countdowns and small charts on top of server-rendered pages.
// No data comes from here: it only reads what the page already shows.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";

  function countdowns() {
    const now = Date.now();
    document.querySelectorAll("[data-expires]").forEach(function (el) {
      const left = Math.floor((Date.parse(el.dataset.expires) - now) / 1000);
      if (isNaN(left)) return;
      el.textContent = left > 0
        ? Math.floor(left / 60) + "m " + String(left % 60).padStart(2, "0") + "s left"
        : "expired";
    });
  }

  function svgEl(name, attrs) {
    const el = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    return el;
  }

  // A horizontal bar per row: label from the first column, value from the last.
  function drawChart(table) {
    const rows = Array.from(table.tBodies[0].rows).map(function (row) {
      const cells = row.cells;
      return { label: cells[0].textContent, value: parseFloat(cells[cells.length - 1].textContent) };
    }).filter(function (r) { return !isNaN(r.value); });
    if (!rows.length) return;
    const max = Math.max.apply(null, rows.map(function (r) { return r.value; })) || 1;
    const barH = 20, gap = 6, labelW = 150, width = 420;
    const height = rows.length * (barH + gap);
    const svg = svgEl("svg", { "class": "chart", viewBox: "0 0 " + width + " " + height,
      role: "img", "aria-label": table.closest("section").querySelector("h2").textContent });
    rows.forEach(function (r, i) {
      const y = i * (barH + gap);
      const span = width - labelW - 40;
      const label = svgEl("text", { x: 0, y: y + 15 });
      label.textContent = r.label.length > 20 ? r.label.slice(0, 19) + "…" : r.label;
      svg.appendChild(label);
      svg.appendChild(svgEl("rect", { "class": "track", x: labelW, y: y, width: span, height: barH, rx: 3 }));
      svg.appendChild(svgEl("rect", { "class": "bar", x: labelW, y: y,
        width: Math.max(2, span * r.value / max), height: barH, rx: 3 }));
      const num = svgEl("text", { x: labelW + span + 6, y: y + 15 });
      num.textContent = String(r.value);
      svg.appendChild(num);
    });
    table.parentNode.insertBefore(svg, table);
  }

  // Denying without saying why leaves the requester guessing: ask for a reason.
  function requireDenyReason(form) {
    form.addEventListener("submit", function (event) {
      const button = event.submitter;
      const reason = form.querySelector("textarea[name=reason]");
      if (button && button.value === "deny" && reason && !reason.value.trim()) {
        event.preventDefault();
        reason.setCustomValidity("Say why you deny it");
        reason.reportValidity();
        reason.addEventListener("input", function () { reason.setCustomValidity(""); }, { once: true });
      }
    });
  }

  // A running execution's page: its output as it is printed (text nodes only, so
  // nothing the program prints is ever markup), then the page again for the result.
  function followLive(pre) {
    const source = new EventSource(pre.dataset.events);
    source.addEventListener("output", function (event) {
      const data = JSON.parse(event.data);
      const span = document.createElement("span");
      span.className = data.stream;
      span.textContent = data.text;
      pre.appendChild(span);
    });
    function done() { source.close(); window.location.reload(); }
    source.addEventListener("result", done);
    source.addEventListener("error", function (event) { if (event.data) done(); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("pre[data-events]").forEach(followLive);
    countdowns();
    if (document.querySelector("[data-expires]")) setInterval(countdowns, 1000);
    document.querySelectorAll("table.chart").forEach(drawChart);
    document.querySelectorAll("form.decision").forEach(requireDenyReason);
  });
})();
