"""``planner profile``: fitting the cost model to measurements, the profile TOML, ``--profile``.

The fits are checked on synthetic measurements made by the cost model itself from known
parameters (they must come back); the profiler runs for real on this CPU with 2 gloo
processes (tiny sizes) and its profile drives an estimate.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
from costmodel import Cluster, Job, ParallelConfig, SpecError, estimate
from costmodel.fitting.measured import (
    COLLECTIVES,
    AttentionPoint,
    CollectivePoint,
    CopyPoint,
    GemmPoint,
    Measurements,
    TransferPoint,
    _predict_collectives,
    bus_bandwidth,
    fit_profile,
    profile_toml,
    to_toml,
)
from costmodel.formulas.comm import Topology
from costmodel.formulas.roofline import flash_attention_time, gemm_time, memory_time
from costmodel.hardware import GPU, Link
from planner.cli import main

#: The parameters the synthetic measurements are made with (and the fits must return).
TRUE = dict(gemm=0.71, memory=0.83, kernel_overhead_s=4e-6, attention=0.41,
            attention_backward=0.33, gemm_fp8=0.6, gemm_unaligned=0.14)
HOST_BW, HOST_LAT = 50e9, 5e-6
LINK_BW, LINK_LAT, LINK_SIMPLE_LAT = 360e9, 2e-6, 9e-6


def synthetic(gpu: str | None = "h100-sxm", *, links: bool = True) -> Measurements:
    """Measurements of an H100 whose kernels run exactly as the cost model says with TRUE."""
    base = GPU.preset("h100-sxm", calibrated=False)
    true = dataclasses.replace(base, efficiency=dataclasses.replace(base.efficiency, **TRUE))
    gemm = []
    for dtype, width in (("bf16", 2), ("fp16", 2), ("tf32", 4), ("fp8", 1)):
        for m in (256, 1024, 4096, 8192):
            for n in (256, 1024, 4096, 8192):
                for k in (256, 2048, 8192):
                    t = gemm_time(true, dtype, np.array(m), np.array(n), np.array(k),
                                  bytes_per_element=width)
                    gemm.append(GemmPoint(dtype, m, n, k, float(t)))
    for m in (4096, 8192):  # one element off the 16-byte grid, as planner profile adds
        for n in (4095, 8191):
            for k in (2048, 8192):
                t = gemm_time(true, "bf16", np.array(m), np.array(n), np.array(k))
                gemm.append(GemmPoint("bf16", m, n, k, float(t)))
    copy = [CopyPoint(s, float(memory_time(true, 2.0 * s, 1.0))) for s in _sizes(20, 30, 2)]
    att = []
    for s in (512, 1024, 2048, 4096, 8192):
        for d in (64, 128):
            p = AttentionPoint("bf16", max(1, 16384 // s), 16, s, d, 0.0, 0.0)
            # Each query block's fixed work grows the short sequences' times, and a narrow
            # head runs slower, as measured.
            f, b = flash_attention_time(true, "bf16", p.forward_flops, p.seq_len,
                                        head_dim=d)
            att.append(dataclasses.replace(p, forward_s=float(f), backward_s=float(b)))
    meas = Measurements(device="cuda", device_name="NVIDIA H100 80GB HBM3", gpu=gpu,
                        memory_bytes=79.1 * 2**30, torch_version="2.13.0", driver="570.86",
                        date="2026-11-22", host="node0", sweep="standard", gemm=gemm,
                        copy=copy, attention=att)
    if links:
        meas.transfer = [TransferPoint(d, s, s / HOST_BW + HOST_LAT) for d in ("h2d", "d2h")
                         for s in _sizes(16, 28, 4)]
        nccl = hardware_profiles.load_software()["nccl"]
        topo = Topology(gpus_per_domain=8, base_lat=nccl["base_latency_us"] * 1e-6,
                        intra_bw=LINK_BW, intra_lat=LINK_LAT, nic_bw_per_gpu=1.0, inter_lat=1.0,
                        base_lat_simple=nccl["base_latency_simple_us"] * 1e-6,
                        intra_lat_simple=LINK_SIMPLE_LAT, inter_lat_simple=1.0,
                        ll_share=nccl["ll_bandwidth_share"])
        pts = [CollectivePoint(op, 8, s, 0.0) for op in COLLECTIVES for s in _sizes(10, 28, 3)]
        meas.collectives = [dataclasses.replace(p, seconds=float(t))
                            for p, t in zip(pts, _predict_collectives(topo, pts), strict=True)]
        meas.backend, meas.processes = "nccl", 8
    return meas


def _sizes(lo: int, hi: int, step: int) -> list[int]:
    return [2**e for e in range(lo, hi + 1, step)]


def test_fit_recovers_the_parameters_the_measurements_were_made_with() -> None:
    table = fit_profile(synthetic())
    eff = table["efficiency"]
    assert eff["gemm"] == pytest.approx(TRUE["gemm"], abs=1e-4)
    assert eff["memory"] == pytest.approx(TRUE["memory"], abs=1e-4)
    assert eff["kernel_overhead_us"] == pytest.approx(TRUE["kernel_overhead_s"] * 1e6, abs=1e-3)
    assert eff["attention"] == pytest.approx(TRUE["attention"], abs=1e-4)
    assert eff["attention_backward"] == pytest.approx(TRUE["attention_backward"], abs=1e-4)
    assert eff["gemm_fp8"] == pytest.approx(TRUE["gemm_fp8"], abs=1e-4)
    assert eff["gemm_unaligned"] == pytest.approx(TRUE["gemm_unaligned"], abs=1e-4)
    host = table["host_link"]
    assert host["name"] == "pcie5"  # the datasheet's host link, derated by what was measured
    assert host["bandwidth_gb_per_s"] * host["efficiency"] * 1e9 == pytest.approx(HOST_BW,
                                                                                  rel=1e-3)
    assert host["latency_us"] == pytest.approx(HOST_LAT * 1e6, rel=1e-3)
    link = table["intra_node_link"]
    assert link["name"] == "nvlink4" and link["bandwidth_gb_per_s"] == 450.0  # wire rate kept
    assert link["efficiency"] * 450e9 == pytest.approx(LINK_BW, rel=1e-3)
    assert link["latency_us"] == pytest.approx(LINK_LAT * 1e6, rel=1e-2)
    assert link["simple_latency_us"] == pytest.approx(LINK_SIMPLE_LAT * 1e6, rel=1e-2)
    fit = table["measured"]["fit"]
    assert max(v for k, v in fit.items() if k.endswith("_error")) < 1e-6
    # The datasheet's peaks stay: the fractions are of them.
    assert table["peak_tflops"]["bf16"] == 989.4


def test_fit_detects_a_slower_device() -> None:
    """Halving every matmul's speed halves the fitted fraction (the fit is not a constant)."""
    meas = synthetic(links=False)
    meas.gemm = [dataclasses.replace(p, seconds=2 * p.seconds) for p in meas.gemm]
    eff = fit_profile(meas)["efficiency"]
    assert eff["gemm"] < 0.5 * TRUE["gemm"] * 1.05
    assert eff["kernel_overhead_us"] > 1.5 * TRUE["kernel_overhead_s"] * 1e6


