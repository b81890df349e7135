// The explorer page: the form becomes a `planner plan` search on the server (the CLI's own
// parser and loaders), then the frontier and the what-if strip are timed in the background.
(function () {
  "use strict";
  var $ = function (sel) { return document.querySelector(sel); };
  var state = {problem: null, cand: "plan", run: 0, configJson: null, configName: null,
               frontier: null, timer: null};

  function api(path, body) {
    var init = body === undefined ? {} : {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json"}};
    return fetch(path, init).then(function (r) {
      return r.json().then(function (v) {
        if (!r.ok) throw (v.error || {field: "", message: "HTTP " + r.status});
        return v;
      });
    }, function () { throw {field: "", message: "planner serve is not reachable"}; });
  }

  // A job's result, polling its progress into `show(fraction)`.
  function poll(id, show) {
    return new Promise(function (resolve, reject) {
      (function tick() {
        api("/api/job/" + id).then(function (j) {
          show(j.progress || 0);
          if (j.state === "done") resolve(j.result);
          else if (j.state === "failed") reject(j.error);
          else setTimeout(tick, 120);
        }, reject);
      })();
    });
  }

  function status(text, fraction) {
    $("#status-text").textContent = text;
    $("#progress").style.width = Math.round(100 * (fraction || 0)) + "%";
  }

  function clearErrors() {
    document.querySelectorAll(".err").forEach(function (e) { e.textContent = ""; });
    document.querySelectorAll(".bad").forEach(function (e) { e.classList.remove("bad"); });
  }

  function showError(err) {
    var field = err.field || "", box = document.querySelector('.err[data-for="' + field + '"]');
    if (!box || !field) box = $("#form-error");
    box.textContent = err.message;
    var input = document.getElementById("f-" + field);
    if (input) input.classList.add("bad");
  }

  function fill(select, values, keep) {
    values.forEach(function (v) {
      var o = document.createElement("option"); o.value = v; o.textContent = v;
      select.appendChild(o);
    });
    if (keep !== undefined) select.value = keep;
  }

  function formValues() {
    var form = {};
    document.querySelectorAll("#form [name]").forEach(function (el) {
      if (el.type === "radio" || el.type === "checkbox") return;
      if (el.value !== "") form[el.name] = el.value;
    });
    var picked = Array.prototype.slice.call(
      document.querySelectorAll('#f-frameworks input:checked')).map(function (c) { return c.value; });
    if (picked.length === 1) form.framework = picked[0];
    else if (picked.length > 1) form.frameworks = picked.join(",");
    if (form.cluster) {  // a preset brings its own GPUs and node shape
      delete form.gpu; delete form.gpus; delete form.gpus_per_node;
    } else {
      delete form.num_nodes;
    }
    if (state.configJson) {
      delete form.model;
      form.config_json = state.configJson;
      form.config_name = state.configName;
    }
    return form;
  }

  function fmt(x, digits) { return x === null || x === undefined ? "-" : (+x).toPrecision(digits || 4); }

  function renderPlan(v) {
    $("#plan-card").hidden = false;
    $("#command").textContent = v.command || "(a saved plan)";
    var s = v.selection;
    $("#plan-config").textContent = s.framework + ": " + s.config;
    $("#plan-step").textContent = s.step_time_text;
    $("#plan-step").dataset.seconds = s.step_time_s;
    $("#plan-tps").textContent = Math.round(s.tokens_per_s).toLocaleString();
    $("#plan-tps-unit").textContent = s.unit + "/s";
    $("#plan-cost-unit").textContent = "US$ per million " + s.unit;
    $("#plan-mfu").textContent = (100 * (s.mfu || 0)).toFixed(1) + "%";
    $("#plan-mem").textContent = s.peak_memory_gib.toFixed(1) + " of " + s.capacity_gib.toFixed(1) + " GiB";
    $("#plan-cost").textContent = s.usd_per_million_tokens === null ? "no price" : "$" + s.usd_per_million_tokens.toFixed(3);
    $("#plan-band").textContent = bandText(s.band);
    var ul = $("#plan-warnings"); ul.innerHTML = "";
    v.warnings.forEach(function (w) { var li = document.createElement("li"); li.textContent = w; ul.appendChild(li); });
    var body = $("#why tbody"); body.innerHTML = "";
    v.alternatives.forEach(function (a) {
      var tr = document.createElement("tr");
      [a.framework, a.config, a.verdict, fmt(a.step_time_s), a.peak_memory_gib === null ? "-" : a.peak_memory_gib.toFixed(1), a.reason]
        .forEach(function (t) { var td = document.createElement("td"); td.textContent = t; tr.appendChild(td); });
      if (a.selectable) {
        tr.className = "selectable"; tr.dataset.cand = "alt:" + a.i;
        tr.addEventListener("click", function () { select("alt:" + a.i); });
      }
      body.appendChild(tr);
    });
    $("#summary").textContent = v.summary;
  }

  function bandText(b) {
    if (!b || !b.fraction) return "no uncertainty band: no published run backs this GPU and trainer";
    return "uncertainty ± " + (100 * b.fraction).toFixed(0) + "%" +
      (b.extrapolated ? " (extrapolated)" : "") + ": " + b.basis;
  }

  function renderSelection(s) {
    state.cand = s.id;
    $("#selection-card").hidden = false;
    $("#sel-config").textContent = s.framework + ": " + s.config + (s.id.indexOf("whatif") === 0 ? " on " + s.gpus + " x " + s.gpu : "");
    $("#sel-config").dataset.cand = s.id;
    $("#sel-step").textContent = s.step_time_text;
    $("#sel-mem").textContent = s.peak_memory_gib.toFixed(1) + " of " + s.capacity_gib.toFixed(1) + " GiB";
    $("#sel-fits").textContent = s.fits ? "yes" : "no";
    $("#sel-band").textContent = bandText(s.band);
    $("#fig-memory").innerHTML = s.figures.memory;
    $("#fig-step").innerHTML = s.figures.step_time;
    $("#fig-timeline").innerHTML = s.figures.timeline;
    window.plannerFigures.attachAll($("#fig-timeline"));
    var d = $("#downloads"); d.innerHTML = "";
    s.downloads.forEach(function (t) {
      var b = document.createElement("button"); b.type = "button"; b.dataset.target = t;
      b.textContent = t === "plan" ? "plan JSON" : t + " file";
      b.addEventListener("click", function () { download(t); });
      d.appendChild(b);
    });
    document.querySelectorAll("tr.current, circle.pt.current").forEach(function (e) { e.classList.remove("current"); });
    var row = document.querySelector('tr[data-cand="' + s.id + '"]');
    if (row) row.classList.add("current");
    markFrontier();
  }

  function markFrontier() {
    if (state.cand.indexOf("front:") !== 0) return;
    var dot = document.querySelector('#frontier circle.pt[data-i="' + state.cand.slice(6) + '"]');
    if (dot) dot.classList.add("current");
  }

  function select(cand) {
    $("#download-error").textContent = "";
    return api("/api/select", {problem: state.problem, cand: cand}).then(renderSelection, function (e) {
      $("#download-error").textContent = e.message;
    });
  }

  function download(target) {
    $("#download-error").textContent = "";
    var q = "problem=" + encodeURIComponent(state.problem) + "&cand=" + encodeURIComponent(state.cand) +
      "&target=" + encodeURIComponent(target);
    fetch("/api/download?" + q).then(function (r) {
      if (!r.ok) return r.json().then(function (v) { throw v.error; });
      var name = (r.headers.get("Content-Disposition") || "").replace(/.*filename="([^"]+)".*/, "$1");
      return r.blob().then(function (blob) {
        var a = document.createElement("a");
        a.href = URL.createObjectURL(blob); a.download = name || target;
        document.body.appendChild(a); a.click(); a.remove();
      });
    }).catch(function (e) { $("#download-error").textContent = e.message || String(e); });
  }

  function renderFrontier() {
    if (!state.frontier) return;
    var cost = $("#fy-cost").checked && state.frontier.cost;
    $("#frontier").innerHTML = cost ? state.frontier.cost : state.frontier.time;
    $("#fy-cost").disabled = !state.frontier.cost;
    markFrontier();
  }

  function background(run) {
    $("#frontier-card").hidden = false; $("#whatif-card").hidden = false;
    $("#frontier").innerHTML = ""; $("#whatif").innerHTML = "";
    state.frontier = null;
    var front = api("/api/frontier", {problem: state.problem}).then(function (j) {
      return poll(j.job, function (f) { if (run === state.run) $("#frontier-status").textContent = "timing every configuration: " + Math.round(100 * f) + "%"; });
    }).then(function (v) {
      if (run !== state.run) return;
      state.frontier = v;
      $("#frontier-status").textContent = v.total.toLocaleString() + " configurations timed; " + v.points.toLocaleString() + " drawn";
      renderFrontier();
    }, function (e) { if (run === state.run) $("#frontier-status").textContent = e.message; });
    front.then(function () {
      if (run !== state.run) return;
      return api("/api/whatif", {problem: state.problem}).then(function (j) {
        return poll(j.job, function (f) { if (run === state.run) $("#whatif-status").textContent = "planning other GPU counts and types: " + Math.round(100 * f) + "%"; });
      }).then(function (v) {
        if (run !== state.run) return;
        $("#whatif-status").textContent = "";
        $("#whatif").innerHTML = v.svg;
      }, function (e) { if (run === state.run) $("#whatif-status").textContent = e.message; });
    });
  }

  function plan(body) {
    var run = ++state.run;
    clearErrors();
    status("searching", 0);
    var t0 = performance.now();
    return api("/api/plan", body || formValues()).then(function (j) {
      state.problem = j.problem;
      return poll(j.job, function (f) { if (run === state.run) status("searching", f); });
    }).then(function (v) {
      if (run !== state.run) return;
      status("plan found in " + ((performance.now() - t0) / 1000).toFixed(1) + " s (search " + v.search_seconds.toFixed(1) + " s)", 1);
      document.querySelector("main").classList.remove("stale");
      document.body.dataset.ready = String(run);
      renderPlan(v);
      renderSelection(v.selection);
      background(run);
    }, function (e) {
      if (run !== state.run) return;
      status("not planned: see the message in the form", 0);
      document.querySelector("main").classList.add("stale");
      document.body.dataset.ready = "error";
      showError(e);
    });
  }

  function later() {
    clearTimeout(state.timer);
    state.timer = setTimeout(function () { plan(); }, 500);
  }

  // A cluster preset and the GPU x count x per-node fields exclude each other.
  function clusterMode() {
    var preset = $("#f-cluster").value !== "";
    ["#f-gpu", "#f-gpus", "#f-gpus_per_node"].forEach(function (s) { $(s).disabled = preset; });
    $("#f-num_nodes").disabled = !preset;
  }

  function readFile(input, then) {
    var f = input.files[0];
    if (!f) return;
    if (f.size > 2 * 1024 * 1024) { showError({field: input.id === "f-config" ? "model" : "plan_json", message: "planner: error: " + f.name + " is over 2048 KiB"}); return; }
    var r = new FileReader();
    r.onload = function () { then(f.name, String(r.result)); };
    r.readAsText(f);
  }

  function start(opts) {
    fill($("#f-model"), opts.models); fill($("#f-gpu"), opts.gpus); fill($("#f-cluster"), opts.clusters);
    fill($("#f-precision"), opts.precisions.filter(function (p) { return p !== "bf16"; })); fill($("#f-preset"), opts.presets);
    fill($("#f-recompute"), opts.recompute); fill($("#f-schedule"), opts.schedules);
    opts.frameworks.forEach(function (f) {
      var l = document.createElement("label"), c = document.createElement("input");
      c.type = "checkbox"; c.value = f; c.id = "fw-" + f; l.appendChild(c); l.appendChild(document.createTextNode(" " + f));
      $("#f-frameworks").appendChild(l);
    });
    Object.keys(opts.defaults).forEach(function (k) { var el = document.getElementById("f-" + k); if (el) el.value = opts.defaults[k]; });
    clusterMode();
    $("#form").addEventListener("submit", function (ev) { ev.preventDefault(); clearTimeout(state.timer); plan(); });
    $("#form").addEventListener("change", function (ev) {
      if (ev.target.type === "file" || ev.target.name === "fy") return;
      if (ev.target.id === "f-model") { state.configJson = null; $("#config-name").textContent = ""; }
      if (ev.target.id === "f-cluster") clusterMode();
      later();
    });
    $("#form").addEventListener("input", function (ev) { if (ev.target.tagName === "INPUT" && ev.target.type !== "file") later(); });
    $("#f-config").addEventListener("change", function () {
      readFile($("#f-config"), function (name, text) {
        state.configJson = text; state.configName = name;
        $("#config-name").textContent = "using " + name;
        plan();
      });
    });
    $("#f-planfile").addEventListener("change", function () {
      readFile($("#f-planfile"), function (name, text) { plan({plan_json: text}); });
    });
    document.querySelectorAll('input[name="fy"]').forEach(function (r) { r.addEventListener("change", renderFrontier); });
    $("#frontier").addEventListener("click", function (ev) {
      var dot = ev.target.closest("circle.pt");
      if (dot) select("front:" + dot.dataset.i);
    });
    $("#whatif").addEventListener("click", function (ev) {
      var bar = ev.target.closest("[data-label]");
      if (bar) select("whatif:" + bar.dataset.i);
    });
    $("#zoom-in").addEventListener("click", function () { var s = $("#fig-timeline svg"); if (s && s.plannerZoom) s.plannerZoom(0.5); });
    $("#zoom-out").addEventListener("click", function () { var s = $("#fig-timeline svg"); if (s && s.plannerZoom) s.plannerZoom(2); });
    plan();
  }

  api("/api/options").then(start, function (e) { status(e.message, 0); });
})();
