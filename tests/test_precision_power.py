"""Optimizer states and master weights in low precision (Megatron-LM's precision-aware
optimizer), and GPUs held under a power limit."""

from __future__ import annotations

import dataclasses
import re

import pytest
from inprocess import run_planner
from test_emit import make_plan, megatron_parser

import hardware_profiles
from costmodel import GPU, Cluster, Job, ModelSpec, ParallelConfig, SpecError, estimate
from costmodel.formulas.states import state_bytes
from planner.emit import emit
from planner.emit.megatron import parse_array

GIB = 2**30
LLAMA = ModelSpec.preset("llama-3-70b")
CFG = ParallelConfig(dp=8, tp=8, zero_stage=1, recompute="full")


def _job(**kw: object) -> Job:
    return Job(global_batch_size=256, seq_len=4096, framework="megatron", **kw)  # type: ignore[arg-type]


# ---- optimizer state and master dtypes ---------------------------------------------------

@pytest.mark.parametrize(("states", "master", "optim"), [
    ("fp32", "fp32", 4 + 8), ("bf16", "fp32", 4 + 4), ("bf16", "fp16", 2 + 4),
    ("fp8", "fp16", 2 + 2)])
def test_megatron_bytes_per_parameter_follow_the_dtypes(states: str, master: str,
                                                        optim: float) -> None:
    """Megatron-LM keeps bf16 weights, fp32 main gradients and (masters + two Adam moments):
    4 + 8 = 12 bytes in fp32 (Korthikanti et al. 2022 count 18 bytes in all); with
    --exp-avg-dtype/--exp-avg-sq-dtype bf16 the moments take 2 + 2, fp8 1 + 1, and
    --main-params-dtype fp16 makes the masters 2."""
    job = _job(optimizer_state_dtype=states, master_weights_dtype=master)
    assert state_bytes(job, LLAMA) == (2.0, 4.0, optim)


def test_low_precision_states_shrink_memory_and_the_optimizer_step() -> None:
    cluster = Cluster(gpu="h100-sxm", num_nodes=8)
    full = estimate(LLAMA, cluster, _job(), CFG)
    low = estimate(LLAMA, cluster, _job(optimizer_state_dtype="bf16",
                                        master_weights_dtype="fp16"), CFG)
    assert low.memory.optimizer_bytes == pytest.approx(full.memory.optimizer_bytes * 6 / 12)
    assert low.time_breakdown_s["optimizer"] < full.time_breakdown_s["optimizer"]


def test_other_trainers_refuse_low_precision_states_by_name() -> None:
    cluster = Cluster(gpu="h100-sxm", num_nodes=8)
    for fw in ("torchtitan", "deepspeed"):
        job = Job(global_batch_size=256, seq_len=4096, framework=fw,
                  optimizer_state_dtype="bf16")
        with pytest.raises(SpecError, match="precision-aware optimizer"):
            estimate(LLAMA, cluster, job, ParallelConfig(dp=8, tp=8, zero_stage=2))
    with pytest.raises(SpecError, match="sgd keeps its own states"):
        Job(global_batch_size=8, seq_len=8, optimizer="sgd", optimizer_state_dtype="bf16")
    with pytest.raises(SpecError, match="optimizer_state_dtype"):
        Job(global_batch_size=8, seq_len=8, optimizer_state_dtype="int4")


def test_megatron_emits_the_precision_aware_optimizer_its_parser_reads() -> None:
    plan = make_plan("llama-3-8b", 2, ParallelConfig(dp=16, zero_stage=1), "megatron",
                     optimizer_state_dtype="bf16", master_weights_dtype="fp16")
    ns = megatron_parser().parse_args(parse_array(emit(plan, "megatron").text))
    assert ns.use_precision_aware_optimizer
    assert (ns.exp_avg_dtype, ns.exp_avg_sq_dtype, ns.main_params_dtype) == (
        "bf16", "bf16", "fp16")
    # The default writes none of it.
    plain = make_plan("llama-3-8b", 2, ParallelConfig(dp=16, zero_stage=1), "megatron")
    assert not megatron_parser().parse_args(
        parse_array(emit(plain, "megatron").text)).use_precision_aware_optimizer