def test_without_a_datasheet_the_best_measured_rates_are_the_peaks() -> None:
    meas = synthetic(gpu=None, links=False)
    meas.device, meas.device_name = "cpu", "Some CPU (4 threads)"
    meas.gemm = [p for p in meas.gemm if p.dtype in ("bf16", "tf32")]
    meas.gemm += [dataclasses.replace(p, dtype="fp32") for p in meas.gemm if p.dtype == "tf32"]
    table = fit_profile(meas)
    best = max(p.tflops for p in meas.gemm if p.dtype == "bf16")
    assert table["name"] == "cpu"
    assert table["peak_tflops"]["bf16"] == pytest.approx(best, rel=1e-5)
    assert table["peak_tflops"]["tf32"] == table["peak_tflops"]["fp32"]  # fp32 jobs: fp32 math
    assert table["memory_bandwidth_gb_per_s"] == pytest.approx(
        max(p.gb_per_s for p in meas.copy), rel=1e-5)
    assert 0 < table["efficiency"]["gemm"] <= 1.0
    assert "intra_node_link" not in table and "host_link" not in table
    GPU.from_profile({**table, "efficiency": {k: v for k, v in table["efficiency"].items()}})


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce and
    # algbw * (n-1)/n for all-gather, reduce-scatter and all-to-all.
    assert bus_bandwidth("all_reduce", 8e9, 8, 1.0) == pytest.approx(8e9 * 2 * 7 / 8)
    assert bus_bandwidth("all_gather", 8e9, 8, 1.0) == pytest.approx(7e9)
    assert bus_bandwidth("reduce_scatter", 8e9, 4, 2.0) == pytest.approx(3e9)
    assert bus_bandwidth("send_recv", 1e9, 2, 0.5) == pytest.approx(2e9)


