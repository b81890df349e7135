"""Published training runs: read them, predict them, compare, and fit the GPU efficiencies.

Two files ship in ``costmodel/data``:

- ``calibration.json``: a copy of the project's shared calibration set (Narayanan et al. 2021
  Table 1, Korthikanti et al. 2022 Table 5; all Megatron-LM on Selene A100s).
- ``published_runs.json``: published runs of other sources (torchtitan, MosaicML
  llm-foundry, IBM fms-fsdp, torchao, NeMo, Megatron-Bridge, Megatron-LM on H100 and B200,
  DeepSpeed ZeRO-3, BLOOM, MT-NLG, OPT), each with its source, the flags it ran with and,
  where published, its peak memory.

``planner calibrate`` fits the efficiencies every GPU takes on both
(``costmodel.fitting.calibration``); ``planner validate`` prints each source's error under that fit
and when the source is left out of it.

A row gives the model shape, the hardware, the trainer and its configuration, and what was
measured: ``iteration_time_s``, ``tokens_per_s_per_gpu`` or ``tflops_per_gpu`` (then with the
FLOP count the source used; Narayanan et al. 2021 count Eq. 3, with recompute).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.config import (
    FLOAT8_RECIPES,
    MOE_DISPATCHERS,
    TRI_STATE_JOB_FLAGS,
    Job,
    ParallelConfig,
)
from costmodel.errors import SpecError
from costmodel.formulas.estimate import Estimate, estimate
from costmodel.hardware import GPU, Cluster, Link
from costmodel.model import ModelSpec
from hardware_profiles.files import read_json_object, to_toml

__all__ = ["Comparison", "PublishedRun", "calibration_toml", "compare", "default_runs_path",
           "eq3_flops", "fit_efficiency", "load_runs", "predict_run", "shipped_runs"]

# Micro-batch size and model chunks per pipeline rank of the Narayanan et al. 2021 Table 1
# runs, which the paper's table omits: NVIDIA/Megatron-LM@6985e589 examples/sc21/
# run_table_1.sh (MBS=..., --num-layers-per-virtual-pipeline-stage; chunks = layers / pp /
# layers per virtual stage). Every run: --fp16, full uniform recompute, torch DDP when PP=1
# and Megatron's local DDP otherwise (examples/sc21/CONFIG.sh).
SC21_TABLE1 = {
    "1.7B": (16, 1), "3.6B": (16, 1), "7.5B": (16, 1), "18.4B": (8, 1), "39.1B": (4, 1),
    "76.1B": (2, 3), "145.6B": (2, 2), "310.1B": (1, 2), "529.6B": (1, 3), "1008.0B": (1, 1),
}

MEASURES = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu")


def default_runs_path(which: str = "calibration") -> Path:
    """The shipped ``calibration.json`` (``"calibration"``), ``published_runs.json``
    (``"published"``; ``"heldout"`` is its former name) or ``frontier_runs.json``
    (``"frontier"``: runs of frontier architectures, held out of the fit)."""
    name = {"calibration": "calibration.json", "published": "published_runs.json",
            "heldout": "published_runs.json", "frontier": "frontier_runs.json"}[which]
    return Path(str(resources.files("costmodel").joinpath("data", name)))


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One published run, as the planner's inputs, and the figure it is compared on."""

    id: str
    source: str
    model: ModelSpec
    cluster: Cluster
    job: Job
    config: ParallelConfig
    measure: str
    measured: float
    group: str | None = None
    note: str = ""
    #: What the run used as its source states it (``compile``, ``async_tp``,
    #: ``float8_recipe``, ``attention_kernel``, ``gpu_variant``, ``trainer``, ...).
    flags: dict[str, Any] = field(default_factory=dict)
    #: Peak memory per GPU the source publishes, GiB, and what it measured ("max reserved",
    #: "max allocated"); None where it gives none.
    peak_memory_gib: float | None = None
    peak_memory_what: str = ""
    #: "solid", or "medium" when a setting of the run is assumed (named in ``note``).
    confidence: str = "solid"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.measured) and self.measured > 0):
            raise ValueError(f"measured {self.measure} must be a positive number, got "
                             f"{self.measured!r}")
        if self.peak_memory_gib is not None and not (math.isfinite(self.peak_memory_gib)
                                                     and self.peak_memory_gib > 0):
            raise ValueError(f"memory.peak_gib must be a positive number of GiB, got "
                             f"{self.peak_memory_gib!r}")
        if self.confidence not in ("solid", "medium"):
            raise ValueError(f"confidence must be 'solid' or 'medium', got {self.confidence!r}")
        passes = self.flags.get("pipeline_passes", 1)
        if not (isinstance(passes, int) and passes >= 1
                and self.job.global_batch_size % passes == 0
                and (passes == 1 or self.config.pp > 1)):
            raise ValueError(f"flags.pipeline_passes must be a whole number of passes that "
                             f"divides the global batch, with pipeline parallel; got "
                             f"{passes!r}")

    @property
    def pipeline_passes(self) -> int:
        """Whole pipeline passes per optimizer step (``flags.pipeline_passes``, default 1):
        a trainer that accumulates gradients by running its pipeline schedule once per
        accumulation batch (NeMo AutoModel calls ``schedule.step`` per batch,
        nemo_automodel/recipes/llm/train_ft.py) fills and drains the pipeline, and
        reduce-scatters its gradients, that many times a step."""
        return int(self.flags.get("pipeline_passes", 1))