def test_torchtitan_file_says_it_keeps_fp32_states() -> None:
    plan = make_plan("llama-3-8b", 2, ParallelConfig(dp=16, zero_stage=1), "megatron",
                     optimizer_state_dtype="bf16")
    out = emit(plan, "torchtitan")
    assert "torchtitan keeps fp32 optimizer states and master weights" in out.text


def test_the_dtype_flags_reach_the_job_line() -> None:
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "16",
                    "--global-batch-size", "64", "--seq-len", "4096", "--dp", "16",
                    "--zero", "1", "--framework", "megatron",
                    "--optimizer-state-dtype", "bf16", "--master-weights-dtype", "fp16")
    assert r.returncode == 0, r.stderr
    assert "adamw (bf16 states, fp16 masters), megatron conventions" in r.stdout
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "16",
                    "--global-batch-size", "64", "--seq-len", "4096", "--dp", "16",
                    "--optimizer-state-dtype", "bf16")
    assert r.returncode == 2 and "precision-aware optimizer" in r.stderr


# ---- power limit -------------------------------------------------------------------------

def test_a_power_limit_scales_compute_by_the_mlperf_exponent() -> None:
    """software.toml [power]: H100 MaxQ/MaxP in MLPerf Inference v4.0 (BERT-99 at 400 of
    700 W: 0.766 of the throughput) gives exponents 0.44-0.49."""
    alpha = hardware_profiles.load_software()["power"]["compute_exponent"]
    assert (400 / 700) ** alpha == pytest.approx(0.766, abs=0.02)
    b200 = GPU.preset("b200")
    held = Cluster(gpu="b200", num_nodes=1, power_limit_w=750).gpu
    factor = (750 / 1000) ** alpha
    assert held.efficiency.gemm == pytest.approx(b200.efficiency.gemm * factor)
    assert held.efficiency.attention == pytest.approx(b200.efficiency.attention * factor)
    assert held.efficiency.memory == b200.efficiency.memory
    assert held.power_limit_w == 750
    # At or above the TDP nothing changes; a saved cluster is not scaled twice.
    assert Cluster(gpu="b200", num_nodes=1, power_limit_w=1000).gpu == b200
    saved = Cluster(gpu="b200", num_nodes=1, power_limit_w=750)
    again = Cluster.from_dict(saved.to_dict())
    assert again.gpu.efficiency.gemm == pytest.approx(held.efficiency.gemm)
    assert dataclasses.replace(saved, num_nodes=2).gpu.efficiency.gemm == \
        pytest.approx(held.efficiency.gemm)


def test_a_power_limited_step_is_slower_and_says_so() -> None:
    job = Job(global_batch_size=16, seq_len=8192)
    cfg = ParallelConfig(dp=8, zero_stage=3)
    model = ModelSpec.preset("llama-3-8b")
    full = estimate(model, Cluster(gpu="b200", num_nodes=1), job, cfg).step_time_s
    held = estimate(model, Cluster(gpu="b200", num_nodes=1, power_limit_w=750), job,
                    cfg).step_time_s
    assert 1.05 < held / full < 1 / 0.87
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "b200",
                    "--power-limit", "750", "--global-batch-size", "16", "--seq-len", "8192",
                    "--dp", "8", "--zero", "3")
    assert r.returncode == 0 and "held at 750 W" in r.stdout
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "b200",
                    "--power-limit", "0", "--global-batch-size", "16", "--seq-len", "8192",
                    "--dp", "8")
    assert r.returncode == 2 and "power_limit_w" in r.stderr


def test_a_power_limit_above_the_tdp_is_refused_by_name() -> None:
    """A limit above the TDP would bind nothing: 5000 W on a 700 W H100 is a typo, not a
    setting, so it is refused (exit 2) rather than silently ignored."""
    with pytest.raises(SpecError, match=r"above h100-sxm's TDP \(700 W\)"):
        Cluster(gpu="h100-sxm", num_nodes=1, power_limit_w=701)
    r = run_planner("estimate", "--model", "llama-3-8b", "--gpus", "8", "--power-limit", "5000",
                    "--global-batch-size", "16", "--seq-len", "8192")
    assert r.returncode == 2 and "at most 700 W" in r.stderr and "Traceback" not in r.stderr


def test_a_gpu_without_a_tdp_cannot_be_limited() -> None:
    gpu = dataclasses.replace(GPU.preset("h100-sxm"), tdp_w=None)
    with pytest.raises(SpecError, match="no tdp_w"):
        Cluster(gpu=gpu, num_nodes=1, power_limit_w=500)


