"""The explorer (``planner serve``) without a browser: the form is the CLI's command line (the
same plan, the same one-line errors), hostile input is refused before anything is loaded,
the figures hold the estimate's numbers, and the HTTP API answers as documented. The page
itself is driven in Chromium by tests/test_explorer_browser.py."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import run_planner

from costmodel.formulas.memory import TERMS
from costmodel.units import GIB
from planner import SpecError, estimate, figures, frontier, load_model, timeline
from planner.emit import read_back
from planner.explore import what_if, what_if_label
from planner.web.problems import MAX_UPLOAD_BYTES, FormError, form_argv, load
from planner.web.server import QUICK_START, Explorer, make_server

#: The README's quick-start job as CLI flags (README.md, "Quick start").
QUICK = ["--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--gpus-per-node",
         "8", "--global-batch-size", "512", "--seq-len", "8192"]
SMALL = {"model": "llama-3-8b", "gpus": "8", "global_batch_size": "32", "seq_len": "2048"}


def wait(ex: Explorer, job: str, seen: list[float] | None = None) -> dict[str, Any]:
    """A job's final state, recording the progress it reported on the way."""
    for _ in range(12000):
        state = ex.job(job)
        if seen is not None:
            seen.append(state["progress"])
        if state["state"] != "running":
            return state
        time.sleep(0.005)
    raise AssertionError("job did not finish in 60 s")


@pytest.fixture(scope="module")
def quick() -> tuple[Explorer, dict[str, Any]]:
    ex = Explorer()
    started = ex.post("/api/plan", dict(QUICK_START))
    done = wait(ex, started["job"])
    assert done["state"] == "done", done
    return ex, done["result"]


def test_the_form_is_the_quick_start_command_and_plans_as_the_cli(quick: Any) -> None:
    """The page's defaults are the README's quick start; its plan equals `planner plan
    --json` for the same flags: configuration, trainer and step time."""
    ex, view = quick
    assert sorted(form_argv(dict(QUICK_START))[1:]) == sorted(QUICK)
    cli = run_planner("plan", *QUICK, "--json")
    assert cli.returncode == 0, cli.stderr
    d = json.loads(cli.stdout)
    p = ex.problem(view["problem"]).plan
    assert p is not None and p.config.to_dict() == d["config"]
    assert p.job.framework == d["framework"]
    assert view["selection"]["step_time_s"] == d["estimate"]["step_time_s"]
    assert view["selection"]["config_fields"] == d["config"]
    assert view["command"] == "planner " + " ".join(form_argv(dict(QUICK_START)))
    # The CLI's own words: the summary and each why-not reason.
    assert view["summary"] == p.summary(rows=12)
    assert [a["reason"] for a in view["alternatives"]] == [a.reason for a in p.alternatives]


BASE = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "32"]


@pytest.mark.parametrize(("form", "field", "flags"), [
    ({**SMALL, "gpus": "-3"}, "gpus", [*BASE[:3], "-3", *BASE[4:], "--seq-len", "2048"]),
    ({**SMALL, "seq_len": "abc"}, "seq_len", [*BASE, "--seq-len", "abc"]),
    ({**SMALL, "gpus": "12"}, "gpus", [*BASE[:3], "12", *BASE[4:], "--seq-len", "2048"]),
    ({**SMALL, "max": "pp=x"}, "max", [*BASE, "--seq-len", "2048", "--max", "pp=x"]),
    ({k: v for k, v in SMALL.items() if k != "seq_len"}, "seq_len", BASE),
    ({**SMALL, "precision": "fp7"}, "precision", [*BASE, "--seq-len", "2048", "--precision",
                                                  "fp7"]),
    # 64 trays of NVL72 racks: the refusal names the domain flag, so its field.
    ({"model": "llama-3-8b", "cluster": "gb200-nvl72", "num_nodes": "64",
      "global_batch_size": "256", "seq_len": "2048"}, "gpus_per_domain",
     ["--model", "llama-3-8b", "--cluster", "gb200-nvl72", "--num-nodes", "64",
      "--global-batch-size", "256", "--seq-len", "2048"]),
])
def test_bad_input_gets_the_cli_line_at_its_field(form: dict[str, str], field: str,
                                                 flags: list[str]) -> None:
    """A bad value gets exactly the line the CLI prints for the same flags, attributed to
    the field whose flag it names."""
    with pytest.raises(FormError) as err:
        load(form)
    cli = run_planner("plan", *flags)
    assert cli.returncode == 2
    assert err.value.message == cli.stderr.strip()
    assert err.value.field == field


