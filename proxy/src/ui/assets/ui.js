// oceancode session viewer: the chart's hover and click (a step's model
// view), and the live update.
// Embedded in the binary; served from the viewer's own path (the page's
// Content-Security-Policy allows no other script). It never builds markup
// from strings: a refreshed part is taken from the server's own escaped page.
"use strict";
(function () {
  function chartHover() {
    var fig = document.getElementById("chart");
    var dataEl = document.getElementById("chart-data");
    if (!fig || !dataEl) return;
    var svg = fig.querySelector("svg");
    var tip = document.getElementById("tip");
    var band = document.getElementById("hover");
    var data;
    try { data = JSON.parse(dataEl.textContent); } catch (e) { return; }
    if (!svg || !data.length) return;
    var L = 64, R = 12, W = 1000;
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) / box.width * W;
      var n = data.length;
      var i = n <= 1 ? 0 : Math.round((x - L) / (W - L - R) * (n - 1));
      i = Math.max(0, Math.min(n - 1, i));
      var d = data[i];
      tip.textContent = "step " + d[0] + ": window " + d[1].toLocaleString() +
        " · cache read " + d[2].toLocaleString() + " · write " + d[3].toLocaleString() +
        " · spend $" + d[4].toFixed(4) + (d[5] ? " · failed" : "");
      var bx = n <= 1 ? L + (W - L - R) / 2 : L + i * (W - L - R) / (n - 1);
      var bw = Math.max(2, (W - L - R) / Math.max(1, n));
      band.setAttribute("x", String(bx - bw / 2));
      band.setAttribute("width", String(bw));
      band.classList.add("on");
    });
    // A click on the chart (not on a cut marker) opens that step's model view.
    svg.addEventListener("click", function (ev) {
      if (ev.target.closest && ev.target.closest("a")) return;
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) / box.width * W;
      var n = data.length;
      var i = n <= 1 ? 0 : Math.round((x - L) / (W - L - R) * (n - 1));
      i = Math.max(0, Math.min(n - 1, i));
      location.assign(location.pathname + "?view=model&step=" + encodeURIComponent(String(data[i][0])) + "#conversation");
    });
    svg.addEventListener("mouseleave", function () {
      band.classList.remove("on");
      tip.textContent = "";
    });
  }

  function live() {
    var url = document.body.getAttribute("data-live");
    if (!url) return;
    var stamp = document.body.getAttribute("data-stamp");
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (j) {
          if (!j || j.stamp === stamp) return null;
          stamp = j.stamp;
          return fetch(location.href, { credentials: "same-origin", cache: "no-store" })
            .then(function (r) { return r.text(); })
            .then(function (text) {
              var doc = new DOMParser().parseFromString(text, "text/html");
              ["summary", "chart", "conversation", "cuts"].forEach(function (id) {
                var now = document.getElementById(id);
                var next = doc.getElementById(id);
                if (now && next) now.replaceWith(document.importNode(next, true));
              });
              document.body.setAttribute("data-stamp", stamp);
              chartHover();
            });
        })
        .catch(function () {})
        .then(function () { busy = false; });
    }, 1500);
  }

  document.addEventListener("DOMContentLoaded", function () {
    chartHover();
    live();
  });
})();