# ---- block-scaled float8 recipes ---------------------------------------------------------

def _b200_plan(framework: str, recipe: str, **job: object) -> object:
    from planner.result import Plan

    m, c = ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-b200", num_nodes=2)
    j = Job(global_batch_size=512, seq_len=4096, framework=framework, precision="fp8",
            float8_recipe=recipe, **job)  # type: ignore[arg-type]
    cfg = ParallelConfig(dp=16, zero_stage=3 if framework == "torchtitan" else 1)
    return Plan(model=m, cluster=c, job=j, config=cfg, estimate=estimate(m, c, j, cfg))


def test_mxfp8_needs_block_scaled_tensor_cores() -> None:
    """MXFP8 runs on Blackwell and CDNA 4 (the MI355X's white paper lists its MXFP8 rate);
    a Hopper profile has no mxfp8 peak and says which GPUs do."""
    job = Job(global_batch_size=64, seq_len=4096, precision="fp8", float8_recipe="mxfp8")
    cfg = ParallelConfig(dp=8, zero_stage=3)
    model = ModelSpec.preset("llama-3-8b")
    with pytest.raises(SpecError, match=r"no mxfp8 in its profile.*Blackwell"):
        estimate(model, Cluster.preset("dgx-h100"), job, cfg)
    for cluster in ("dgx-b200", "mi355x-8"):
        assert estimate(model, Cluster.preset(cluster), job, cfg).step_time_s > 0
    assert GPU.preset("mi355x").peak_flops("mxfp8") == GPU.preset("mi355x").peak_flops("fp8")


def test_mxfp8_casts_differ_from_tensorwise() -> None:
    """torchao's MX casts take each block's amax in the cast (no amax pass) but cannot gather
    float8 weights through FSDP: the cast time changes with the recipe."""
    from costmodel.formulas.eager import float8_casts

    gpu = GPU.preset("b200")
    for compiled in (False, True):
        tw, mx = (float8_casts(gpu, Job(global_batch_size=8, seq_len=8, precision="fp8",
                                        compile=compiled, float8_recipe=r),
                               1e8, 1e8, 7, 1e7) for r in ("tensorwise", "mxfp8"))
        assert sum(map(float, mx)) != pytest.approx(sum(map(float, tw)))


def test_mxfp8_is_emitted_in_each_trainers_own_words(tmp_path) -> None:
    from test_emit import _torchtitan_config_manager

    ns = megatron_parser().parse_args(parse_array(emit(_b200_plan("megatron", "mxfp8"),
                                                       "megatron").text))
    assert (ns.fp8, ns.fp8_recipe) == ("e4m3", "mxfp8")
    ns = megatron_parser().parse_args(parse_array(emit(_b200_plan("megatron", "blockwise"),
                                                       "megatron").text))
    assert (ns.fp8, ns.fp8_recipe) == ("hybrid", "blockwise")
    out = emit(_b200_plan("torchtitan", "mxfp8"), "torchtitan")
    manager = _torchtitan_config_manager()
    path = tmp_path / "job.toml"
    path.write_text(out.text)
    jc = manager().parse_args(["--job.config_file", str(path)])
    assert jc.model.converters == ["quantize.linear.mx"]
    assert jc.quantize.linear.mx.recipe_name == "mxfp8_cublas"
    assert "output" in jc.quantize.linear.mx.filter_fqns


def test_blockwise_is_megatrons_and_elsewhere_refused_or_mapped() -> None:
    job = Job(global_batch_size=64, seq_len=4096, precision="fp8", float8_recipe="blockwise")
    with pytest.raises(SpecError, match="torchtitan has no block-wise float8"):
        estimate(ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-h100"), job,
                 ParallelConfig(dp=8, zero_stage=3))
    out = emit(_b200_plan("megatron", "blockwise"), "torchtitan")
    assert "no block-wise float8 recipe" in out.text
    assert 'recipe_name = "tensorwise"' in out.text


# ---- NVFP4 and the bytes of block scales -------------------------------------------------

