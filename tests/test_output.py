"""What the output says is what it means: units a user reads, one form of each flag, files
written where a user expects, reasons that are distinct, plots of a saved plan, and the
memory a plan leaves free."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

import hardware_profiles
from costmodel import GPU, Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import Infeasible, SpecError
from planner import plan
from planner.cli import main
from planner.result import Plan


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_what_would_fit_is_said_in_nodes_of_the_clusters_size() -> None:
    """Llama-3 405B does not fit on one node of 8 H100s: the advice counts nodes of 8 GPUs,
    and one-GPU nodes as nodes of 1 GPU, not as GPUs in one node."""
    model = ModelSpec.preset("llama-3-405b")
    job = Job(global_batch_size=64, seq_len=8192)
    with pytest.raises(Infeasible, match=r"or \d+ nodes of 8 GPUs \(\d+ GPUs\)"):
        plan(model, Cluster.preset("dgx-h100", num_nodes=1), job)
    single = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1)
    with pytest.raises(Infeasible, match=r"nodes of 1 GPU \(\d+ GPUs\)"):
        plan(ModelSpec.preset("llama-3-70b"), single, Job(global_batch_size=8, seq_len=8192))


def test_sequence_parallel_takes_on_off_or_a_bare_flag_everywhere() -> None:
    base = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "16", "--seq-len",
            "4096", "--tp", "2", "--json"]
    steps = {}
    for form in (["--sequence-parallel"], ["--sequence-parallel", "on"],
                 ["--sequence-parallel", "off"], []):
        code, out, _ = _run(["estimate", *base, *form])
        assert code == 0
        steps[" ".join(form)] = json.loads(out)["config"]["sequence_parallel"]
    assert steps == {"--sequence-parallel": True, "--sequence-parallel on": True,
                     "--sequence-parallel off": False, "": False}
    code, out, _ = _run(["plan", *base, "--sequence-parallel"])
    assert code == 0 and json.loads(out)["config"]["sequence_parallel"] is True


def test_calibrate_writes_the_users_fit_and_never_the_package(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("PLANNER_CONFIG_DIR", str(tmp_path / "conf"))
    shipped = hardware_profiles.calibrated_path("transfer")
    before = shipped.read_bytes()
    small = tmp_path / "runs.json"
    runs = json.loads((Path(__file__).parent.parent / "costmodel" / "data"
                       / "calibration.json").read_text())
    small.write_text(json.dumps({"runs": runs["runs"][:6]}))
    code, _, _ = _run(["calibrate", "--gpu", "a100-80gb", "--runs", str(small)])
    assert code == 0
    mine = hardware_profiles.user_calibrated_path("a100-80gb")
    assert mine.is_file() and str(mine).startswith(str(tmp_path))
    assert shipped.read_bytes() == before
    # The user's fit is the one the profile now takes.
    assert str(mine) in GPU.preset("a100-80gb").efficiency.source or \
        "planner calibrate" in GPU.preset("a100-80gb").efficiency.source
    fitted = hardware_profiles.load_file(mine)["efficiency"]["gemm"]
    assert GPU.preset("a100-80gb").efficiency.gemm == pytest.approx(fitted)


def test_the_why_not_list_does_not_repeat_a_reason_per_recomputed_layer_count() -> None:
    p = plan(ModelSpec.preset("llama-3-70b"), Cluster.preset("dgx-h100", num_nodes=8),
             Job(global_batch_size=512, seq_len=8192), top_k=12)
    ups = [a.config for a in p.runners_up if a.config is not None]
    keys = [(c.dp, c.tp, c.pp, c.cp, c.ep, c.zero_stage, c.micro_batch_size,
             c.sequence_parallel, c.recompute, c.pipeline_schedule, c.virtual_pipeline_stages)
            for c in ups]
    assert len(keys) == len(set(keys)), keys


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_a_saved_plan_is_plotted(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.json"
    assert _run(["plan", "--model", "gpt3-2.7b", "--gpus", "16", "--global-batch-size", "64",
                 "--seq-len", "2048", "--pp", "4", "-o", str(path)])[0] == 0
    for name in ("plan.png", "figs/plan.svg"):
        code, _, err = _run(["plot", str(path), "-o", str(tmp_path / name)])
        assert code == 0, err
        assert (tmp_path / name).stat().st_size > 10_000
    code, _, err = _run(["plot", str(path), "-o", str(tmp_path / "plan.txt")])
    assert code == 2 and ".png" in err
    code, _, err = _run(["plot", str(path), "-o", str(path / "under-a-file.png")])
    assert code == 2 and "cannot write the plot" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # long-running (several seconds); runs in CI with the rest
def test_plans_keep_the_memory_reserve_and_report_their_headroom() -> None:
    model, cluster = ModelSpec.preset("llama-3-70b"), Cluster.preset("dgx-h100", num_nodes=8)
    job = Job(global_batch_size=512, seq_len=8192)
    p = plan(model, cluster, job)
    e = p.estimate
    cap = cluster.gpu.memory_bytes
    assert e.peak_memory_bytes <= 0.95 * cap and e.within_reserve and not e.near_capacity
    d = json.loads(p.to_json())
    assert d["estimate"]["headroom_bytes"] == pytest.approx(cap - e.peak_memory_bytes)
    assert d["estimate"]["memory_reserve"] == 0.05 and d["warnings"] == []
    # Without a reserve the search may go fuller, never over the whole GPU.
    q = plan(model, cluster, Job(global_batch_size=512, seq_len=8192, memory_reserve=0.0))
    assert q.estimate.step_time_s <= e.step_time_s and q.estimate.fits
    with pytest.raises(SpecError, match="memory_reserve"):
        Job(global_batch_size=512, seq_len=8192, memory_reserve=1.5)


def test_a_config_above_95_percent_is_flagged_in_text_and_json(tmp_path: Path) -> None:
    """A GPU whose memory is just 3 % above the configuration's peak: it fits, and says it is
    too full to trust, in the estimate's text and JSON and when its saved plan is used."""
    model, cluster = ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-h100", num_nodes=1)
    job, cfg = Job(global_batch_size=8, seq_len=8192), ParallelConfig(dp=8, zero_stage=3)
    peak = estimate(model, cluster, job, cfg).peak_memory_bytes
    tight = dataclasses.replace(
        cluster, gpu=dataclasses.replace(cluster.gpu, memory_bytes=peak / 0.97))
    e = estimate(model, tight, job, cfg)
    assert e.fits and e.near_capacity and not e.within_reserve
    assert e.to_dict()["near_capacity"] is True
    assert re.search(r"warning: above 95% of the GPU's memory", e.summary())
    saved = Plan(model=model, cluster=tight, job=job, config=cfg, estimate=e)
    assert any("above 95%" in w for w in saved.warnings)
    path = tmp_path / "full.json"
    saved.to_json(path)
    code, _, err = _run(["emit", str(path), "--target", "torchtitan"])
    assert code == 0 and "fills 97% of the GPU's memory" in err