def test_the_domain_field_is_the_domain_flag() -> None:
    form = {"model": "llama-3-8b", "cluster": "gb200-nvl72", "num_nodes": "64",
            "gpus_per_domain": "64", "global_batch_size": "256", "seq_len": "2048"}
    argv = form_argv(form)
    assert argv[argv.index("--gpus-per-domain") + 1] == "64"
    assert load(form).cluster.scale_up == 64


def test_a_search_error_names_the_degree() -> None:
    """An error the search raises (not the parser) still lands next to its field."""
    ex = Explorer()
    done = wait(ex, ex.post("/api/plan", {**SMALL, "tp": "3"})["job"])
    assert done["state"] == "failed"
    assert done["error"]["field"] == "tp"
    cli = run_planner("plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch-size",
                      "32", "--seq-len", "2048", "--tp", "3")
    assert done["error"]["message"] == cli.stderr.strip()


@pytest.mark.parametrize("name", ["os:system", "planner.examples:ViT", "/etc/passwd",
                                  "../config.json", "x.json"])
def test_the_model_field_never_names_code_or_files(name: str) -> None:
    """Only presets (or an uploaded config.json's text): nothing is imported or read."""
    before = set(sys.modules)
    with pytest.raises(FormError, match="not a model preset") as err:
        load({**SMALL, "model": name})
    assert err.value.field == "model"
    assert set(sys.modules) == before


@pytest.mark.parametrize(("field", "value"), [("gpu", "../../etc/passwd"),
                                              ("cluster", "/tmp/cluster.toml")])
def test_profiles_are_names_not_paths(field: str, value: str) -> None:
    with pytest.raises(FormError, match="is not a") as err:
        load({**SMALL, field: value})
    assert err.value.field == field


def test_an_uploaded_config_is_json_data(tmp_path: Any) -> None:
    """A config.json is parsed as JSON (no code), size-limited, and planned as the CLI plans
    the same file; the command line names the upload, not the server's temporary path."""
    config = (
        '{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, '
        '"num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8, '
        '"vocab_size": 32000, "max_position_embeddings": 4096}')
    form = {k: v for k, v in SMALL.items() if k != "model"}
    problem = load({**form, "config_json": config, "config_name": "my.json"})
    assert problem.model.num_layers == 8
    assert "--model my.json" in problem.command
    path = tmp_path / "config.json"
    path.write_text(config)
    cli = run_planner("plan", "--model", str(path), "--gpus", "8", "--global-batch-size",
                      "32", "--seq-len", "2048", "--json")
    ex = Explorer()
    view = wait(ex, ex.post("/api/plan", {**form, "config_json": config})["job"])["result"]
    assert view["selection"]["config_fields"] == json.loads(cli.stdout)["config"]
    for bad, words in (("[1]", "not a JSON object"), ("{oops", "is not JSON"),
                       ('{"a": "' + "x" * MAX_UPLOAD_BYTES + '"}', "over")):
        with pytest.raises(FormError, match=words) as err:
            load({**form, "config_json": bad})
        assert err.value.field == "model"