def eq3_flops(model: ModelSpec, job: Job) -> float:
    """FLOPs per iteration with full recompute, Narayanan et al. 2021 Eq. 3:
    ``96 B s l h^2 (1 + s / 6h + V / 16lh)``."""
    b, s, l_, h = job.global_batch_size, job.seq_len, model.num_layers, model.hidden_size
    v = model.vocab_size
    return 96.0 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))


def _gpt(m: dict[str, Any], name: str, dropout: bool) -> ModelSpec:
    """A Megatron-LM GPT (learned positions, LayerNorm, biases, tied embeddings, GELU MLP)."""
    return ModelSpec(
        name=name, num_layers=int(m["layers"]), hidden_size=int(m["hidden"]),
        num_heads=int(m["heads"]), num_kv_heads=int(m.get("kv_heads") or m["heads"]),
        ffn_hidden_size=int(m["ffn_hidden"]), vocab_size=int(m["vocab"]),
        gated_mlp=False, tied_embeddings=True,
        position_embedding=str(m.get("position_embedding", "learned")),
        max_position_embeddings=int(m["seq_len"]), norm="layernorm", bias=True,
        dropout=dropout,
    )


def _llama(m: dict[str, Any], name: str) -> ModelSpec:
    """A Llama-style model (RoPE, RMSNorm, SwiGLU, untied), MoE when it has experts; with
    ``sliding_window`` / ``global_every`` its local layers (``ModelSpec``), ``bias`` and
    ``attention_sinks`` where the model has them (GPT-OSS)."""
    num_experts, top_k = 0, 0  # ModelSpec's defaults: a dense model
    moe_ffn_hidden_size: int | None = None
    if m.get("num_experts"):
        num_experts, top_k, moe_ffn_hidden_size = (int(m["num_experts"]), int(m["top_k"]),
                                                   int(m["moe_ffn_hidden"]))
    return ModelSpec(
        name=name, num_layers=int(m["layers"]), hidden_size=int(m["hidden"]),
        num_heads=int(m["heads"]), num_kv_heads=int(m.get("kv_heads") or m["heads"]),
        ffn_hidden_size=int(m["ffn_hidden"]), vocab_size=int(m["vocab"]),
        head_dim=int(m["head_dim"]) if m.get("head_dim") else None, gated_mlp=True,
        num_experts=num_experts, top_k=top_k, moe_ffn_hidden_size=moe_ffn_hidden_size,
        sliding_window=int(m.get("sliding_window", 0)), global_every=int(m.get("global_every", 0)),
        bias=bool(m.get("bias", False)), attention_sinks=bool(m.get("attention_sinks", False)),
    )