def test_a_small_models_times_are_read_in_milliseconds_and_microseconds() -> None:
    # A step under 0.1 s in milliseconds (3 significant digits), and a runner-up's loss
    # under a millisecond in microseconds: '0.000 s' and '0 ms' said nothing.
    from planner.alternatives import slower_reason

    small = ModelSpec.preset("gpt3-125m")
    cluster = Cluster.preset("dgx-h100", num_nodes=1)
    est = estimate(small, cluster, Job(global_batch_size=8, seq_len=512),
                   ParallelConfig(dp=8, micro_batch_size=1))
    assert est.step_time_s is not None and est.step_time_s < 0.1
    assert re.fullmatch(rf"{1e3 * est.step_time_s:.3g} ms \(± \d+ %\)", est.step_time_text)
    big = estimate(ModelSpec.preset("llama-3-8b"), cluster,
                   Job(global_batch_size=64, seq_len=8192), ParallelConfig(dp=8))
    assert re.fullmatch(r"\d+\.\d{3} s \(± \d+ %\)", big.step_time_text)
    terms = {"compute": 1e-3}
    why = slower_reason(1e-3, terms, 1.0, 1.02e-3, {"compute": 1.02e-3}, 1.0)
    assert why == "slower by 2.0% (20 us), mostly from compute (+20 us)"
    why = slower_reason(1.0, {"compute": 1.0}, 1.0, 1.5, {"compute": 1.5}, 1.0)
    assert why == "slower by 50.0% (500 ms), mostly from compute (+500 ms)"
