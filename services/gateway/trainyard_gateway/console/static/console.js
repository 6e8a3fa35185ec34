// Trainyard console: shows times in the browser's time zone; counts running jobs' elapsed time
// and GPU-hours up; narrows the submit form's queues and priority classes to the chosen tenant and queue.
(function () {
  "use strict";
  if (window.__trainyardConsole) return;  // loaded by the layout and by a page: once is enough
  window.__trainyardConsole = true;
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localTimes(root) {
    // <time datetime="...Z" title="UTC">: the local time shown, the UTC time kept on hover.
    (root || document).querySelectorAll("time[datetime]:not([data-local])").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) return;
      var utc = el.getAttribute("title") || el.textContent;
      var today = new Date().toDateString() === at.toDateString();
      var text = (today ? "" : at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" + pad(at.getDate()) + " ") +
        pad(at.getHours()) + ":" + pad(at.getMinutes()) + ":" + pad(at.getSeconds());
      if (el.classList.contains("ago")) {
        el.title = text + " local · " + utc;
      } else {
        el.textContent = text;
        el.title = utc + " (UTC)";
      }
      el.dataset.local = "1";
    });
  }
  function span(seconds) {
    // as render.span writes it
    seconds = Math.max(0, seconds);
    if (seconds < 90) return seconds.toFixed(0) + "s";
    if (seconds < 5400) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }
  function tick() {
    var now = Date.now() / 1000;
    document.querySelectorAll(".ticking[data-since]").forEach(function (el) {
      el.textContent = span(now - parseFloat(el.dataset.since));
    });
    document.querySelectorAll(".gpu-hours[data-since]").forEach(function (el) {
      var hours = parseFloat(el.dataset.gpus) * Math.max(0, now - parseFloat(el.dataset.since)) / 3600;
      el.textContent = hours.toFixed(3);
    });
  }
  function submitForm() {
    var tenant = document.getElementById("tenant-pick");
    var queue = document.getElementById("queue-pick");
    var klass = document.getElementById("class-pick");
    if (!tenant || !queue) return;
    var all = Array.prototype.slice.call(queue.querySelectorAll("option"));
    var classes = klass ? Array.prototype.slice.call(klass.options).map(function (o) { return o.value; }) : [];
    tenant.closest("label").hidden = false;
    tenant.removeAttribute("name");  // the queue's value names its tenant
    function showClasses(keepChoice) {
      // the chosen queue's classes; a queue just picked starts at its default class
      var chosen = queue.options[queue.selectedIndex];
      if (!klass || !chosen) return;
      var allowed = (chosen.dataset.classes || "").split(" ").filter(Boolean);
      var was = klass.value;
      klass.innerHTML = "";
      (allowed.length ? allowed : classes).forEach(function (c) { klass.add(new Option(c, c)); });
      klass.value = keepChoice && allowed.indexOf(was) >= 0 ? was : chosen.dataset.defaultClass;
    }
    function showQueues(keepChoice) {
      var was = queue.value;
      queue.innerHTML = "";
      all.filter(function (o) { return o.dataset.tenant === tenant.value; }).forEach(function (o) {
        o.textContent = o.dataset.queue;
        queue.add(o);
      });
      var mine = all.filter(function (o) { return o.dataset.tenant === tenant.value; });
      // the tenant's default queue comes first (the server orders them so)
      queue.value = keepChoice && mine.some(function (o) { return o.value === was; }) ? was : (mine[0] ? mine[0].value : "");
      showClasses(keepChoice);
    }
    tenant.addEventListener("change", function () { showQueues(false); });
    queue.addEventListener("change", function () { showClasses(false); });
    showQueues(true);
    queue.dataset.enhanced = "1";
  }
  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    submitForm();
    tick();
    setInterval(tick, 1000);
  });
  // live fragments swapped in by htmx: their times too
  document.addEventListener("htmx:load", function (e) { localTimes(e.target); tick(); });
  document.addEventListener("htmx:afterSwap", function () { localTimes(document); tick(); });
})();
