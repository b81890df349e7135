"""Published runs, `planner validate` and `planner calibrate`."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hardware_profiles
from costmodel.hardware import GPU
from costmodel.published import compare, default_runs_path, load_runs
from planner.cli import main


def test_calibration_set_reads_with_the_sc21_script_settings() -> None:
    runs = {r.id: r for r in load_runs()}
    shared = json.loads(default_runs_path().read_text())["runs"]
    assert set(runs) == {r["id"] for r in shared}
    # NVIDIA/Megatron-LM@6985e589 examples/sc21/run_table_1.sh: 76.1B runs MBS=2 with 5 layers
    # per virtual stage (60 layers / pp 4 / 5 = 3 chunks); 1.7B runs MBS=16 on torch DDP.
    r = runs["megatron2021_t1_76.1B"]
    assert r.config.micro_batch_size == 2 and r.config.virtual_pipeline_stages == 3
    assert r.job.precision == "fp16" and not r.job.overlap_grad_reduce
    assert runs["megatron2021_t1_1.7B"].config.micro_batch_size == 16
    # Korthikanti et al. 2022 Table 5: 1T full recompute 94.42 s per iteration.
    k = runs["korthikanti2022_1T_full_recompute"]
    assert k.measure == "iteration_time_s" and k.measured == 94.42
    assert k.cluster.num_gpus == 512


def test_heldout_runs_predict_and_are_not_in_the_fit() -> None:
    held = load_runs(default_runs_path("heldout"))
    assert len(held) >= 15
    assert not {r.id for r in held} & {r.id for r in load_runs()}
    comps = compare(held)
    assert all(c.predicted > 0 for c in comps)
    assert {r.job.framework for r in held} == {"megatron", "deepspeed", "torchtitan"}


def test_validate_json_reports_every_run_and_the_summary(capsys) -> None:
    assert main(["validate", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 18
    assert {"megatron2021", "korthikanti2022", "all"} <= set(out["summary"])
    row = out["runs"][0]
    assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1)
    # Regression guard on the shipped calibration (the targets are printed by
    # benchmarks/step_time_accuracy.py): the fit must stay within a few percent.
    assert out["summary"]["all"]["mean_abs_error"] < 0.05


def test_calibrate_writes_a_fit_with_provenance(tmp_path: Path, capsys) -> None:
    rows = json.loads(default_runs_path().read_text())["runs"]
    small = tmp_path / "runs.json"
    small.write_text(json.dumps({"runs": [r for r in rows if "22B" in r["id"]
                                          or "175B" in r["id"]]}))
    out = tmp_path / "a100.toml"
    assert main(["calibrate", "--gpu", "a100-80gb", "--runs", str(small), "-o", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fitted = tomllib.loads(out.read_text())
    assert "planner calibrate --gpu a100-80gb" in fitted["provenance"]
    assert 0.3 <= fitted["efficiency"]["gemm"] <= 1.0
    assert fitted["efficiency"]["gemm"] == pytest.approx(report["fitted"]["gemm"], abs=1e-4)
    base = GPU.preset("a100-80gb", calibrated=False).efficiency
    assert fitted["transfer"]["gemm"] == pytest.approx(fitted["efficiency"]["gemm"] / base.gemm,
                                                       abs=1e-3)
    assert len(fitted["runs"]) == 4


def test_uncalibrated_gpus_take_the_reference_transfer() -> None:
    ref = tomllib.loads(hardware_profiles.calibrated_path("a100-80gb").read_text())
    raw = GPU.preset("h100-sxm", calibrated=False).efficiency
    used = GPU.preset("h100-sxm").efficiency
    assert used.gemm == pytest.approx(raw.gemm * ref["transfer"]["gemm"])
    assert used.memory == pytest.approx(raw.memory * ref["transfer"]["memory"])
    assert used.kernel_overhead_s == pytest.approx(ref["transfer"]["kernel_overhead_us"] * 1e-6)
    assert "a100-80gb" in used.source
    assert GPU.preset("a100-80gb").efficiency.gemm == ref["efficiency"]["gemm"]


@pytest.mark.parametrize("args, needle", [
    (["validate", "--runs", "no/such/runs.json"], "does not exist"),
    (["calibrate", "--gpu", "h100-sxm"], "no run in the set was measured on 'h100-sxm'"),
    (["calibrate", "--gpu", "h100-sxn"], "Did you mean"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    p = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