def _megatron_b200(precision: str, recipe: str = "tensorwise") -> tuple[float, float, float]:
    """(step seconds, activation bytes, weight-cache bytes) of Llama 3 8B on 8 B200s under
    Megatron-LM in ``precision`` (fp8 with ``recipe``)."""
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron", precision=precision,
              float8_recipe=recipe)
    est = estimate(ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-b200"), job,
                   ParallelConfig(dp=8, zero_stage=1, micro_batch_size=1))
    assert est.step_time_s is not None
    return est.step_time_s, est.memory.activations_bytes, est.memory.weights_bytes


def test_nvfp4_matmuls_run_at_the_fp4_rate_and_keep_half_a_byte() -> None:
    """NVFP4 (Transformer Engine's recipe under Megatron-LM) runs a layer's linears at the
    datasheet's nvfp4 rate (B200: 9 PF dense, twice fp8's), so the step is shorter, though
    not twice: attention and the output layer stay bf16 and the quantize kernels remain.
    It saves each linear's input in half a byte plus one E4M3 scale per 16 elements, and
    caches half-byte weight copies."""
    assert GPU.preset("b200").peak_flops("nvfp4") == 2 * GPU.preset("b200").peak_flops("fp8")
    fp8 = _megatron_b200("fp8")
    fp4 = _megatron_b200("nvfp4")
    assert 0.5 * fp8[0] < fp4[0] < 0.9 * fp8[0]
    assert fp4[1] < fp8[1] and fp4[2] < fp8[2]


def test_nvfp4_matmuls_take_the_measured_fp4_fraction_where_a_profile_has_one() -> None:
    """The B200's NVFP4 matmul is measured (cuBLASLt through torch._scaled_mm: 5.50 of 9
    PFLOP/s at 6144 cubed, pytorch/ao PR #2427): its fraction, not fp8's, paces an NVFP4
    matmul there, about 1.6x fp8's rate rather than the datasheets' 2x; a GPU without one
    (the GB200) takes fp8's fraction, and says so (planner gpus --provenance)."""
    from costmodel.formulas.roofline import gemm_time

    b200, gb200 = GPU.preset("b200"), GPU.preset("gb200")
    assert b200.efficiency.gemm_fp4 is not None and gb200.efficiency.gemm_fp4 is None
    assert b200.efficiency.gemm_for("nvfp4") == b200.efficiency.gemm_fp4 \
        < b200.efficiency.gemm_for("fp8")
    assert gb200.efficiency.gemm_for("nvfp4") == gb200.efficiency.gemm_for("fp8")
    n = 16384.0
    fp8, fp4 = (float(gemm_time(b200, d, n, n, n)) for d in ("fp8", "nvfp4"))
    assert fp8 / fp4 == pytest.approx(2 * 0.611 / 0.763, rel=0.02)
    assert hardware_profiles.provenance("b200")["efficiency"]["gemm_fp4"] == "measured"
    assert hardware_profiles.provenance("gb200")["efficiency"]["gemm_fp4"] == "assumed"
    assert "gemm_fp4" not in hardware_profiles.provenance("h100-sxm")["efficiency"]


def test_block_scales_cost_memory() -> None:
    """MXFP8 keeps one E8M0 scale per 32 elements and block-wise fp8 one fp32 per 128 beside
    each saved fp8 input (roofline.QUANTIZED_BYTES): more activation memory than per-tensor
    fp8, and MXFP8's more than block-wise's (1/32 against 4/128 = 1/32 of a byte: equal)."""
    tw, mx, bw = (_megatron_b200("fp8", r)[1] for r in ("tensorwise", "mxfp8", "blockwise"))
    assert mx > tw and bw > tw
    assert mx == pytest.approx(bw, rel=1e-6)


def test_transformer_engine_quantizes_count_in_the_step() -> None:
    """Each linear's input and output gradient is quantized row- and column-wise (read 2
    bytes, write twice the format's): a Megatron-LM fp8 layer spends memory-bound time that
    a bf16 layer does not, and NVFP4's narrower copies cost less of it than fp8's."""
    from costmodel.formulas.eager import te_quantize

    gpu = GPU.preset("b200")
    fp8, fp4 = (te_quantize(gpu, Job(global_batch_size=8, seq_len=8, precision=p), 1e9, 1e9, 4)
                for p in ("fp8", "nvfp4"))
    over = gpu.efficiency.kernel_overhead_s * 4
    bw = gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory
    assert float(fp8[0]) == pytest.approx(4.0 * 1e9 / bw + over)
    assert float(fp4[1]) == pytest.approx((2.0 + 2 * (0.5 + 1 / 16)) * 1e9 / bw + over)


