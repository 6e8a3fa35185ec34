// Trainyard console: draws the usage chart from the JSON the page embeds (uPlot, vendored).
(function () {
  "use strict";
  function colour(name) {
    // The same stable colour the server gives a tenant (render.tenant_colour) is sent with the data.
    return (window.__trainyardColours || {})[name] || "#2f6fdf";
  }
  function drawUsage() {
    var holder = document.getElementById("usage-chart");
    var source = document.getElementById("usage-data");
    if (!holder || !source || typeof uPlot === "undefined") return;
    var data = JSON.parse(source.textContent);
    window.__trainyardColours = data.colours || {};
    var names = Object.keys(data.series);
    if (!names.length) { holder.textContent = "No usage in this window."; return; }
    var series = [{}].concat(names.map(function (n) {
      return { label: n, stroke: colour(n), fill: colour(n).replace(")", " / 0.15)"), width: 2,
               points: { show: data.x.length < 60 }, value: function (u, v) { return v == null ? "" : v.toFixed(2) + " GPU-h"; } };
    }));
    var opts = { width: Math.max(320, holder.clientWidth), height: 320, series: series,
                 axes: [{}, { label: "GPU-hours", size: 60 }], scales: { x: { time: true } } };
    var chart = new uPlot(opts, [data.x].concat(names.map(function (n) { return data.series[n]; })), holder);
    window.addEventListener("resize", function () { chart.setSize({ width: Math.max(320, holder.clientWidth), height: 320 }); });
    holder.dataset.drawn = "1";
  }
  document.addEventListener("DOMContentLoaded", drawUsage);
})();
