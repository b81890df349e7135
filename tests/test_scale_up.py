"""Scale-up domains (NVLink across trays of an NVL72 rack), full-mesh links (AMD Infinity
Fabric), the new GPU and cluster profiles, and the bands of estimates on generations and
trainers without enough published runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from inprocess import run_planner

import hardware_profiles
from costmodel import GPU, Cluster, Job, Link, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.fitting.calibration import BAND_MIN_RUNS, BAND_MIN_SOURCES
from costmodel.fitting.uncertainty import EXTRAPOLATED_MIN_BAND, MIN_CELL_RUNS, band_for
from costmodel.formulas.comm import Topology
from planner import plan

GIB = 2**30


def nvl72(racks: int, gpu: str = "gb200") -> Cluster:
    """``racks`` GB200 NVL72 racks (18 trays of 4 GPUs on one NVLink domain each)."""
    return Cluster.preset("gb200-nvl72", num_nodes=18 * racks, gpu=gpu)


def boxes(gpus: int, gpu: str = "gb200") -> Cluster:
    """The same GPUs in 8-GPU boxes whose NVLink ends at the box (DGX B200 layout: one
    400 Gb/s NIC per GPU)."""
    return Cluster(gpu=gpu, gpus_per_node=8, num_nodes=gpus // 8, intra_node_link="nvlink5",
                   inter_node_link="ib-ndr", nics_per_node=8)


# ---- the cluster -----------------------------------------------------------------------

def test_a_rack_is_one_domain_of_several_nodes() -> None:
    c = nvl72(16)
    assert (c.num_gpus, c.gpus_per_node, c.scale_up) == (1152, 4, 72)
    assert "72 GPUs of an nvlink5 domain (18 nodes of 4)" in c.domain_words()
    # Host memory and NICs stay per tray: 2 Grace x 480 GB (GB200 NVL72 product page).
    assert c.host_memory_gib == pytest.approx(894.1)
    assert c.nics_per_node == 4
    # A box's domain is the box.
    assert boxes(64).scale_up == 8
    # Fewer GPUs than one rack: the domain is all of them.
    assert Cluster.preset("gb200-nvl72", num_nodes=2).scale_up == 8
    # Saved and read back, the domain survives (and an old record without it is a node).
    assert Cluster.from_dict(c.to_dict()) == c
    old = {k: v for k, v in boxes(16).to_dict().items() if k != "gpus_per_domain"}
    assert Cluster.from_dict(old).scale_up == 8


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus_per_node": 4, "num_nodes": 18, "gpus_per_domain": 6}, "not a multiple of"),
    ({"gpus_per_node": 4, "num_nodes": 20, "gpus_per_domain": 72}, "whole scale-up domains"),
    ({"gpus_per_node": 4, "num_nodes": 18, "gpus_per_domain": 0}, "positive integer"),
])
def test_a_domain_that_does_not_tile_is_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        Cluster(gpu="gb200", **kwargs)


def test_the_domain_flag_and_its_errors() -> None:
    args = ["estimate", "--model", "llama-3-8b", "--global-batch-size", "72", "--seq-len",
            "4096", "--dp", "9", "--tp", "8", "--gpus-per-node", "4", "--gpu", "gb200"]
    r = run_planner(*args, "--gpus", "72", "--gpus-per-domain", "72")
    assert r.returncode == 0, r.stderr
    assert "nvlink5 across 72-GPU domains" in r.stdout
    # Without the domain, tp=8 leaves the 4-GPU tray: refused with the reason.
    r = run_planner(*args, "--gpus", "72")
    assert r.returncode == 2 and "tp=8 exceeds the 4 GPUs of a node" in r.stderr
    r = run_planner(*args, "--gpus", "80", "--gpus-per-domain", "72")
    assert r.returncode == 2 and "use a multiple of 72 GPUs" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_job_of_part_racks_says_how_its_nodes_split_and_the_flag_takes_it(
        tmp_path: Path) -> None:
    # 64 trays of an NVL72 rack fill no whole 72-GPU domain: the error names the split
    # Slurm's --segment would make (the largest divisor of the nodes that fits a rack), and
    # --gpus-per-domain takes it on the preset and on a cluster file alike.
    with pytest.raises(SpecError, match=r"gpus_per_domain=64 \(--gpus-per-domain 64: 4 "
                       r"domains of 16 nodes"):
        Cluster.preset("gb200-nvl72", num_nodes=64)
    assert Cluster.preset("gb200-nvl72", num_nodes=64, gpus_per_domain=64).scale_up == 64
    with pytest.raises(SpecError) as odd:  # 19 nodes: no split but one node a domain
        Cluster.preset("gb200-nvl72", num_nodes=19)
    assert "gpus_per_domain=" not in str(odd.value)
    args = ["estimate", "--model", "llama-3-8b", "--global-batch-size", "256", "--seq-len",
            "4096", "--dp", "64", "--tp", "4", "--num-nodes", "64"]
    r = run_planner(*args, "--cluster", "gb200-nvl72")
    assert r.returncode == 2 and "--gpus-per-domain 64" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_planner(*args, "--cluster", "gb200-nvl72", "--gpus-per-domain", "64")
    assert r.returncode == 0, r.stderr
    assert "nvlink5 across 64-GPU domains" in r.stdout
    rack = tmp_path / "rack.toml"
    rack.write_text('gpu = "gb200"\nnum_nodes = 18\ngpus_per_node = 4\ngpus_per_domain = 72\n')
    r = run_planner(*args, "--cluster", str(rack), "--gpus-per-domain", "64")
    assert r.returncode == 0, r.stderr
    assert "nvlink5 across 64-GPU domains" in r.stdout


# ---- placement on the topology ------------------------------------------------------------

def test_groups_are_placed_by_the_domain_they_span() -> None:
    rack, box = Topology.of(nvl72(2)), Topology.of(boxes(144))
    # A group of 9 ranks 8 apart (data parallel beside tp x cp = 8): one rack, nine boxes.
    assert [float(x) for x in rack.place(9, 8)] == [9, 1]
    assert [float(x) for x in box.place(9, 8)] == [1, 9]
    # 16 contiguous ranks on 72-GPU domains: the instance at ranks 64..79 is cut 8 | 8, and
    # sets the pace (the module docstring of costmodel.formulas.comm).
    assert [float(x) for x in rack.place(16, 1)] == [8, 2]
    assert [float(x) for x in rack.place(8, 1)] == [8, 1]
    # Past the domain, each rank is on its own: pipeline neighbours 72 apart.
    assert [float(x) for x in rack.place(16, 72)] == [1, 16]
    big = 2.0**30
    assert rack.all_gather(big, 9, 8) < box.all_gather(big, 9, 8) / 5
    assert float(rack.p2p(big, 8)) < float(box.p2p(big, 8)) / 5
    assert float(rack.p2p(big, 72)) == pytest.approx(float(box.p2p(big, 72)))


def test_llama_405b_on_16_nvl72_racks_keeps_its_groups_in_a_rack() -> None:
    """Issue 58's check: the plan for llama-3-405b on 1,152 GB200 keeps tensor, context and
    data parallel inside a rack (pipeline parallel crosses racks), and the same plan on 144
    8-GPU boxes is costed with the scale-out link for the groups that leave a box."""
    model = ModelSpec.preset("llama-3-405b")
    job = Job(global_batch_size=1152, seq_len=8192, framework="megatron")
    rack = nvl72(16)
    got = plan(model, rack, job)
    cfg = got.config
    topo = Topology.of(rack)
    inner = cfg.tp * cfg.cp * cfg.dp
    assert inner <= rack.scale_up and rack.scale_up % inner == 0, cfg
    for size, stride in ((cfg.tp, 1), (cfg.cp, cfg.tp), (cfg.dp, cfg.tp * cfg.cp)):
        k, domains = topo.place(size, stride)
        assert (float(k), float(domains)) == (size, 1), (size, stride)
    # The same configuration in 8-GPU boxes: the groups wider than a box pay the NICs.
    on_rack = estimate(model, rack, job, cfg).time_breakdown_s
    on_boxes = estimate(model, boxes(1152), job, cfg).time_breakdown_s
    leaves = [(n, s) for n, s in ((cfg.cp, cfg.tp), (cfg.dp, cfg.tp * cfg.cp))
              if n > 1 and n * s > 8]
    assert leaves, cfg
    assert on_boxes["dp_comm_total"] > 3 * on_rack["dp_comm_total"]
    assert on_boxes["tp_comm_total"] == pytest.approx(on_rack["tp_comm_total"])
    assert on_boxes["pp_comm_total"] == pytest.approx(on_rack["pp_comm_total"])


def test_an_expert_group_wider_than_a_box_stays_on_nvlink_in_a_rack() -> None:
    """Expert parallel over 64 ranks: inside one rack's NVLink when each rack runs 64 GPUs
    (16 of its 18 trays), across the NICs in 8-GPU boxes; on all 72 GPUs of each rack a
    64-rank group straddles two racks and pays the NICs too (256 experts admit no group of
    72)."""
    model = ModelSpec.preset("deepseek-v3")
    job = Job(global_batch_size=4096, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(dp=64, pp=16, ep=64, zero_stage=1, recompute="full",
                         pipeline_schedule="1f1b")
    racks = dataclasses.replace(nvl72(16), num_nodes=256, gpus_per_domain=64)

    def ep(cluster: Cluster, pp: int = 16) -> float:
        got = estimate(model, cluster, job, dataclasses.replace(cfg, pp=pp))
        return got.time_breakdown_s["ep_comm_total"]

    # NVLink 5 (900 GB/s a direction) against a 400 Gb/s NIC per GPU for 56 of 63 peers.
    assert ep(boxes(1024)) > 5 * ep(racks)
    straddling = Cluster(gpu="gb200", gpus_per_node=4, num_nodes=288, gpus_per_domain=72,
                         intra_node_link="nvlink5", nics_per_node=4)
    assert ep(straddling, pp=18) > 5 * ep(racks)


# ---- a full mesh -------------------------------------------------------------------------

def test_a_group_of_a_mesh_drives_only_its_own_links() -> None:
    """MI300X: 7 xGMI links of 64 GB/s a direction, a pair of GPUs joined by one (ROCm
    'MI300 series microarchitecture'); the measured figures below are the AMD ROCm blog's
    (ROCm/rocm-blogs@c2631766: blogs/software-tools-optimization/mi300x-rccl-xgmi)."""
    link = Link.preset("infinity-fabric")
    assert link.mesh_peers == 7
    assert [link.share(k) for k in (2, 4, 8)] == pytest.approx([1 / 7, 3 / 7, 1.0])
    topo = Topology.of(Cluster.preset("mi300x-8"))
    big = 16 * GIB
    # 8 GPUs: all_reduce bus bandwidth 318.98 GB/s at 16 GiB.
    bus8 = big / float(topo.all_reduce(big, 8, 1)) * 2 * 7 / 8 / 1e9
    assert bus8 == pytest.approx(318.98, rel=0.01)
    # A pair: one link, TransferBench 45.1 to 47.2 GB/s per link.
    pair = 64 * 2**20 / float(topo.p2p(64 * 2**20, 1)) / 1e9
    assert 44 < pair < 47.2
    # Four GPUs drive three links each: three sevenths of the eight's bandwidth.
    t4, t8 = (float(topo.all_gather(big, n, 1)) for n in (4, 8))
    assert (3 / 4 * big / t4) / (7 / 8 * big / t8) == pytest.approx(3 / 7, rel=0.01)
    # A switch gives the pair the whole per-GPU bandwidth.
    h100 = Topology.of(Cluster.preset("dgx-h100"))
    assert float(h100.p2p(big, 1)) == pytest.approx(float(h100.p2p(big, 4)))


def test_tensor_parallel_pairs_cost_more_on_a_mesh_than_on_a_switch() -> None:
    model = ModelSpec.preset("llama-3-70b")
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(dp=4, tp=2, pp=1, zero_stage=1, recompute="full")
    mi = Cluster.preset("mi300x-8")
    # The same GPU with a switched 448 GB/s link (what the profile said before meshes).
    switched = dataclasses.replace(
        mi, intra_node_link=dataclasses.replace(Link.preset("infinity-fabric"), mesh_peers=0))
    mesh = estimate(model, mi, job, cfg).time_breakdown_s["tp_comm_total"]
    switch = estimate(model, switched, job, cfg).time_breakdown_s["tp_comm_total"]
    assert mesh > 3 * switch


# ---- profiles ---------------------------------------------------------------------------

NEW_GPUS = ("gb200", "gb300", "b300", "h800", "h20", "mi325x", "mi350x", "mi355x")
NEW_CLUSTERS = ("dgx-b200", "gb200-nvl72", "gb200-nvl36x2", "gb300-nvl72", "dgx-b300", "hgx-h800",
                "hgx-h20",
                "mi300x-8", "mi325x-8", "mi350x-8", "mi355x-8")


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_profiles_cite_their_figures(name: str) -> None:
    data = hardware_profiles.load("gpus", name)
    gpu = GPU.preset(name)
    assert data["source"]["url"].startswith("https://")
    # Every fraction assumed from another GPU says so (GB200's are all measured now).
    assumed = hardware_profiles.load("gpus", name, calibrated=False)["efficiency"]["assumed"]
    assert ("ASSUMED" in data["efficiency"]["source"]) == bool(assumed)
    assert gpu.peak_flops("bf16") > 0


def test_h800_is_an_h100_with_nvlink_cut_to_400_gb_s() -> None:
    """DeepSeek-AI, arXiv 2505.09343 Sec. 4.1 ('reduced from 900 GB/s to 400 GB/s'); the
    DeepSeek-V3 report (arXiv 2412.19437 Sec. 3.2.2) gives 160 GB/s achieved."""
    h800, h100 = GPU.preset("h800"), GPU.preset("h100-sxm")
    assert h800.peak_flops("bf16") == h100.peak_flops("bf16")
    link = h800.intra_link()
    assert link.bandwidth_bytes_per_s * 2 == pytest.approx(400e9)
    assert link.achieved_bytes_per_s == pytest.approx(160e9)


def test_cdna4_has_no_tf32_and_says_so() -> None:
    """AMD CDNA 4 white paper: TF32 'moved out of hardware'."""
    assert not GPU.preset("mi355x").supports("tf32")
    with pytest.raises(SpecError, match="no tf32 peak"):
        GPU.preset("mi355x").peak_flops("tf32")


@pytest.mark.parametrize("name", NEW_CLUSTERS)
def test_new_cluster_presets_plan(name: str) -> None:
    cluster = Cluster.preset(name)
    got = plan(ModelSpec.preset("llama-3-8b"), cluster,
               Job(global_batch_size=8 * cluster.num_gpus, seq_len=4096))
    assert got.config.world_size == cluster.num_gpus
    assert got.estimate.peak_memory_bytes <= cluster.gpu.memory_bytes


def test_an_nvl36x2_pair_is_one_domain_like_an_nvl72_rack() -> None:
    """NVIDIA's multi-node tuning guide: GB200 in 36x2 (two racks of 9 trays, NVL36 switch
    trays) and 72x1 configurations, both one 72-GPU NVLink domain of 4-GPU trays: the same
    plan and estimate."""
    pair = Cluster.preset("gb200-nvl36x2", num_nodes=36)
    rack = Cluster.preset("gb200-nvl72", num_nodes=36)
    assert pair.scale_up == rack.scale_up == 72 and pair.gpus_per_node == 4
    model = ModelSpec.preset("llama-3-70b")
    job = Job(global_batch_size=144, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(dp=9, tp=8, pp=2, zero_stage=1, sequence_parallel=True)
    assert estimate(model, pair, job, cfg).step_time_s == pytest.approx(
        estimate(model, rack, job, cfg).step_time_s)


def test_listing_names_the_domain() -> None:
    r = run_planner("clusters")
    line = next(x for x in r.stdout.splitlines() if x.startswith("gb200-nvl72"))
    assert "4 x gb200 per node (72 per nvlink5 domain)" in line
    rows = json.loads(run_planner("clusters", "--json").stdout)
    assert {r["name"]: r.get("gpus_per_domain") for r in rows}["gb300-nvl72"] == 72


# ---- bands -------------------------------------------------------------------------------

def test_a_cell_without_enough_runs_is_extrapolated_with_a_wide_band() -> None:
    """Issue 58: a B200 plan with no Blackwell runs behind its trainer (DeepSpeed: none
    published) prints "extrapolated" and a band of at least 25 %."""
    band, basis, extrapolated = band_for("blackwell", "deepspeed", 8)
    assert extrapolated and band >= 0.25
    assert basis.startswith("extrapolated: ") and "blackwell with deepspeed" in basis
    got = plan(ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-b200"),
               Job(global_batch_size=32, seq_len=8192, framework="deepspeed"))
    assert got.estimate.step_time_band_extrapolated
    assert got.estimate.step_time_band >= 0.25
    assert "extrapolated" in got.summary()
    # AMD under DeepSpeed has no run at all; CDNA 4 under torchtitan (AMD's cluster
    # validation suite) has runs from one source only: extrapolated either way. CDNA 3 and
    # CDNA 4 under Megatron-LM have two each (AMD's performance page and an AMD engineer's
    # logs; MLPerf Training v5.1 and v6.0): bands of their own.
    band, basis, extrapolated = band_for("cdna3", "deepspeed", 64)
    assert extrapolated and band >= 0.25 and "no published run on cdna3" in basis
    band, basis, extrapolated = band_for("cdna4", "torchtitan", 8)
    assert extrapolated and band >= 0.25 and "from 1 source" in basis
    assert not band_for("cdna3", "megatron", 64)[2]
    assert not band_for("cdna4", "megatron", 8)[2]


def test_a_cell_with_its_own_runs_keeps_its_own_band() -> None:
    band, basis, extrapolated = band_for("hopper", "torchtitan", 64)
    assert not extrapolated and band < 0.25
    runs = int(basis.split("RMS error of ")[1].split()[0])
    assert runs >= MIN_CELL_RUNS


def _fit() -> dict:
    return hardware_profiles.load_file(hardware_profiles.transfer_path())


def test_the_extrapolated_band_is_the_error_of_cells_the_fit_never_saw() -> None:
    """The widest of: the trainer's band widened by the spread of the fitted ratios, the
    RMS error of runs in cells with one source (held out of the fit), and the floor."""
    fit = _fit()
    pooled = fit["transfer"]["gemm"]
    spread = max(abs(r / pooled - 1) for r in fit["transfer"]["architecture"].values())
    borrowed = fit["bands"]["*/torchtitan"]["band"]
    far = fit["bands"].get("extrapolated", {}).get("band", 0.0)
    assert band_for("cdna4", "torchtitan", 8)[0] == pytest.approx(
        max(np.hypot(borrowed, spread), far, EXTRAPOLATED_MIN_BAND))
    # Every unfitted cell has a single source, and the fit counted it; Blackwell under
    # torchtitan has three (torchao's B200 table, torchtitan's GB200 NVFP4 document,
    # Crusoe's torchtitan table), the MI300X under it two (ROCm/TransformerEngine's issues,
    # torchao's float8 README); CDNA 4 under Megatron-LM has two MLPerf rounds. The band of
    # the unfitted cells is only drawn from as many runs and sources as any band
    # (calibration.bands): CDNA 4's torchtitan runs, all from AMD's validation suite, are too
    # few.
    cells = fit["cells"]
    assert cells["cdna4/torchtitan"]["sources"] == 1
    assert cells["blackwell/torchtitan"]["sources"] == 3
    assert cells["cdna3/torchtitan"]["sources"] == 2
    assert cells["cdna4/megatron"]["sources"] == 2
    unfitted = [c for c in cells.values() if c["sources"] < 2]
    if "extrapolated" in fit["bands"]:
        assert fit["bands"]["extrapolated"]["runs"] == sum(c["runs"] for c in unfitted)
    else:
        assert len(unfitted) < BAND_MIN_SOURCES or sum(c["runs"] for c in unfitted) \
            < BAND_MIN_RUNS


def test_a_gpu_that_borrows_its_efficiencies_and_has_no_runs_is_widened() -> None:
    fit = _fit()
    assert not fit["gpus"].get("h20") and fit["gpus"]["h100-sxm"] > 0
    h20 = band_for("hopper", "megatron", 64, gpu="h20", assumed=GPU.preset("h20").assumed)
    h100 = band_for("hopper", "megatron", 64, gpu="h100-sxm",
                    assumed=GPU.preset("h100-sxm").assumed)
    assert h20[2] and not h100[2]
    assert h20[0] > h100[0]
    assert "no published run on h20" in h20[1]


@pytest.mark.slow
def test_the_advice_to_grow_counts_whole_racks() -> None:
    """Past one rack, a cluster of NVL72 racks grows by whole racks: 8 trays of a rack
    doubled three times is 64 trays, which is not whole racks; 72 are."""
    rack = Cluster.preset("gb200-nvl72", num_nodes=8)
    assert [rack.whole_domains(n) for n in (8, 16, 18, 32, 64)] == [8, 16, 18, 36, 72]
    assert boxes(64).whole_domains(24) == 24
    r = run_planner("plan", "--model", "kimi-k2", "--cluster", "gb200-nvl72", "--num-nodes",
                    "8", "--global-batch-size", "64", "--seq-len", "4096")
    assert r.returncode == 3, r.stderr
    assert "36 nodes of 4 GPUs (144 GPUs)" in r.stderr


def test_profiles_carry_their_published_microbenchmarks() -> None:
    """benchmarks/data/microbench-frontier.json: each measured figure over its datasheet peak
    (an attention row's taken to long sequences by the fused-attention shape) is the
    profile's fraction, the peak is the profile's own, and the key is not listed as
    assumed."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks/microbench_tables.py"
    spec = importlib.util.spec_from_file_location("microbench_tables", path)
    assert spec is not None and spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    data = json.loads((Path(__file__).parents[1] / "benchmarks/data/microbench-frontier.json")
                      .read_text())
    rows = data["rows"]
    assert {r["gpu"] for r in rows} >= {"gb200", "b300", "mi325x", "mi355x", "mi300x"}
    for r in rows:
        prof = hardware_profiles.load("gpus", r["gpu"], calibrated=False)
        assert prof["efficiency"][r["key"]] == pytest.approx(tables.fraction(r), abs=5e-4), r
        assert r["key"].replace("_backward", "") not in prof["efficiency"]["assumed"], r
        peak = (prof["memory_bandwidth_gb_per_s"] if r["unit"] == "GB/s" else
                prof["peak_tflops"][{"gemm_fp8": "fp8", "gemm_fp4": "nvfp4" if "nvfp4" in
                                     prof["peak_tflops"] else "mxfp4"}.get(r["key"], "bf16")])
        assert peak == pytest.approx(r["peak"]), r
        assert "@" in r["source"] or "arXiv" in r["source"] or "PR #" in r["source"], r
    # An efficiency taken from a sibling of the same die is the sibling's times the ratio
    # measured on both in one harness, and stays listed as assumed (its band widens).
    scaled = data["same_die"]
    assert {e["gpu"] for e in scaled} == {"gb300", "mi325x"}
    for e in scaled:
        ratio = tables.same_die_ratio(e)
        assert 1.0 < ratio < 1.5, e
        ours = hardware_profiles.load("gpus", e["gpu"], calibrated=False)["efficiency"]
        theirs = hardware_profiles.load("gpus", e["of"], calibrated=False)["efficiency"]
        for key in e["keys"]:
            assert ours[key] == pytest.approx(theirs[key] * ratio, abs=5e-4), (e["gpu"], key)
            assert key.replace("_backward", "") in ours["assumed"], (e["gpu"], key)
        assert "@" in e["source"], e


def test_the_sbatch_script_asks_for_whole_nvlink_domains() -> None:
    """The plan keeps its groups inside racks only if the ranks follow the racks: Slurm's
    block topology allocates whole segments (--segment, Slurm's topology guide)."""
    from planner.emit import emit
    from planner.result import Plan

    model = ModelSpec.preset("llama-3-8b")
    job = Job(global_batch_size=144, seq_len=4096, framework="megatron")
    cfg = ParallelConfig(dp=144, zero_stage=1)
    rack = nvl72(2)
    text = emit(Plan(model=model, cluster=rack, job=job, config=cfg,
                     estimate=estimate(model, rack, job, cfg)), "slurm").text
    assert "#SBATCH --segment=18" in text.splitlines()
    box = boxes(144)
    text = emit(Plan(model=model, cluster=box, job=job, config=cfg,
                     estimate=estimate(model, box, job, cfg)), "slurm").text
    assert "--segment" not in text


def test_the_held_out_mlperf_runs_load_and_stay_out_of_the_fit() -> None:
    """benchmarks/data/mlperf-training-blackwell.json: MLPerf Training runs of NVIDIA's code
    on Blackwell, each citing its submission, none of them in the fitted files."""
    from pathlib import Path

    from costmodel.fitting.published import load_runs, shipped_runs

    runs = load_runs(Path(__file__).parents[1] / "benchmarks/data/mlperf-training-blackwell.json")
    assert {r.cluster.gpu.name for r in runs} >= {"b200", "gb200", "gb300"}
    assert all("training_results_v5" in r.source and r.note for r in runs)
    assert not {r.id for r in runs} & {r.id for r in shipped_runs()}


def test_the_mi350x_is_the_mi355x_die_at_its_lower_clock() -> None:
    """AMD CDNA 4 white paper, Table 2: the same 256 CUs at 2,200 instead of 2,400 MHz
    (BF16 2.3 vs 2.5 PF dense), the same 288 GB at 8 TB/s, 1000 instead of 1400 W."""
    mi350x, mi355x = GPU.preset("mi350x"), GPU.preset("mi355x")
    assert mi350x.architecture == mi355x.architecture == "cdna4"
    for dtype in ("bf16", "fp8", "mxfp8"):
        assert mi350x.peak_flops(dtype) / mi355x.peak_flops(dtype) == pytest.approx(2.2 / 2.4,
                                                                                     rel=1e-3)
    assert mi350x.memory_bandwidth_bytes_per_s == mi355x.memory_bandwidth_bytes_per_s
    assert mi350x.memory_bytes == mi355x.memory_bytes
    assert not mi350x.supports("tf32")


def test_pytorch_sdpa_on_rocm_is_aotriton() -> None:
    """torchtitan's attention goes through PyTorch's SDPA, whose flash backend on ROCm is
    AOTriton (Composable Kernel's only with TORCH_ROCM_FA_PREFER_CK=1): on AMD GPUs its
    default kernel is ``aotriton``, at the rates PyTorch's SDPA reaches (MI355X: 822 / 309
    TFLOP/s forward / backward against Composable Kernel's 894 / 469, HipKittens@f09e9685),
    while Megatron-LM's Transformer Engine runs Composable Kernel's (``flash``). The kernel
    is AMD's alone: refused by name on NVIDIA, exit 2 from the CLI; Transformer Engine on
    ROCm is asked for it by its own switches."""
    from costmodel.formulas.roofline import attention_kernel

    mi355x, h100 = GPU.preset("mi355x"), GPU.preset("h100-sxm")
    tt = Job(global_batch_size=64, seq_len=8192, framework="torchtitan")
    mg = dataclasses.replace(tt, framework="megatron")
    assert attention_kernel(tt, mi355x) == "aotriton" and attention_kernel(mg, mi355x) == "flash"
    assert attention_kernel(tt, h100) == "cudnn"
    raw = GPU.preset("mi355x", calibrated=False).efficiency
    assert raw.attention_for("aotriton") == (0.3265, 0.1229)
    assert raw.attention_for("aotriton")[1] < raw.attention_for("flash")[1]
    assert GPU.preset("a100-80gb").efficiency.attention_for("aotriton") == \
        GPU.preset("a100-80gb").efficiency.attention_for("flash")
    model, cfg = ModelSpec.preset("llama-3-8b"), ParallelConfig(dp=8, zero_stage=3)
    times = {k: estimate(model, Cluster.preset("mi355x-8"),
                         dataclasses.replace(tt, attention_kernel=k), cfg).step_time_s
             for k in ("flash", "aotriton")}
    assert times["aotriton"] > times["flash"]
    with pytest.raises(SpecError, match="'aotriton' is AMD's Triton FlashAttention"):
        estimate(model, Cluster.preset("dgx-h100"),
                 dataclasses.replace(tt, attention_kernel="aotriton"), cfg)
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "dgx-h100",
                      "--framework", "torchtitan", "--attention-kernel", "aotriton",
                      "--global-batch-size", "64", "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 2 and "AMD's Triton FlashAttention" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "mi355x-8",
                      "--framework", "torchtitan", "--global-batch-size", "64",
                      "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 0 and "AOTriton (PyTorch SDPA on ROCm)" in out.stdout, out.stderr
    p = plan(model, Cluster.preset("mi355x-8"),
             dataclasses.replace(mg, attention_kernel="aotriton"))
    assert "NVTE_FUSED_ATTN_AOTRITON=1" in p.emit("megatron")


def test_amds_own_attention_is_the_cudnn_kernel_on_instinct_gpus() -> None:
    """On an MI300X, Transformer Engine's fused attention with AMD's v3 kernels (aiter's, the
    ``"cudnn"`` kernel: 547 / 423 TFLOP/s forward / backward, ROCm/aiter@a83421be) runs at
    its own measured rate, well above FlashAttention-2's (353 / 194 TFLOP/s, ROCm/flash-
    attention issue 142); the estimate names it, and the Megatron-LM script asks Transformer
    Engine on ROCm for it."""
    model, cluster = ModelSpec.preset("llama-3-8b"), Cluster.preset("mi300x-8")
    cfg = ParallelConfig(dp=8)
    times = {}
    for kernel in ("flash", "cudnn"):
        job = Job(global_batch_size=64, seq_len=8192, framework="megatron",
                  attention_kernel=kernel)
        times[kernel] = estimate(model, cluster, job, cfg).step_time_s
    assert times["cudnn"] < 0.9 * times["flash"]
    gpu = GPU.preset("mi300x", calibrated=False).efficiency
    assert gpu.attention_for("cudnn") == (0.4338, 0.3629)
    assert gpu.attention_for("flash") == (0.2751, 0.1578)
    # The MI355X alike: AITER's v3 kernels (1259 / 1167 TFLOP/s) against Composable Kernel's
    # FlashAttention-2-style one (894 / 469), both HipKittens@f09e9685 on the same shape.
    gpu = GPU.preset("mi355x", calibrated=False).efficiency
    assert gpu.attention_for("cudnn") == (0.5, 0.464)
    assert gpu.attention_for("flash") == (0.3552, 0.1865)
    job = Job(global_batch_size=64, seq_len=8192, framework="megatron", attention_kernel="cudnn")
    p = plan(model, cluster, job)
    assert "NVTE_CK_USES_BWD_V3=1" in p.emit("megatron")
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "mi300x-8",
                      "--framework", "megatron", "--attention-kernel", "cudnn",
                      "--global-batch-size", "64", "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 0, out.stderr
    assert "AMD aiter v3 attention" in out.stdout
    h100 = Job(global_batch_size=64, seq_len=8192, framework="megatron", attention_kernel="cudnn")
    assert "NVTE_CK_USES" not in plan(model, Cluster.preset("dgx-h100"), h100).emit("megatron")
    # PyTorch's SDPA on ROCm has no such backend: refused by name, exit 2 from the CLI.
    tt = Job(global_batch_size=64, seq_len=8192, framework="torchtitan", attention_kernel="cudnn")
    with pytest.raises(SpecError, match="AMD's v3 attention"):
        estimate(model, cluster, tt, cfg)
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "mi300x-8",
                      "--framework", "torchtitan", "--attention-kernel", "cudnn",
                      "--global-batch-size", "64", "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    # A search over several trainers leaves out those that cannot run the job, and says so.
    with pytest.warns(UserWarning, match="torchtitan is not searched: .*AMD's v3 attention"):
        both = plan(model, cluster, job, constraints={"frameworks": ["megatron", "torchtitan"]})
    assert both.job.framework == "megatron"
    with pytest.raises(SpecError, match="no trainer named can run this job"):
        plan(model, cluster, job, constraints={"frameworks": ["torchtitan", "deepspeed"]})


def test_amds_fp8_weight_transpose_cache_can_be_left_off() -> None:
    """ROCm Megatron-LM's --no-fp8-weight-transpose-cache keeps one fp8 copy of each weight
    instead of two (the copy and its transpose), even under FSDP: Llama-2-70B fp8 on 16
    MI325X with FSDP2 had 227 GiB of each GPU in use (hisohara/ai-scripts@4fb66ab5
    training/03_primus/run-llama2-70B-2N.log), which one copy fits and two (a 70B model's
    70 GB more) do not. Other trainers and GPUs are refused by name."""
    model = ModelSpec(name="llama-2-70b-gqa", num_layers=80, hidden_size=8192, num_heads=64,
                      num_kv_heads=8, ffn_hidden_size=28672, vocab_size=32000, gated_mlp=True)
    cluster = Cluster.preset("mi325x-8", num_nodes=2)
    cfg = ParallelConfig(dp=16, zero_stage=3, micro_batch_size=10, recompute="full")
    job = Job(global_batch_size=640, seq_len=4096, precision="fp8", framework="megatron",
              attention_kernel="cudnn")
    both = estimate(model, cluster, job, cfg)
    one = estimate(model, cluster, dataclasses.replace(job, fp8_weight_transpose_cache=False),
                   cfg)
    layer_params = model.num_layers * (8192 * (8192 + 2 * 1024) + 8192 * 8192
                                       + 3 * 8192 * 28672)
    assert both.peak_memory_bytes - one.peak_memory_bytes == pytest.approx(layer_params, rel=0.01)
    assert not both.fits and one.fits
    assert one.peak_memory_bytes / 2**30 == pytest.approx(227.04, rel=0.10)
    fixed = {"fixed": {"dp": 16, "zero_stage": 3, "micro_batch_size": 1}}
    p = plan(model, cluster, dataclasses.replace(job, fp8_weight_transpose_cache=False),
             constraints=fixed)
    assert "--no-fp8-weight-transpose-cache" in p.emit("megatron")
    assert "--no-fp8-weight-transpose-cache" not in plan(model, cluster, job,
                                                         constraints=fixed).emit("megatron")
    for fw, gpus in (("megatron", "dgx-h100"), ("torchtitan", "mi325x-8")):
        other = Job(global_batch_size=640, seq_len=4096, precision="fp8", framework=fw,
                    fp8_weight_transpose_cache=False)
        with pytest.raises(SpecError, match="--no-fp8-weight-transpose-cache"):
            estimate(model, Cluster.preset(gpus, num_nodes=2), other, cfg)
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "mi325x-8",
                      "--precision", "fp8", "--framework", "megatron",
                      "--no-fp8-weight-transpose-cache", "--global-batch-size", "64",
                      "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 0 and "no fp8 weight transpose cache" in out.stdout, out.stderr
    out = run_planner("estimate", "--model", "llama-3-8b", "--cluster", "dgx-h100",
                      "--precision", "fp8", "--no-fp8-weight-transpose-cache",
                      "--global-batch-size", "64", "--seq-len", "8192", "--dp", "8")
    assert out.returncode == 2 and "--no-fp8-weight-transpose-cache" in out.stderr
    assert "Traceback" not in out.stderr