@pytest.mark.parametrize(("precision", "home", "elsewhere"), [
    # NVFP4 is Blackwell's FP4, MXFP4 CDNA 4's: each GPU refuses the other's by name.
    ("nvfp4", "dgx-b200", [("dgx-h100", r"h100-sxm has no nvfp4 in its profile.*Blackwell"),
                           ("mi355x-8", r"mi355x has no nvfp4.*--precision mxfp4")]),
    ("mxfp4", "mi355x-8", [("dgx-b200", r"b200 has no mxfp4 in its profile.*CDNA 4.*nvfp4"),
                           ("mi300x-8", r"mi300x has no mxfp4")]),
])
def test_fp4_is_its_gpus_and_megatrons_and_refused_by_name_elsewhere(
        precision: str, home: str, elsewhere: list[tuple[str, str]]) -> None:
    model, cfg = ModelSpec.preset("llama-3-8b"), ParallelConfig(dp=8, zero_stage=1)
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron", precision=precision)
    assert estimate(model, Cluster.preset(home), job, cfg).step_time_s
    for cluster, why in elsewhere:
        with pytest.raises(SpecError, match=why):
            estimate(model, Cluster.preset(cluster), job, cfg)
    with pytest.raises(SpecError, match=f"torchtitan's {precision.upper()} linears are not "
                                        "modelled"):
        estimate(model, Cluster.preset(home), dataclasses.replace(job, framework="torchtitan"),
                 ParallelConfig(dp=8, zero_stage=3))
    with pytest.raises(SpecError, match="--fp4-param-gather"):
        estimate(model, Cluster.preset(home), dataclasses.replace(job, fp8_param_gather=True),
                 cfg)
    # The CLI says why before costing any split (exit 2, no traceback).
    cluster, why = elsewhere[0]
    res = run_planner("plan", "--model", "llama-3-8b", "--cluster", cluster,
                      "--global-batch-size", "64", "--seq-len", "4096",
                      "--framework", "megatron", "--precision", precision)
    assert res.returncode == 2 and re.search(why, res.stderr), res.stderr
    assert "Traceback" not in res.stderr


def test_nvfp4_is_emitted_as_megatrons_fp4_flags_and_mapped_to_mxfp8_elsewhere() -> None:
    from planner.result import Plan

    m, c = ModelSpec.preset("llama-3-8b"), Cluster.preset("dgx-b200")
    j = Job(global_batch_size=512, seq_len=4096, framework="megatron", precision="nvfp4")
    cfg = ParallelConfig(dp=8, zero_stage=1)
    p = Plan(model=m, cluster=c, job=j, config=cfg, estimate=estimate(m, c, j, cfg))
    ns = megatron_parser().parse_args(parse_array(emit(p, "megatron").text))
    assert (ns.fp4, ns.fp4_recipe, ns.fp8) == ("e2m1", "nvfp4", None)
    out = emit(p, "torchtitan")
    assert "own NVFP4 linears are not modelled: emitted MXFP8" in out.text
    assert 'recipe_name = "mxfp8_cublas"' in out.text


def test_provenance_says_how_many_of_a_generations_runs_back_its_bands() -> None:
    """``planner gpus --provenance``: CDNA 4's Megatron-LM runs come from two sources (MLPerf
    Training v5.1 in fp8 and v6.0 in MXFP4), so they steer the fit; its torchtitan runs
    have one (AMD's cluster validation suite) and do not
    (costmodel.fitting.calibration.CELL_MIN_SOURCES). A generation without runs is
    extrapolated."""
    res = run_planner("gpus", "--provenance")
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    mi355x = hardware_profiles.provenance("mi355x")
    assert 0 < mi355x["fitted_runs"] < mi355x["runs"]
    assert lines["mi355x"].endswith(
        f"{mi355x['runs']} (cdna4), {mi355x['fitted_runs']} fitted on")
    assert lines["l40s"].endswith("none (ada): bands extrapolated")
    # The attention column covers every kernel a profile gives: the MI300X's FlashAttention-2
    # and v3 kernels are measured, its AOTriton assumed; all of the MI355X's are measured.
    assert hardware_profiles.provenance("mi300x")["efficiency"]["attention_aotriton"] == "assumed"
    assert lines["mi300x"].split()[5] == "partly" and lines["mi355x"].split()[5] == "measured"
    h100 = hardware_profiles.provenance("h100-sxm")
    assert h100["fitted_runs"] > 0 and "extrapolated" not in lines["h100-sxm"]