def test_figures_hold_the_estimates_numbers() -> None:
    """Each memory box is one term of one stage (their sum is the stage's memory); the
    step-time bars are the breakdown, hidden communication drawn apart; the timeline has a
    box per op; the frontier a dot per configuration kept."""
    model = load_model("llama-3-8b")
    ex = Explorer()
    view = wait(ex, ex.post("/api/plan", {**SMALL, "pp": "2"})["job"])["result"]
    p = ex.problem(view["problem"]).plan
    job, cfg, est = p.training()
    mem = figures.memory_chart(est)
    boxes = re.findall(r'data-term="(\w+)" data-stage="(\d+)" data-gib="([\d.]+)"', mem.svg)
    assert {int(s) for _, s, _ in boxes} == {0, 1}
    for s in est.stages:
        drawn = sum(float(g) for t, st, g in boxes if int(st) == s.stage)
        total = sum(getattr(s.memory, f"{t}_bytes") for t in TERMS) / GIB
        assert drawn == pytest.approx(total, rel=1e-3)
    bars = dict(re.findall(r'data-term="(\w+)" data-seconds="([\d.e-]+)"',
                           figures.step_time_chart(est).svg))
    for term, seconds in bars.items():
        assert float(seconds) == pytest.approx(est.time_breakdown_s[term], rel=1e-5, abs=1e-9)
    tl = timeline(model, p.cluster, job, cfg)
    assert figures.timeline_chart(tl).svg.count('data-kind="') == len(tl.ops)
    front = frontier(model, p.cluster, job, max_points=300, keep_configs=True)
    fig = figures.frontier_chart(front, plan=est)
    assert fig.svg.count('class="pt"') == len(front.step_time_s) == len(front.configs)
    # Every configuration kept re-estimates to the step time drawn.
    i = int(front.pareto[0])
    j = job if front.frameworks[i] == job.framework else None
    assert j is not None
    assert estimate(model, p.cluster, j, front.configs[i]).step_time_s == \
        pytest.approx(float(front.step_time_s[i]), rel=1e-9)
    with pytest.raises(SpecError, match="needs the GPU's price"):
        figures.frontier_chart(front, cost=True, usd_per_gpu_hour=None)


def test_a_figure_saves_and_shows_in_a_notebook(tmp_path: Any) -> None:
    ex = Explorer()
    view = wait(ex, ex.post("/api/plan", dict(SMALL))["job"])["result"]
    est = ex.problem(view["problem"]).plan.estimate
    fig = figures.memory_chart(est)
    fig.save(tmp_path / "m.svg")
    assert (tmp_path / "m.svg").read_text().startswith("<svg")
    html = fig._repr_html_()
    assert fig.svg in html and "plannerFigures" in html


def test_what_if_ranks_other_counts_and_gpus() -> None:
    model = load_model("llama-3-8b")
    problem = load(dict(SMALL))
    points = what_if(model, problem.cluster, problem.job, gpu_counts=[16], gpus=["h200"])
    # The job as asked first.
    assert [what_if_label(p) for p in points] == ["8 x h100-sxm", "16 x h100-sxm", "8 x h200"]
    assert points[0].cluster == problem.cluster and all(p.plan is not None for p in points)
    svg = figures.whatif_chart(points, [what_if_label(p) for p in points], 0).svg
    assert svg.count('data-label="8 x h200"') == 2  # ranked by time and by cost


