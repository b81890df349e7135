"""The front door: explain, compare, frontier, sweeps, pipeline timelines, the progress bar,
model loading, Jupyter rendering, and the explain/compare commands."""

import io
import itertools
import json
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from inprocess import Result, run_planner

import planner
from costmodel.formulas.tables import evaluate
from planner import (
    Cluster,
    Job,
    ModelSpec,
    ParallelConfig,
    Progress,
    SpecError,
    compare,
    describe,
    estimate,
    explain,
    frontier,
    load_model,
    parse_config,
    plan,
    simulate,
    sweep,
    timeline,
)
from planner.explain import CHOICES
from planner.space import COLUMNS, arrays, spaces

HF = Path(__file__).parent / "data" / "hf_configs"
SMALL = ModelSpec.preset("gpt3-2.7b")
NODE = Cluster(gpu="a100-80gb", num_nodes=1, gpus_per_node=8)
JOB = Job(global_batch_size=16, seq_len=2048, framework="megatron")


def _brute(model: ModelSpec, cluster: Cluster, job: Job) -> tuple[np.ndarray, np.ndarray]:
    """Every configuration of the space as rows of COLUMNS, with its step time (inf when it
    does not fit), by timing all of them."""
    (j, space), = spaces(model, cluster, job)
    table = space.table
    res = evaluate(model, cluster, j, arrays(model, table), capacity=cluster.gpu.memory_bytes,
                   host_capacity=cluster.host_memory_bytes_per_gpu)
    return table, res.step_time


# ---------------------------------------------------------------- explain

@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_explain_matches_brute_force_per_value() -> None:
    """Each value's fastest configuration is the fastest row with that value (brute force)."""
    p = plan(SMALL, NODE, JOB, partition=False)
    why = explain(p)
    table, step = _brute(SMALL, NODE, JOB)
    assert np.nanmin(np.where(np.isfinite(step), step, np.nan)) == pytest.approx(
        p.estimate.step_time_s, rel=1e-9)
    codes = {"pipeline_schedule": {"1f1b": 0, "interleaved-1f1b": 1, "gpipe": 2,
                                   "zero-bubble": 3},
             "recompute": {"none": 0, "selective": 1, "full": 2},
             "offload": {"none": 0, "optimizer": 1, "optimizer+params": 2}}
    checked = 0
    for c in why.choices:
        if c.field not in CHOICES:
            continue  # a MoE job's routing (planner.routing): searched again, not a column
        want = p.config.expert_tp if c.field == "etp" else getattr(p.config, c.field)
        assert c.chosen == want
        col = table[:, COLUMNS.index(CHOICES[c.field])]
        for o in c.options:
            code = codes.get(c.field, {}).get(o.value, o.value)
            mask = col == int(code)
            best = step[mask].min()
            if o.verdict == "slower":
                assert o.step_time_s == pytest.approx(best, rel=1e-9)
                assert o.step_time_s >= p.estimate.step_time_s * (1 - 1e-12)
                assert getattr(o.config, c.field) == o.value
                checked += 1
            else:
                assert o.verdict == "does not fit" and not np.isfinite(best)
    assert checked >= 10
    text = why.summary()
    assert "why each choice" in text and f"tp={p.config.tp}" in text
    d = why.to_dict()
    assert {"config", "estimate", "choices"} <= set(d)
    json.dumps(d)


def test_explain_fixed_fields_and_frameworks() -> None:
    cons = planner.Constraints(fixed={"tp": 2}, frameworks=("megatron", "deepspeed"))
    p = plan(SMALL, NODE, JOB, constraints=cons)
    why = explain(p)
    tp = next(c for c in why.choices if c.field == "tp")
    assert tp.fixed and not tp.options
    fw = next(c for c in why.choices if c.field == "framework")
    assert fw.chosen == p.job.framework and len(fw.options) == 1
    with pytest.raises(SpecError, match="cannot explain field"):
        explain(p, fields=["colour"])