def _megatron_mi355x(precision: str) -> tuple[float, float, float]:
    model, cluster = ModelSpec.preset("llama-3-8b"), Cluster.preset("mi355x-8")
    job = Job(global_batch_size=32, seq_len=8192, framework="megatron", precision=precision)
    est = estimate(model, cluster, job, ParallelConfig(dp=8, zero_stage=1, micro_batch_size=2))
    assert est.step_time_s is not None
    return est.step_time_s, est.memory.activations_bytes, est.memory.weights_bytes


def test_mxfp4_runs_at_cdna4s_fp4_rate_with_e8m0_scales() -> None:
    """MXFP4 (AMD's recipe: E2M1 with one E8M0 scale per 32, every linear's three matmuls)
    runs at CDNA 4's mxfp4 peak (10 PF dense on the MI355X, twice fp8's) times the fraction
    AITER's MXFP4 GEMM reaches (5.63 of 10.07 PF at 16384 cubed, ROCm/aiter@9a419120
    a4w4_blockscale_tuned_gemm.csv), about 1.7x fp8's rate; the step is shorter than fp8's
    though not by that (attention, the output layer and the quantize kernels stay), and
    saved inputs and weight copies take half a byte and a scale byte per 32."""
    from costmodel.formulas.roofline import QUANTIZED_BYTES, gemm_time

    mi355x = GPU.preset("mi355x")
    assert mi355x.peak_flops("mxfp4") == pytest.approx(2 * mi355x.peak_flops("fp8"), rel=1e-4)
    assert mi355x.efficiency.gemm_for("mxfp4") == mi355x.efficiency.gemm_fp4
    n = 16384.0
    fp8, fp4 = (float(gemm_time(mi355x, d, n, n, n)) for d in ("fp8", "mxfp4"))
    assert fp8 / fp4 == pytest.approx(2 * 0.559 / 0.654, rel=0.02)
    assert QUANTIZED_BYTES["mxfp4"] == (0.5 + 1 / 32, 0.5 + 1 / 32)
    f8, f4 = _megatron_mi355x("fp8"), _megatron_mi355x("mxfp4")
    assert 0.6 * f8[0] < f4[0] < 0.95 * f8[0]
    assert f4[1] < f8[1] and f4[2] < f8[2]
    assert hardware_profiles.provenance("mi355x")["efficiency"]["gemm_fp4"] == "measured"
    assert hardware_profiles.provenance("mi350x")["efficiency"]["gemm_fp4"] == "assumed"


def test_mxfp4_is_emitted_as_amds_fp4_flags_and_mapped_to_mxfp8_elsewhere() -> None:
    """Megatron-LM under Primus takes ``--fp4-format e2m1 --fp4-recipe mxfp4`` (Primus adds
    mxfp4 to Megatron's FP4 recipes: AMD-AGI/Primus primus/backends/megatron/core/enums.py;
    upstream's parser knows nvfp4 alone, so the check widens its choices as Primus does);
    torchtitan gets torchao's MXFP8, re-estimated."""
    from planner.result import Plan

    m, c = ModelSpec.preset("llama-3-8b"), Cluster.preset("mi355x-8")
    j = Job(global_batch_size=512, seq_len=4096, framework="megatron", precision="mxfp4")
    cfg = ParallelConfig(dp=8, zero_stage=1)
    p = Plan(model=m, cluster=c, job=j, config=cfg, estimate=estimate(m, c, j, cfg))
    parser = megatron_parser()
    for action in parser._actions:
        if action.dest == "fp4_recipe":
            action.choices = [*(action.choices or []), "mxfp4"]
    ns = parser.parse_args(parse_array(emit(p, "megatron").text))
    assert (ns.fp4, ns.fp4_recipe, ns.fp8) == ("e2m1", "mxfp4", None)
    out = emit(p, "torchtitan")
    assert "own MXFP4 linears are not modelled: emitted MXFP8" in out.text