def test_jobs_report_progress_and_the_views_are_cached() -> None:
    ex = Explorer()
    view = wait(ex, ex.post("/api/plan", {**SMALL, "gpus": "16"})["job"])["result"]
    seen: list[float] = []
    done = wait(ex, ex.post("/api/frontier", {"problem": view["problem"]})["job"], seen)
    assert done["state"] == "done" and done["result"]["total"] > 1000
    assert 0 < max(seen) <= 1 and seen == sorted(seen)
    problem = ex.problem(view["problem"])
    assert problem.frontier is not None
    again = wait(ex, ex.post("/api/frontier", {"problem": view["problem"]})["job"])
    assert again["result"]["time"] == done["result"]["time"]
    sel = ex.post("/api/select", {"problem": view["problem"], "cand": "front:0"})
    assert sel["config"] and sel["figures"]["memory"] != view["selection"]["figures"]["memory"]
    with pytest.raises(FormError, match="unknown selection"):
        ex.post("/api/select", {"problem": view["problem"], "cand": "front:x"})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _get(url: str) -> tuple[int, bytes, Any]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _post(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_serves_only_the_page_and_its_files(server: str) -> None:
    status, body, _ = _get(server + "/")
    assert status == 200 and b'src="/static/app.js"' in body
    assert b"http://" not in body and b"https://" not in body  # nothing from the internet
    for name in ("app.js", "figures.js", "style.css"):
        status, body, _ = _get(f"{server}/static/{name}")
        assert status == 200 and b"https://" not in body
    for path in ("/static/../server.py", "/static/%2e%2e/server.py", "/static/index.htm",
                 "/api/nothing", "/etc/passwd"):
        assert _get(server + path)[0] == 404
    options = json.loads(_get(server + "/api/options")[1])
    assert options["defaults"] == QUICK_START and "llama-3-70b" in options["models"]


def test_http_errors_are_one_line(server: str) -> None:
    status, v = _post(server + "/api/plan", b"{not json")
    assert status == 400 and v["error"]["message"] == "planner: error: the request is not JSON"
    status, v = _post(server + "/api/plan", json.dumps({**SMALL, "gpus": "x"}).encode())
    assert status == 400 and v["error"]["field"] == "gpus"
    assert "\n" not in v["error"]["message"] and "Traceback" not in v["error"]["message"]
    status, v = _post(server + "/api/select", json.dumps({"problem": "nope"}).encode())
    assert status == 400 and "search again" in v["error"]["message"]


def test_http_downloads_the_plan_and_each_trainers_file(server: str) -> None:
    status, v = _post(server + "/api/plan", json.dumps(SMALL).encode())
    assert status == 200
    for _ in range(600):
        state = json.loads(_get(f"{server}/api/job/{v['job']}")[1])
        if state["state"] != "running":
            break
        time.sleep(0.05)
    assert state["state"] == "done", state
    q = f"{server}/api/download?problem={v['problem']}&cand=plan&target="
    status, body, headers = _get(q + "torchtitan")
    assert status == 200 and 'filename="' in headers["Content-Disposition"]
    model = load_model("llama-3-8b")
    back = read_back("torchtitan", body.decode(), model)
    assert back.config.tp == state["result"]["selection"]["config_fields"]["tp"]
    assert tomllib.loads(body.decode())["parallelism"]
    status, body, _ = _get(q + "plan")
    assert json.loads(body)["config"] == state["result"]["selection"]["config_fields"]
    assert _get(q + "nothing")[0] == 400


def test_plan_view_of_a_saved_plan(quick: Any) -> None:
    """A plan saved as JSON reopens with its configuration, re-estimated."""
    ex, view = quick
    text = ex.problem(view["problem"]).plan.to_json()
    again = wait(ex, ex.post("/api/plan", {"plan_json": text})["job"])["result"]
    assert again["selection"]["config_fields"] == view["selection"]["config_fields"]
    assert again["command"] == ""
    for bad in ("{}", "/etc/passwd", str(Path(__file__))):  # text, never a path to read
        with pytest.raises(FormError) as err:
            ex.post("/api/plan", {"plan_json": bad})
        assert err.value.field == "plan_json"
        assert "planner-serve-" not in err.value.message
    assert "the plan is not valid JSON" in err.value.message


def test_serve_refuses_a_bad_port_in_one_line() -> None:
    r = run_planner("serve", "--port", "70000")
    assert r.returncode == 2 and "is not a port number" in r.stderr
    srv = make_server("127.0.0.1", 0)
    try:  # a port already taken
        r = run_planner("serve", "--port", str(srv.server_address[1]))
        assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        srv.server_close()