def _published_year(source: str) -> int:
    """The year of the paper a run cites (``"... et al. 2022, ..."``); 0 when it names none."""
    found = re.search(r"et al\.,? (\d{4})", source)
    return int(found.group(1)) if found else 0


def _from_calibration_row(row: dict[str, Any]) -> PublishedRun:
    """A row of the shared ``calibration.json`` (Megatron-LM GPT runs on Selene)."""
    m, c, hw = row["model"], row["config"], row["hardware"]
    model = _gpt(m, row["id"], dropout=True)
    mbs, v = c.get("micro_batch"), c.get("virtual_pipeline_stages") or 1
    if mbs is None:
        if m["params"] not in SC21_TABLE1:
            raise SpecError(f"run {row['id']!r} gives no micro_batch")
        mbs, v = SC21_TABLE1[m["params"]]
    gpus = int(hw["gpus_total"])
    cluster = Cluster.preset("selene", num_nodes=max(gpus // 8, 1))
    pp = int(c["pp"])
    job = Job(global_batch_size=int(c["global_batch"]), seq_len=int(m["seq_len"]),
              precision="fp16", optimizer="adam", framework="megatron", flash_attention=False,
              # torch DDP overlaps its buckets with backward; Megatron's local DDP (PP > 1)
              # reduced after the backward pass in 2021 (examples/sc21/CONFIG.sh).
              overlap_grad_reduce=pp == 1,
              # The asynchronous TP gradient all-reduce came to Megatron-LM in August 2021
              # (commit cf7efd4f, after the SC21 code of examples/sc21): runs published from
              # 2022 on have it.
              overlap_tp_grad_comm=_published_year(row["source"]) >= 2022,
              # Gradient accumulation fusion came in February 2022 (commit 83b1e42f) for fp32
              # main gradients, which the 2022 runs have: Korthikanti et al. 2022, Fig. 1
              # counts 18 bytes per parameter (2 weight + 4 gradient + 12 optimizer). The SC21
              # runs accumulated fp16 gradients by autograd's in-place add.
              fuse_grad_accumulation=_published_year(row["source"]) >= 2022,
              # Overlapped pipeline send/receive came in 2023 (commit f9283c5a): the 2021 and
              # 2022 interleaved runs waited for each transfer.
              overlap_p2p_comm=_published_year(row["source"]) >= 2024)
    config = ParallelConfig(
        dp=int(c["dp"]), tp=int(c["tp"]), pp=pp, micro_batch_size=int(mbs),
        virtual_pipeline_stages=int(v), sequence_parallel=bool(c.get("sequence_parallel")),
        recompute=str(c["recompute"]))
    measured = row["measured"]
    measure = "iteration_time_s" if "iteration_time_s" in measured else "tflops_per_gpu"
    return PublishedRun(id=row["id"], source=row["source"], model=model, cluster=cluster,
                        job=job, config=config, measure=measure,
                        measured=float(measured[measure]), note=row.get("note", ""))


def _from_normalized_row(row: dict[str, Any]) -> PublishedRun:
    """A row in the planner's own schema (``model`` / ``cluster`` / ``job`` / ``config``)."""
    m = row["model"]
    if m.get("preset"):
        # A shipped preset (ModelSpec.preset), with the fields the run changes (an MTP module
        # a trainer leaves out, say).
        model = replace(ModelSpec.preset(str(m["preset"])), **dict(m.get("overrides") or {}))
    elif m.get("style") == "gpt":
        model = _gpt(m, row["id"], dropout=bool(m.get("dropout", False)))
    else:
        model = _llama(m, row["id"])
    cl = dict(row["cluster"])
    cluster = Cluster(name=row["id"], **cl)
    flags = dict(row.get("flags") or {})
    job = Job(**{**_job_flags(flags), **row["job"]})
    config = ParallelConfig(**row["config"])
    measure = next((k for k in MEASURES if k in row["measured"]), None)
    if measure is None:
        raise SpecError(f"its measured holds none of {', '.join(MEASURES)}")
    mem = row.get("memory") or {}
    return PublishedRun(id=row["id"], source=row["source"], model=model, cluster=cluster,
                        job=job, config=config, measure=measure,
                        measured=float(row["measured"][measure]), group=row.get("group"),
                        note=row.get("note", ""), flags=flags,
                        peak_memory_gib=float(mem["peak_gib"]) if "peak_gib" in mem else None,
                        peak_memory_what=str(mem.get("what", "")),
                        confidence=str(row.get("confidence", "solid")))


def _job_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The Job inputs a run's ``flags`` set: ``compile`` (torch.compile) or ``fused_kernels``
    (the same fusion from a kernel library, e.g. ``"transformer-engine"``), ``async_tp``
    (torchtitan's async TP, which the Job calls ``tp_comm_overlap``), ``fp8_param_gather``
    (Megatron-LM's fp8 parameters; torchtitan's float8 FSDP all-gather),
    ``fp8_weight_transpose_cache`` (false: ROCm Megatron-LM's
    --no-fp8-weight-transpose-cache), ``fused_cross_entropy``,
    ``compile_loss``, ``loss_fp32_upcast`` (false: the cross entropy on the 16-bit logits,
    ``Job.loss_upcast``),
    ``grad_reduce_in_fp32``, ``distribute_saved_activations`` and
    ``zero3_synchronous_gather`` (DeepSpeed's ZeRO-3 of 2021), ``float8_recipe``,
    ``moe_dispatcher`` and ``moe_router_force_load_balancing`` (the forced even routing of
    benchmark tables: ``Job.moe_load_imbalance`` 1.0) or ``moe_load_imbalance`` (the
    imbalance published for the balancing method the run used)."""
    out: dict[str, Any] = {}
    if "compile" in flags:
        out["compile"] = bool(flags["compile"])
    if flags.get("fused_kernels"):
        # A PyTorch-native trainer running fused kernels without torch.compile (NeMo
        # AutoModel's Transformer Engine backend: TE's RMSNorm, fused rotary embedding and
        # attention, Megatron-Core's fused permutation and SwiGLU): each memory-bound tensor
        # read and written once, which is what Job.compile means to the cost model.
        out["compile"] = True
    if flags.get("async_tp"):
        out["tp_comm_overlap"] = True
    if flags.get("fp8_param_gather"):
        out["fp8_param_gather"] = True
    if flags.get("fp8_weight_transpose_cache") is False:
        out["fp8_weight_transpose_cache"] = False
    for key in TRI_STATE_JOB_FLAGS:
        if key in flags:
            out[key] = bool(flags[key])
    if "loss_fp32_upcast" in flags:  # Job checks it is true or false
        out["loss_upcast"] = flags["loss_fp32_upcast"]
    if flags.get("distribute_saved_activations"):
        out["distribute_saved_activations"] = True
    if flags.get("zero3_synchronous_gather"):
        out["zero3_synchronous_gather"] = True
    if flags.get("float8_recipe") in FLOAT8_RECIPES:  # torchao's; Transformer Engine's differ
        out["float8_recipe"] = str(flags["float8_recipe"])
    if flags.get("moe_dispatcher") in MOE_DISPATCHERS:
        out["moe_dispatcher"] = str(flags["moe_dispatcher"])
    if flags.get("moe_router_force_load_balancing"):
        out["moe_load_imbalance"] = 1.0
    elif "moe_load_imbalance" in flags:  # published for the balancing method the run used
        out["moe_load_imbalance"] = float(flags["moe_load_imbalance"])
    return out


def shipped_runs() -> list[PublishedRun]:
    """Every shipped published run: the calibration set, then the other sources."""
    return load_runs(default_runs_path("calibration")) + load_runs(default_runs_path("published"))


def load_runs(path: str | Path | None = None) -> list[PublishedRun]:
    """Runs of a JSON file ``{"runs": [...]}`` in either schema (default: the calibration set)."""
    p = Path(path) if path is not None else default_runs_path()
    rows = read_json_object(p, "runs file").get("runs")
    if not isinstance(rows, list):
        raise SpecError(f"runs file {str(p)[:200]!r} is not a JSON object with a 'runs' list")
    if not rows:
        raise SpecError(f"runs file {str(p)[:200]!r} holds no runs; add at least one to its "
                        "'runs' list")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SpecError(f"run #{i + 1} in {str(p)[:200]!r} is {row!r:.40}, not a JSON "
                            "object (see costmodel/data/published_runs.json)")
        try:
            out.append(_from_normalized_row(row) if "job" in row else _from_calibration_row(row))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            why = str(e) if isinstance(e, SpecError) else \
                f"it lacks {e.args[0]!r}" if isinstance(e, KeyError) else repr(e)
            raise SpecError(f"run {str(row.get('id', i + 1))[:80]!r} in {str(p)[:200]!r} is "
                            f"malformed: {why}") from None
    return out


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A run predicted: ``predicted`` and ``measured`` in the run's ``measure``, and
    ``error`` = predicted / measured - 1."""

    run: PublishedRun
    estimate: Estimate
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted / self.measured - 1.0


def run_estimate(run: PublishedRun, cluster: Cluster | None = None) -> Estimate:
    """``estimate`` of ``run`` (on ``cluster``, default its own). A run of G pipeline passes
    a step (``PublishedRun.pipeline_passes``) is G passes of the batch over G, each with its
    own fill, drain and gradient sync, and one optimizer step: the estimate of one pass with
    every term G times, but the optimizer step's once, offloaded to the CPU or not (the
    throughput figures follow)."""
    cl = run.cluster if cluster is None else cluster
    g = run.pipeline_passes
    if g == 1:
        return estimate(run.model, cl, run.job, run.config)
    one = estimate(run.model, cl, replace(run.job, global_batch_size=run.job.global_batch_size
                                          // g), run.config)
    if one.step_time_s is None:
        return one
    once = ("optimizer", "offload")  # after the last pass only
    terms = {k: v if k in once else g * v for k, v in one.time_breakdown_s.items()}
    step = g * one.step_time_s - (g - 1) * sum(one.time_breakdown_s.get(k, 0.0) for k in once)
    rate = g * one.step_time_s / step  # per-pass throughput over the step's

    def scaled(x: float | None, by: float) -> float | None:
        return None if x is None else x * by

    return replace(one, step_time_s=step, time_breakdown_s=terms,
                   tokens_per_s=scaled(one.tokens_per_s, rate),
                   model_tflops_per_gpu=scaled(one.model_tflops_per_gpu, rate),
                   mfu=scaled(one.mfu, rate), hfu=scaled(one.hfu, rate),
                   usd_per_million_tokens=scaled(one.usd_per_million_tokens, 1.0 / rate))


def predict_run(run: PublishedRun, est: Estimate) -> float:
    """The figure ``run`` is compared on, as ``est`` predicts it (its ``measure``)."""
    step = float(est.step_time_s or math.nan)
    if run.measure == "iteration_time_s":
        return step
    if run.measure == "tokens_per_s_per_gpu":
        return run.job.tokens_per_step / step / run.cluster.num_gpus
    return eq3_flops(run.model, run.job) / step / run.cluster.num_gpus / 1e12


def compare(runs: list[PublishedRun], gpu: GPU | None = None) -> list[Comparison]:
    """Predict every run (with ``gpu`` substituted for runs on a GPU of the same name, and
    its link inside a node too where it carries a measured one: ``planner profile``)."""
    out = []
    for run in runs:
        cluster = run.cluster
        if gpu is not None and cluster.gpu.name == gpu.name:
            link = gpu.intra_node_link if isinstance(gpu.intra_node_link, Link) \
                else cluster.intra_node_link
            cluster = replace(cluster, gpu=gpu, intra_node_link=link)
        est = run_estimate(run, cluster)
        out.append(Comparison(run=run, estimate=est, predicted=predict_run(run, est),
                              measured=run.measured))
    return out


FIT_KEYS = ("gemm", "kernel_overhead_us")
FIT_BOUNDS = ((0.3, 1.0), (0.0, 50.0))


def _with(gpu: GPU, x: np.ndarray) -> GPU:
    eff = replace(gpu.efficiency, gemm=float(x[0]), kernel_overhead_s=float(x[1]) * 1e-6)
    return replace(gpu, efficiency=eff)


def calibration_toml(gpu: GPU, values: dict[str, float], comparisons: list[Comparison],
                     runs_file: str, date: str) -> str:
    """The ``hardware_profiles/calibrated/<gpu>.toml`` text for fitted ``values``.

    ``[efficiency]`` holds the fitted values (attention scaled like the matmuls, as the runs
    use no fused attention; ``memory`` stays the profile's measured copy fraction);
    ``[transfer]`` the ratios of fitted to microbenchmark fractions and the fitted per-kernel
    overhead, for reference (other GPUs take ``calibrated/transfer.toml``, the all-source
    fit of ``costmodel.fitting.calibration``).
    """
    base = gpu.efficiency
    ratio_g = values["gemm"] / base.gemm
    errs = [abs(c.error) for c in comparisons]
    prov = (f"planner calibrate --gpu {gpu.name} --runs {runs_file} on {date}: least squares "
            f"over {len(comparisons)} published runs; mean |error| {100 * np.mean(errs):.2f}%, "
            f"max {100 * max(errs):.2f}%")
    table = {
        "provenance": prov,
        "efficiency": {
            "gemm": round(values["gemm"], 4),
            "memory": round(base.memory, 4),
            "kernel_overhead_us": round(values["kernel_overhead_us"], 3),
            "attention": round(min(1.0, base.attention * ratio_g), 4),
            "attention_backward": round(min(1.0, base.attention_backward * ratio_g), 4),
        },
        "transfer": {"gemm": round(ratio_g, 4), "memory": 1.0,
                     "kernel_overhead_us": round(values["kernel_overhead_us"], 3)},
        "runs": {c.run.id: {"predicted": float(f"{c.predicted:.4g}"),
                            "measured": float(f"{c.measured:.4g}"), "measure": c.run.measure}
                 for c in comparisons},
    }
    notes = {
        "efficiency": "gemm and kernel_overhead_us fitted; memory is the profile's measured copy "
                      "fraction;\nfused attention is not in the runs: its microbenchmark "
                      "fractions scaled like gemm.",
        "transfer": "In-training over microbenchmark efficiency of this GPU, for reference: the "
                    "ratios\nevery other GPU takes are the all-source fit's "
                    "(calibrated/transfer.toml).",
    }
    return to_toml(table, "Written by `planner calibrate`; do not edit by hand, re-run the "
                   "command.", notes, inline=("runs",))


def fit_efficiency(runs: list[PublishedRun], gpu: GPU) -> tuple[dict[str, float], list[Comparison]]:
    """Fit ``gemm`` and ``kernel_overhead_us`` of ``gpu`` to the runs on it.

    The memory fraction is not fitted: it is measured directly (a copy benchmark, in the
    profile), while in these runs its share of the step trades against the matmul fraction,
    so a joint fit leaves it poorly determined. Least squares (scipy, trust-region reflective
    within physical bounds) on the log of predicted over measured, so that iteration times and
    throughputs weigh alike. Returns the fitted values and the comparisons they give.
    """
    from scipy.optimize import least_squares

    mine = [r for r in runs if r.cluster.gpu.name == gpu.name]
    if not mine:
        raise SpecError(f"no run in the set was measured on {gpu.name!r}; nothing to fit")

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.array([math.log(c.predicted / c.measured) for c in compare(mine, _with(gpu, x))])

    eff = gpu.efficiency
    x0 = np.array([eff.gemm, eff.kernel_overhead_s * 1e6])
    lo, hi = zip(*FIT_BOUNDS, strict=True)
    x0 = np.clip(x0, lo, hi)
    fit = least_squares(residuals, x0, bounds=(lo, hi), x_scale=[0.1, 5.0],
                        diff_step=1e-3)
    values = dict(zip(FIT_KEYS, (float(v) for v in fit.x), strict=True))
    return values, compare(mine, _with(gpu, fit.x))
