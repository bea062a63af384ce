/* Pipeline Observatory page scripts.
 *
 * The CSP allows no inline script, so pages carry their chart data in
 * {{ data|json_script:"id" }} blocks and mark the canvas with
 * data-chart="<kind>" data-source="<id>". This file draws them, on load and after
 * every htmx swap. It never builds HTML from data: Chart.js draws on a canvas.
 */
(function () {
  "use strict";

  var COLORS = {
    accent: "#2458c6",
    window: "#5c6675",
    threshold: "#a15c00",
    compression: "#b42318",
    ok: "#1f7a3a",
    error: "#b42318",
    bar: "#5b8def",
  };

  function readData(canvas) {
    var source = document.getElementById(canvas.dataset.source || "");
    if (!source) return null;
    try {
      return JSON.parse(source.textContent);
    } catch (e) {
      return null;
    }
  }

  function baseOptions(yTitle) {
    return {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      scales: {
        y: { beginAtZero: true, title: { display: !!yTitle, text: yTitle || "" } },
      },
    };
  }

  // Context tokens per round against the model's window and the compression
  // threshold, with a marker on each round where compression fired.
  function tokenBudget(data) {
    var datasets = [
      {
        label: "context tokens",
        data: data.context,
        borderColor: COLORS.accent,
        backgroundColor: COLORS.accent,
        tension: 0.1,
        spanGaps: false, // a round of unknown context (a failed call) is a gap, not 0
      },
    ];
    if (data.window.some(function (v) { return v !== null; })) {
      datasets.push({
        label: "context window",
        data: data.window,
        borderColor: COLORS.window,
        borderDash: [2, 3],
        pointRadius: 0,
      });
    }
    if (data.threshold.some(function (v) { return v !== null; })) {
      datasets.push({
        label: "compression threshold",
        data: data.threshold,
        borderColor: COLORS.threshold,
        borderDash: [6, 4],
        pointRadius: 0,
      });
    }
    datasets.push({
      label: "compression fired",
      data: data.compressions,
      showLine: false,
      pointStyle: "triangle",
      pointRadius: 8,
      borderColor: COLORS.compression,
      backgroundColor: COLORS.compression,
    });
    var options = baseOptions("tokens");
    options.scales.x = { title: { display: true, text: "round" } };
    return { type: "line", data: { labels: data.labels, datasets: datasets }, options: options };
  }

  function histogram(data) {
    var options = baseOptions("calls");
    options.plugins.legend.display = false;
    options.scales.x = { title: { display: true, text: "latency (ms, bucket upper bound)" } };
    return {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: [{ label: "calls", data: data.counts, backgroundColor: COLORS.bar }],
      },
      options: options,
    };
  }

  // A click on a bucket of a time series follows the link the server made for it
  // (the conversations started in it, or a tool's failures in it).
  function drillDown(data) {
    return function (event, elements, chart) {
      var hit = chart.getElementsAtEventForMode(event, "index", { intersect: false }, false);
      var i = hit.length ? hit[0].index : -1;
      if (i >= 0 && data.links && data.links[i]) window.location.assign(data.links[i]);
    };
  }

  // Bars on the left axis and lines on a right one; a click on a bucket drills into it.
  function barsAndLines(data, leftTitle, rightTitle, datasets) {
    var options = baseOptions(leftTitle);
    options.scales.right = {
      position: "right",
      beginAtZero: true,
      grid: { drawOnChartArea: false },
      title: { display: true, text: rightTitle },
    };
    options.onClick = drillDown(data);
    datasets.forEach(function (set) {
      if (set.type === "line") set.yAxisID = "right";
    });
    return { type: "bar", data: { labels: data.labels, datasets: datasets }, options: options };
  }

  // Overview and tool pages: calls and errors per bucket, p95 latency.
  function activity(data) {
    return barsAndLines(data, "calls", "p95 latency (ms, bucket bound)", [
      { label: "tool calls", data: data.calls, backgroundColor: COLORS.bar },
      { label: "errors", data: data.errors, backgroundColor: COLORS.error },
      { label: "p95 latency", data: data.p95_ms, type: "line", spanGaps: true,
        borderColor: COLORS.threshold, backgroundColor: COLORS.threshold },
    ]);
  }

  // Overview: tokens of the conversations started per bucket, their cost.
  function usage(data) {
    return barsAndLines(data, "tokens", "cost (USD)", [
      { label: "tokens (in + out)", data: data.tokens, backgroundColor: COLORS.bar },
      { label: "cost (USD)", data: data.cost_usd, type: "line", borderColor: COLORS.ok, backgroundColor: COLORS.ok },
    ]);
  }

  // Overview: tokens per model and bucket as the app's metrics report them (stacked
  // bars), beside the tokens of the conversations the spans and records give (a line).
  var MODEL_COLORS = ["#5b8def", "#1f7a3a", "#a15c00", "#7a3ab4", "#0f8a8a", "#b42318", "#5c6675"];
  function metricTokens(data) {
    var reported = data.metric_tokens || { models: [], tokens: {} };
    var datasets = reported.models.map(function (model, i) {
      var color = MODEL_COLORS[i % MODEL_COLORS.length];
      return { label: (model || "(no model)") + " (metrics)", data: reported.tokens[model], backgroundColor: color,
               stack: "metrics" };
    });
    datasets.push({ label: "tokens of conversations started (spans and records)", data: data.tokens, type: "line",
                    borderColor: COLORS.window, backgroundColor: COLORS.window });
    var chart = barsAndLines(data, "tokens (metrics)", "tokens (conversations)", datasets);
    chart.options.scales.x = { stacked: true };
    chart.options.scales.y.stacked = true;
    return chart;
  }

  var KINDS = { "token-budget": tokenBudget, histogram: histogram, activity: activity, usage: usage,
                "metric-tokens": metricTokens };
  // Other scripts add chart kinds here (judging.js: score series), before the page loads.
  window.observatoryCharts = { kinds: KINDS, barsAndLines: barsAndLines, colors: COLORS };

  function drawCharts(root) {
    if (typeof window.Chart === "undefined") return;
    var canvases = (root || document).querySelectorAll("canvas[data-chart]");
    canvases.forEach(function (canvas) {
      if (canvas.dataset.drawn === "1") return;
      var build = KINDS[canvas.dataset.chart];
      var data = readData(canvas);
      if (!build || !data) return;
      canvas.dataset.drawn = "1";
      new window.Chart(canvas, build(data));
    });
  }

  // On a phone the nav is one row that scrolls by itself: bring the current
  // section into sight (a no-op when the row fits).
  function showCurrentSection() {
    var nav = document.querySelector(".topbar nav");
    var current = nav && nav.querySelector("a.current");
    if (!current || nav.scrollWidth <= nav.clientWidth) return;
    nav.scrollLeft = current.offsetLeft - (nav.clientWidth - current.offsetWidth) / 2;
  }

  document.addEventListener("DOMContentLoaded", function () {
    showCurrentSection();
    drawCharts(document);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    drawCharts(event.target);
  });
})();