def test_profile_toml_round_trip(tmp_path: Path) -> None:
    meas = synthetic()
    path = tmp_path / "h100.toml"
    path.write_text(profile_toml(meas))
    data = tomllib.loads(path.read_text())
    info = data["measured"]
    assert info["date"] == "2026-11-22" and info["torch_version"] == "2.13.0"
    assert info["driver"] == "570.86" and info["tool"] == "planner profile"
    back = Measurements.from_dict(info)
    assert back.gemm == meas.gemm and back.collectives == meas.collectives
    assert back.attention == meas.attention and back.transfer == meas.transfer
    gpu = GPU.from_file(path)
    assert gpu.name == "h100-sxm"
    assert isinstance(gpu.intra_node_link, Link) and isinstance(gpu.host_link, Link)
    assert gpu.host().achieved_bytes_per_s == pytest.approx(HOST_BW, rel=1e-3)
    # Measured fractions become in-training ones like every profile's; the overhead is kept.
    eff = hardware_profiles.transfer_efficiency(data["efficiency"], overhead=False,
                                                architecture=data["architecture"])
    assert gpu.efficiency.gemm == pytest.approx(eff["gemm"])
    assert gpu.efficiency.kernel_overhead_s == pytest.approx(4e-6)


def test_a_measured_profile_drives_the_estimate_and_survives_a_saved_plan(
        tmp_path: Path) -> None:
    path = tmp_path / "h100.toml"
    meas = synthetic()
    meas.gemm = [dataclasses.replace(p, seconds=1.5 * p.seconds) for p in meas.gemm]
    path.write_text(profile_toml(meas))
    measured = Cluster(gpu=str(path), num_nodes=2, gpus_per_node=8)
    shipped = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=8)
    assert measured.intra_node_link.achieved_bytes_per_s == pytest.approx(LINK_BW, rel=1e-3)
    job = Job(global_batch_size=32, seq_len=4096)
    cfg = ParallelConfig(dp=4, tp=4, micro_batch_size=1)
    from costmodel import ModelSpec
    model = ModelSpec.preset("llama-3-8b")
    slow, fast = estimate(model, measured, job, cfg), estimate(model, shipped, job, cfg)
    assert slow.step_time_s > fast.step_time_s
    import planner

    result = planner.plan(model, measured, job, top_k=1)
    result.to_json(tmp_path / "plan.json")
    again = planner.Plan.from_json(tmp_path / "plan.json")
    assert again.cluster == measured
    assert again.estimate.step_time_s == pytest.approx(result.estimate.step_time_s)


SHIPPED = Path(hardware_profiles.__file__).parent


def test_a_hand_written_profile_loads_like_a_shipped_one() -> None:
    """A GPU profile without ``[measured]`` (here the shipped H100 file, which has no fitted
    file of its own) gets the same in-training scaling and overhead as the preset."""
    assert GPU.from_file(SHIPPED / "gpus" / "h100-sxm.toml") == GPU.preset("h100-sxm")


def test_to_toml_refuses_what_toml_cannot_hold() -> None:
    with pytest.raises(SpecError, match="non-finite"):
        to_toml({"x": float("nan")})
    with pytest.raises(SpecError, match="cannot write"):
        to_toml({"x": object()})
    assert tomllib.loads(to_toml({"a b": 1, "t": {"u": [1, 2], "v": [{"w": True}]}})) == {
        "a b": 1, "t": {"u": [1, 2], "v": [{"w": True}]}}


# ---- the CLI -------------------------------------------------------------------------------

def _write(tmp_path: Path, meas: Measurements, name: str = "h100.toml") -> str:
    path = tmp_path / name
    path.write_text(profile_toml(meas))
    return str(path)


ESTIMATE = ["estimate", "--model", "llama-3-8b", "--global-batch-size", "16", "--seq-len",
            "2048", "--dp", "8", "--micro-batch-size", "1", "--json"]