def test_explain_notes_an_unaligned_vocabulary() -> None:
    """GPT-2's vocabulary (50257) puts the LM head off cuBLAS's 16-byte grid: explain says so
    with the step the padded vocabulary (50304) would take, which is faster; Megatron-LM
    pads by itself and an aligned vocabulary gets no note."""
    node = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    job = Job(global_batch_size=64, seq_len=2048, framework="torchtitan")
    p = plan(ModelSpec.preset("gpt3-125m"), node, job)
    why = explain(p, fields=["tp"])
    (note,) = why.notes
    assert "50257" in note and "50304" in note
    padded = ModelSpec(**{**p.model.to_dict(), "vocab_size": 50304})
    assert estimate(padded, node, job, p.config).step_time_s < p.estimate.step_time_s
    assert note in why.summary() and why.to_dict()["notes"] == [note]
    mega = plan(ModelSpec.preset("gpt3-125m"), node, replace(job, framework="megatron"))
    assert explain(mega, fields=["tp"]).notes == ()
    aligned = plan(padded, node, job)
    assert explain(aligned, fields=["tp"]).notes == ()


# ---------------------------------------------------------------- compare

def test_parse_config_round_trips_describe() -> None:
    cfgs = [ParallelConfig(dp=2, tp=4, pp=2, zero_stage=1, sequence_parallel=True,
                           micro_batch_size=2, recompute="selective",
                           pipeline_schedule="interleaved-1f1b", virtual_pipeline_stages=2),
            ParallelConfig(dp=4, cp=2, zero_stage=3, sharding_group=2, offload="optimizer"),
            ParallelConfig(dp=1, tp=8, pp=4, recompute="full", recompute_num_layers=3,
                           pipeline_schedule="gpipe"),
            ParallelConfig(dp=1, pp=4, stage_layers=(10, 11, 8, 3), recompute="full",
                           stage_recompute_layers=(4, 3, 0, 0), pipeline_schedule="zero-bubble")]
    for cfg in cfgs:
        assert parse_config(describe(cfg)) == cfg
    assert parse_config("tp=8, pp=4 zero=1 sp", num_gpus=64).dp == 2
    for bad, msg in (("", "empty"), ("tpp=2", "unknown"), ("tp=two", "integer"),
                     ("tp=2 tp=4", "twice"), ("sp=maybe", "on or off"), ("tp=3", "divide"),
                     ("stage_layers=3", "list")):
        with pytest.raises(SpecError, match=msg):
            parse_config(bad, num_gpus=8)


def test_compare_candidates_equal_estimate_and_plan() -> None:
    big = replace(NODE, num_nodes=2)
    cmp = compare(SMALL, [NODE, big], JOB, ["tp=2 pp=1", None, "tp=3"])
    assert len(cmp.candidates) == 6
    first = cmp.candidates[0]
    assert first.label.endswith(": tp=2 pp=1") and not first.searched
    cfg = ParallelConfig(dp=4, tp=2)
    assert first.config == cfg
    assert first.estimate.step_time_s == estimate(SMALL, NODE, JOB, cfg).step_time_s
    searched = cmp.candidates[4]
    assert searched.searched and searched.cluster.num_gpus == 16
    assert searched.estimate.step_time_s == plan(SMALL, big, JOB).estimate.step_time_s
    bad = cmp.candidates[2]
    assert bad.estimate is None and bad.error.startswith("invalid:")
    rows = cmp.rows()
    assert rows[0]["vs first"] == "1.00x" and rows[2]["step"] == "-"
    assert "tp=3" in cmp.table() and "<table>" in cmp._repr_html_()
    json.dumps(cmp.to_dict())
    with pytest.raises(SpecError, match="unknown"):
        compare(SMALL, NODE, JOB, ["tpp=2"])


# ---------------------------------------------------------------- frontier and sweeps

