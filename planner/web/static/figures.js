// The interactive part of planner.figures charts, shared by the explorer page and notebooks:
// a timeline zooms in time (mouse wheel or the +/- keys while hovered), pans (drag) and
// resets (double-click). Each op box carries its start and end in seconds (data-s, data-e).
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";

  function ticks(lo, hi, count) {
    var raw = (hi - lo) / count, p = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (m) { return m * p; })
      .find(function (s) { return s >= raw; });
    var out = [];
    for (var x = Math.ceil(lo / step) * step; x <= hi + step * 1e-9; x += step) out.push(x);
    return out;
  }

  function attach(svg) {
    if (svg.getAttribute("data-zoom-ready")) return;
    svg.setAttribute("data-zoom-ready", "1");
    var layer = svg.querySelector("g.zoom-layer");
    if (!layer) return;
    var span = +layer.dataset.span, left = +layer.dataset.left, right = +layer.dataset.right;
    var rects = Array.prototype.slice.call(layer.querySelectorAll("rect"));
    var labels = Array.prototype.slice.call(layer.querySelectorAll("text.op-label"));
    var axis = svg.querySelector("g.zoom-axis"), still = svg.querySelector("g.static-axis");
    var view = {lo: 0, hi: span};

    function px(t) { return left + (t - view.lo) / (view.hi - view.lo) * (right - left); }

    function draw() {
      rects.forEach(function (r, i) {
        var s = +r.dataset.s, e = +r.dataset.e, x0 = Math.max(px(s), left - 2),
          x1 = Math.min(px(e), right + 2), shown = x1 > left && x0 < right;
        r.setAttribute("x", x0); r.setAttribute("width", Math.max(0, x1 - x0));
        r.style.display = shown ? "" : "none";
        var t = labels[i];
        if (t) {
          t.setAttribute("x", (x0 + x1) / 2);
          t.style.display = shown && x1 - x0 > 14 ? "" : "none";
        }
      });
      var zoomed = view.lo > 0 || view.hi < span;
      if (still) still.style.display = zoomed ? "none" : "";
      if (!axis) return;
      while (axis.firstChild) axis.removeChild(axis.firstChild);
      if (!zoomed) return;
      var y = +axis.dataset.y;
      ticks(view.lo, view.hi, 6).forEach(function (t) {
        var l = document.createElementNS(SVGNS, "line");
        l.setAttribute("x1", px(t)); l.setAttribute("x2", px(t));
        l.setAttribute("y1", y); l.setAttribute("y2", y + 4); l.setAttribute("stroke", "#444");
        var s = document.createElementNS(SVGNS, "text");
        s.setAttribute("x", px(t)); s.setAttribute("y", y + 15);
        s.setAttribute("font-size", "10"); s.setAttribute("text-anchor", "middle");
        s.textContent = (+t.toPrecision(4)).toString();
        axis.appendChild(l); axis.appendChild(s);
      });
      var note = document.createElementNS(SVGNS, "text");
      note.setAttribute("x", right); note.setAttribute("y", y + 31);
      note.setAttribute("font-size", "10"); note.setAttribute("text-anchor", "end");
      note.textContent = "showing " + (+view.lo.toPrecision(4)) + " to " +
        (+view.hi.toPrecision(4)) + " s of " + (+span.toPrecision(4)) +
        " (double-click: all)";
      axis.appendChild(note);
    }

    function toTime(clientX) {
      var box = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
      var x = (clientX - box.left) * vb.width / box.width;
      return view.lo + (x - left) / (right - left) * (view.hi - view.lo);
    }

    function zoom(factor, at) {
      var w = Math.min(span, Math.max(span / 2000, (view.hi - view.lo) * factor));
      var lo = at - (at - view.lo) * w / (view.hi - view.lo);
      lo = Math.max(0, Math.min(span - w, lo));
      view = {lo: lo, hi: lo + w};
      draw();
    }

    svg.plannerZoom = function (factor, at) {
      zoom(factor, at === undefined ? (view.lo + view.hi) / 2 : at);
    };
    svg.plannerView = function () { return {lo: view.lo, hi: view.hi, span: span}; };
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      zoom(ev.deltaY > 0 ? 1.25 : 0.8, toTime(ev.clientX));
    }, {passive: false});
    var drag = null;
    svg.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, view: view}; });
    window.addEventListener("mouseup", function () { drag = null; });
    svg.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var box = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
      var dt = (ev.clientX - drag.x) * vb.width / box.width / (right - left) *
        (drag.view.hi - drag.view.lo);
      var w = drag.view.hi - drag.view.lo, lo = Math.max(0, Math.min(span - w, drag.view.lo - dt));
      view = {lo: lo, hi: lo + w};
      draw();
    });
    svg.addEventListener("dblclick", function () { view = {lo: 0, hi: span}; draw(); });
    draw();  // labels only on boxes wide enough to hold them
  }

  function attachAll(root) {
    (root || document).querySelectorAll('svg[data-figure="timeline"]').forEach(attach);
  }

  window.plannerFigures = {attach: attach, attachAll: attachAll};
  attachAll(document);
})();