def test_cli_estimate_with_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meas = synthetic()
    meas.gemm = [dataclasses.replace(p, seconds=2 * p.seconds) for p in meas.gemm]
    path = _write(tmp_path, meas)
    assert main([*ESTIMATE, "--gpus", "8"]) == 0
    shipped = json.loads(capsys.readouterr().out)["estimate"]["step_time_s"]
    assert main([*ESTIMATE, "--gpus", "8", "--profile", path]) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["step_time_s"] > 1.3 * shipped
    assert main([*ESTIMATE, "--cluster", "dgx-h100", "--profile", path]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    (["--gpus", "8", "--gpu", "a100-80gb"], "measured 'h100-sxm' but --gpu names"),
    (["--cluster", "selene", "--num-nodes", "1"], "cluster 'selene' names 'a100-80gb'"),
])
def test_cli_profile_must_match_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            extra: list[str], message: str) -> None:
    path = _write(tmp_path, synthetic())
    assert main([*ESTIMATE, *extra, "--profile", path]) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_profile_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = SHIPPED / "links" / "nvlink4.toml"
    broken = tmp_path / "broken.toml"
    broken.write_text("name = [")
    for path, message in ((tmp_path / "nope.toml", "does not exist"),
                          (link, "has no [efficiency] table"),
                          (broken, "is not valid TOML")):
        assert main([*ESTIMATE, "--gpus", "8", "--profile", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_cli_validate_with_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meas = synthetic()
    meas.gemm = [dataclasses.replace(p, seconds=1.2 * p.seconds) for p in meas.gemm]
    path = _write(tmp_path, meas)
    assert main(["validate", "--heldout", "--profile", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == "h100-sxm" and out["runs"]
    for row in out["runs"]:
        assert row["profile"]["predicted"] != row["shipped"]["predicted"]
    assert set(out["summary"]) == {"shipped", "profile"}
    assert main(["validate", "--heldout", "--profile", path]) == 0
    assert "mean |error|" in capsys.readouterr().out
    # The calibration set is all A100: nothing to re-predict with an H100 profile.
    assert main(["validate", "--profile", path]) == 2
    assert "no run in" in capsys.readouterr().err


def test_cli_profile_flags(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    for argv, message in ((["--device", "cpu", "--procs", "100000"], "--procs 100000"),
                          (["--device", "cpu", "--gpu", "h100-sxm"], "no GPU datasheet"),
                          (["--quick", "--full"], "not allowed with")):
        code = None
        try:
            code = main(["profile", *argv])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
        assert code == 2
        assert message in capsys.readouterr().err
    import torch
    if not torch.cuda.is_available():
        assert main(["profile", "--device", "cuda"]) == 2
        assert "sees no CUDA GPU" in capsys.readouterr().err


def test_a_sweep_over_the_time_limit_needs_full(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import planner.profile as prof

    monkeypatch.setattr(prof, "LIMIT_S", 1e-3)
    assert main(["profile", "--device", "cpu", "--quick", "-o", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err
    assert "--full" in err and "min" in err
    assert not (tmp_path / "p.toml").exists()
    assert prof.predicted_seconds(
        prof._plan("cpu", prof.sweep_for("cpu", "full"),
                   prof._Rates({"bf16": 1e11, "fp32": 1e11}, 1e10, 1e10, 1e9, 1e-4, 5.0),
                   ("bf16", "fp32"), 2), 2, 5.0) > prof.predicted_seconds(
        prof._plan("cpu", prof.sweep_for("cpu", "quick"),
                   prof._Rates({"bf16": 1e11, "fp32": 1e11}, 1e10, 1e10, 1e9, 1e-4, 5.0),
                   ("bf16", "fp32"), 2), 2, 5.0)


def test_profile_reports_progress_up_to_one() -> None:
    pytest.importorskip("torch")
    from planner.profile import profile

    seen: list[float] = []
    meas = profile("cpu", sweep="quick", processes=1, progress=seen.append)
    assert seen[-1] == 1.0 and seen == sorted(seen) and len(seen) > 5
    assert meas.gemm and meas.attention and meas.copy and not meas.collectives
    assert {p.dtype for p in meas.gemm} == {"bf16", "fp32"}


@pytest.mark.slow
def test_profile_end_to_end_on_cpu_with_two_gloo_processes(tmp_path: Path) -> None:
    """The acceptance test of the issue: ``planner profile --device cpu`` with 2 gloo
    processes (tiny sizes) writes a profile that loads back and drives an estimate."""
    pytest.importorskip("torch")
    out = tmp_path / "cpu.toml"
    run = subprocess.run([sys.executable, "-m", "planner", "profile", "--device", "cpu",
                          "--procs", "2", "--quick", "-o", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "written to" in run.stdout and "link" in run.stdout
    data = tomllib.loads(out.read_text())
    info = data["measured"]
    assert info["backend"] == "gloo" and info["processes"] == 2 and info["device"] == "cpu"
    assert {c["op"] for c in info["collectives"]} == set(COLLECTIVES)
    assert all(c["seconds"] > 0 and c["ranks"] == 2 for c in info["collectives"])
    assert Measurements.from_dict(info).gpu is None  # a CPU has no datasheet profile
    gpu = GPU.from_file(out)
    assert gpu.name == "cpu" and isinstance(gpu.intra_node_link, Link)
    est = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "gpt3-125m",
                          "--global-batch-size", "8", "--seq-len", "512", "--gpus", "2",
                          "--dp", "2", "--micro-batch-size", "1", "--profile", str(out),
                          "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert est.returncode == 0, est.stderr
    result = json.loads(est.stdout)["estimate"]
    # A 2-core CPU is thousands of times slower than an H100: the measured peaks show.
    peak = max(gpu.peak_flops(d) for d in ("bf16", "fp32"))
    assert peak < 5e13 and result["step_time_s"] > 0.1