def test_frontier_is_the_whole_space() -> None:
    front = frontier(SMALL, NODE, JOB, max_points=50)
    table, _step = _brute(SMALL, NODE, JOB)
    assert front.total == len(table)
    assert len(front.step_time_s) <= 50 + len(front.pareto)
    p = plan(SMALL, NODE, JOB, partition=False)
    fits = front.step_time_s[front.fits]
    assert fits.min() == pytest.approx(p.estimate.step_time_s, rel=1e-9)
    mem = front.peak_memory_bytes[front.pareto]
    st = front.step_time_s[front.pareto]
    assert np.all(np.diff(mem) >= 0) and np.all(np.diff(st) < 0)  # non-dominated
    assert len(front.pareto_configs) == len(front.pareto)
    # The frontier's times are the estimates (pipelines played out), not lower bounds.
    for cfg, t in list(zip(front.pareto_configs, st, strict=True))[:6]:
        assert estimate(SMALL, NODE, JOB, cfg).step_time_s == pytest.approx(t, rel=1e-9)


def test_sweeps() -> None:
    pts = sweep(SMALL, NODE, JOB, "num_gpus", [8, 16])
    assert [p.cluster.num_gpus for p in pts] == [8, 16]
    assert pts[1].plan.estimate.step_time_s == plan(SMALL, replace(NODE, num_nodes=2),
                                                    JOB).estimate.step_time_s
    slow, fast = sweep(SMALL, replace(NODE, num_nodes=4), JOB, "inter_node_gbps", [1, 100])
    assert slow.plan.estimate.step_time_s >= fast.plan.estimate.step_time_s
    assert slow.cluster.inter_node_link.bandwidth_bytes_per_s == 1e9
    gpus = sweep(SMALL, NODE, JOB, "gpu", ["a100-40gb", "h100-sxm"])
    assert gpus[1].cluster.gpu.name == "h100-sxm"
    tiny = sweep(ModelSpec.preset("llama-3-70b"), NODE, JOB, "gpu", ["a100-40gb"])
    assert tiny[0].plan is None and "fits" in tiny[0].error
    for over, values, msg in (("num_gpus", [12], "multiple"), ("inter_node_gbps", [0], "positive"),
                              ("colour", [1], "cannot sweep"), ("num_gpus", [], "at least")):
        with pytest.raises(SpecError, match=msg):
            sweep(SMALL, NODE, JOB, over, values)


# ---------------------------------------------------------------- timelines

@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1),
                                             ("interleaved-1f1b", 2),
                                             ("interleaved-1f1b", 4), ("zero-bubble", 1)])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 32), (2, 2)])
def test_simulated_schedules_match_the_bubble_formulas(schedule: str, v: int, p: int,
                                                       m: int) -> None:
    """Uniform stages, forward 1 s and backward 2 s per micro-batch: GPipe and 1F1B take
    (m + p - 1)(F + B) (Huang et al. 2019; Fan et al. 2021), interleaved 1F1B
    m (F + B) + (p - 1)(F + B) / v (Narayanan et al. 2021, Sec. 2.2.2), ZB-H1
    m (F + B) + (p - 1) F (Qi et al. 2024, with B and W of equal length)."""
    tl = simulate([1.0] * p, [2.0] * p, m, schedule, v)
    want = {"gpipe": m * 3 + (p - 1) * 3, "1f1b": m * 3 + (p - 1) * 3,
            "interleaved-1f1b": m * 3 + (p - 1) * 3 / v, "zero-bubble": m * 3 + (p - 1)}
    assert tl.makespan == pytest.approx(want[schedule])
    _check_dependencies(tl, p, m, v)


def _check_dependencies(tl: planner.Timeline, p: int, m: int, v: int) -> None:
    """Every op runs once, ranks never overlap, and each op starts after what it needs."""
    end = {}
    for o in tl.ops:
        end[(o.kind, o.micro_batch, o.chunk * p + o.stage)] = o
    kinds = {o.kind for o in tl.ops}
    assert len(tl.ops) == len(kinds) * p * m * v == len(end)
    last = p * v - 1
    for (kind, mb, vs), o in end.items():
        need = {"F": ("F", mb, vs - 1) if vs else None,
                "B": ("B", mb, vs + 1) if vs < last else ("F", mb, vs),
                "W": ("B", mb, vs)}[kind]
        if need is not None:
            assert o.start >= end[need].end - 1e-12
    for r in range(p):
        ops = sorted((o for o in tl.ops if o.stage == r), key=lambda o: o.start)
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(ops))


def test_uneven_stages_and_bad_input() -> None:
    tl = simulate([1.0, 2.0, 1.0], [2.0, 4.0, 3.0], 6, "1f1b")
    _check_dependencies(tl, 3, 6, 1)
    assert tl.makespan >= 6 * 6.0  # the slowest rank's work
    assert 0 < tl.bubble_fraction < 1
    for args, msg in ((([1.0], [1.0, 2.0], 2), "one time per"), (([1.0], [1.0], 0), "at least"),
                      (([1.0], [1.0], 2, "2f2b"), "unknown"),
                      (([1.0], [1.0], 2, "1f1b", 2), "interleaved")):
        with pytest.raises(SpecError, match=msg):
            simulate(*args)


def test_timeline_of_an_estimate_equals_its_pipeline_time() -> None:
    """Korthikanti et al. 2022's GPT-3 175B setup: the simulated schedule's makespan is the
    step time before gradient sync, optimizer and offload (the model's closed form)."""
    model = ModelSpec.preset("gpt3-175b")
    cluster = Cluster.preset("selene", num_nodes=8)
    job = Job(global_batch_size=64, seq_len=2048, framework="megatron")
    for v in (1, 3):
        cfg = ParallelConfig(dp=1, tp=8, pp=8, sequence_parallel=True, recompute="selective",
                             virtual_pipeline_stages=v)
        est = estimate(model, cluster, job, cfg)
        bd = est.time_breakdown_s
        pipeline = est.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
        tl = timeline(model, cluster, job, cfg)
        assert tl.makespan == pytest.approx(pipeline, rel=1e-9)
        assert tl.num_micro_batches == est.num_micro_batches


# ---------------------------------------------------------------- progress bar

class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_progress_bar_shows_only_after_a_second() -> None:
    out, clock = io.StringIO(), _Clock()
    bar = Progress("searching", stream=out, enabled=True, clock=clock)
    bar(0.5)
    assert out.getvalue() == ""
    clock.t = 1.5
    bar(0.25)  # never goes backwards
    assert "searching [" in out.getvalue() and " 50%" in out.getvalue()
    bar.close()
    assert out.getvalue().endswith("\r")
    quiet = io.StringIO()
    q = Progress(stream=quiet, clock=clock)  # a StringIO is no terminal
    clock.t = 5.0
    q(1.0)
    assert quiet.getvalue() == ""


def test_plan_reports_progress() -> None:
    seen = []
    p = plan(SMALL, NODE, JOB, progress=seen.append)
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)
    assert p.config == plan(SMALL, NODE, JOB).config


# ---------------------------------------------------------------- models

def test_load_model_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mymodels.py").write_text(textwrap.dedent('''
        import dataclasses
        from planner import ModelSpec
        spec = dataclasses.replace(ModelSpec.preset("llama-3-8b"), name="mine", num_layers=4)
        hf = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4,
              "vocab_size": 1000, "n_positions": 512}
        def build():
            return spec
        def needs(x):
            return spec
        class FakeConfig:
            model_type = "gpt2"
            def to_dict(self):
                return dict(hf)
        class FakeHFModel:
            config = FakeConfig()
        model = FakeHFModel()
        number = 3
        def broken():
            raise RuntimeError("boom")
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)  # not another test's module
    assert load_model("mymodels:spec").num_layers == 4
    assert load_model("mymodels:build").name == "mine"
    assert load_model("mymodels:hf").num_layers == 2
    assert load_model("mymodels:model").num_params() == load_model("mymodels:hf").num_params()
    assert load_model("llama-3-8b") == ModelSpec.preset("llama-3-8b")
    assert load_model(str(HF / "llama-3-8b.json")).num_params() == 8_030_261_248
    for spec, msg in (("nosuchmodule:x", "cannot import"), ("mymodels:nothing", "no attribute"),
                      ("mymodels:number", "is a int"), ("mymodels:needs", "without arguments"),
                      ("mymodels:broken", "RuntimeError: boom"), (":x", "module:attr"),
                      ("", "empty"), ("llama-3-80b", "unknown model")):
        with pytest.raises(SpecError, match=msg):
            load_model(spec)


# ---------------------------------------------------------------- Jupyter

def test_html_reprs() -> None:
    p = plan(SMALL, NODE, JOB)
    html = p._repr_html_()
    assert html.count("<table>") >= 3 and "Why not" in html and describe(p.config) in html
    assert f"{p.estimate.step_time_s:.3f} s" in html
    est_html = estimate(SMALL, NODE, JOB, ParallelConfig(dp=2, tp=2, pp=2))._repr_html_()
    assert "Pipeline stages" in est_html and "Step time" in est_html
    weird = replace(SMALL, name="<b>x</b>")
    assert "<b>x</b>" not in plan(weird, NODE, JOB)._repr_html_()
    assert str(p) == p.summary()


# ---------------------------------------------------------------- the commands

def _run(*args: str, cwd: Path | None = None) -> Result:
    return run_planner(*args, cwd=cwd)


BASE = ["--model", "gpt3-2.7b", "--gpus", "8", "--gpu", "a100-80gb", "--global-batch-size",
        "16", "--seq-len", "2048", "--framework", "megatron"]


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_cli_explain_from_flags_and_file(tmp_path: Path) -> None:
    r = _run("explain", *BASE)
    assert r.returncode == 0, r.stderr
    assert "why each choice" in r.stdout
    saved = tmp_path / "p.json"
    assert _run("plan", *BASE, "-o", str(saved)).returncode == 0
    r = _run("explain", str(saved), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"config", "estimate", "choices"} <= set(d)
    r = _run("explain")
    assert r.returncode == 2 and "--model is required" in r.stderr


def test_cli_compare(tmp_path: Path) -> None:
    r = _run("compare", *BASE, "--config", "tp=2", "--config", "tp=8 pp=1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [c["config"]["tp"] for c in d["candidates"]] == [2, 8]
    assert all(c["estimate"]["step_time_s"] > 0 for c in d["candidates"])
    r = _run("compare", "--model", "gpt3-2.7b", "--gpus", "8", "--gpus", "16",
             "--gpu", "a100-80gb", "--global-batch-size", "16", "--seq-len", "2048")
    assert r.returncode == 0, r.stderr
    assert "8xa100-80gb" in r.stdout and "16xa100-80gb" in r.stdout
    r = _run("compare", "--model", "llama-3-70b", "--gpus", "8", "--gpu", "a100-40gb",
             "--global-batch-size", "16", "--seq-len", "4096")
    assert r.returncode == 3 and "infeasible" in r.stderr and "Traceback" not in r.stderr
    r = _run("compare", *BASE, "--config", "tp=")
    assert r.returncode == 2 and "integer" in r.stderr
    r = _run("compare", "--model", "gpt3-2.7b", "--cluster", "selene", "--num-nodes", "1",
             "--num-nodes", "2", "--inter-node", "roce-400g", "--global-batch-size", "16",
             "--seq-len", "2048", "--config", "tp=8", "--json")
    assert r.returncode == 0, r.stderr
    got = [(c["cluster"]["num_nodes"], c["cluster"]["inter_node_link"])
           for c in json.loads(r.stdout)["candidates"]]
    assert got == [(1, "roce-400g"), (2, "roce-400g")]
    r = _run("compare", *BASE, "--num-nodes", "2")
    assert r.returncode == 2 and "--num-nodes goes with --cluster" in r.stderr
