"""What the emitters share: the lowering to a trainer's capabilities, the header, the types."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import hardware_profiles
from costmodel.config import FP4_PRECISIONS, Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.eager import loss_kind
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.moe import routing_words
from costmodel.formulas.states import megatron_grad_bytes
from costmodel.formulas.vschedules import dualpipe_costing
from costmodel.frameworks import Framework, framework
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import InferenceConfig, InferenceEstimate, InferenceJob
from costmodel.units import GIB
from hardware_profiles.files import printable
from planner.alternatives import describe
from planner.version import __version__


class _Source(Protocol):
    @property
    def model(self) -> str: ...


class Planned(Protocol):
    """What an emitter reads of a plan (``planner.Plan`` is one): the model, cluster, job,
    configuration and estimate, and where a traced module comes from."""

    @property
    def model(self) -> ModelSpec | LayerCosts: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def job(self) -> Job | InferenceJob: ...
    @property
    def config(self) -> ParallelConfig | InferenceConfig: ...
    @property
    def estimate(self) -> Estimate | InferenceEstimate: ...
    @property
    def module(self) -> _Source | None: ...

    def preset(self, what: str) -> ModelSpec:
        """The plan's ``ModelSpec``; ``SpecError`` where the plan is a traced module's."""
        ...


@dataclass(frozen=True, kw_only=True)
class Lowered:
    """A configuration and job as a trainer can run them, and what had to change."""

    config: ParallelConfig
    job: Job
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReadBack:
    """What an emitted file says: the configuration, the global batch (sequences per step),
    the sequence length (tokens) and the number of GPUs, where the file states them."""

    config: ParallelConfig
    global_batch_size: int
    seq_len: int | None = None
    num_gpus: int | None = None


@dataclass(frozen=True, kw_only=True)
class Target:
    """One emit target: the file name its trainer expects, how a configuration is lowered to
    what the trainer runs, how the file is rendered, and how it is read back."""

    name: str
    filename: str
    lower: Callable[[Any, Job, ParallelConfig], Lowered]
    render: Callable[..., str]
    read: Callable[[str, ModelSpec], ReadBack]


class Changes:
    """Accumulates the field changes and the warning for each, while lowering."""

    def __init__(self, cfg: ParallelConfig, job: Job) -> None:
        self.cfg, self.job = cfg, job
        self.warnings: list[str] = []

    def set(self, why: str, **fields: Any) -> None:
        """Replace configuration fields and record why."""
        self.cfg = dataclasses.replace(self.cfg, **fields)
        self.warnings.append(why)

    def set_job(self, why: str, **fields: Any) -> None:
        """Replace job fields and record why."""
        self.job = dataclasses.replace(self.job, **fields)
        self.warnings.append(why)

    def result(self) -> Lowered:
        return Lowered(config=self.cfg, job=self.job, warnings=tuple(self.warnings))


def to_framework(cfg: ParallelConfig, job: Job, name: str, trainer: str) -> Changes:
    """Map ``cfg`` onto what trainer ``name`` runs, by the capabilities the search itself uses
    (``costmodel.frameworks``): a ZeRO stage it lacks becomes the next stage up that it has
    (less memory, more communication) or else the next one down, an unsupported pipeline
    schedule becomes 1F1B, an unsupported offload the nearest it has, and hybrid sharding is
    dropped where the stage cannot shard over part of dp."""
    fw = framework(name)
    ch = Changes(cfg, dataclasses.replace(job, framework=name))
    stages = fw.zero_with_pp if cfg.pp > 1 else fw.zero_stages
    if cfg.zero_stage not in stages:
        up = [z for z in stages if z > cfg.zero_stage]
        z = min(up) if up else max(z for z in stages if z < cfg.zero_stage)
        ch.set(f"{trainer} has no ZeRO-{cfg.zero_stage}"
               f"{' with pipeline parallelism' if cfg.pp > 1 else ''}: emitted ZeRO-{z} "
               f"({fw.note_zero})", zero_stage=z,
               sharding_group=ch.cfg.sharding_group if z in fw.hybrid_shard_stages else None)
    if ch.cfg.pipeline_schedule == "combined-1f1b" and "combined-1f1b" not in fw.schedules:
        keep = "interleaved-1f1b" if ch.cfg.virtual_pipeline_stages > 1 else "1f1b"
        ch.set(f"{trainer} has no combined 1F1B (Megatron-LM's expert all-to-all overlap, "
               f"--overlap-moe-expert-parallel-comm): emitted {keep} with the same chunks, "
               f"its all-to-alls exposed", pipeline_schedule=keep)
    if ch.cfg.pipeline_schedule == "dualpipe" and "dualpipev" in fw.schedules:
        eq = dualpipe_costing(ch.cfg)
        ch.set(f"{trainer} has no DualPipe: emitted its cut-in-half DualPipeV over pp={eq.pp} "
               f"ranks and dp={eq.dp}, which runs the same ops on the same GPUs (DualPipe's "
               f"step, bubble and memory per GPU)", pp=eq.pp, dp=eq.dp,
               pipeline_schedule="dualpipev", virtual_pipeline_stages=2)
    if ch.cfg.pipeline_schedule not in fw.schedules:
        ch.set(f"{trainer} has no {ch.cfg.pipeline_schedule} pipeline schedule: emitted 1F1B "
               f"(same bubble as GPipe with fewer micro-batches in flight)",
               pipeline_schedule="1f1b", virtual_pipeline_stages=1)
    offloads = dict(fw.offloads)
    if ch.cfg.offload not in offloads or ch.cfg.zero_stage < offloads[ch.cfg.offload]:
        options = [o for o, z in fw.offloads if z <= ch.cfg.zero_stage and o != "none"]
        new = options[-1] if options else "none"
        ch.set(f"{trainer} cannot offload {ch.cfg.offload!r} at ZeRO-{ch.cfg.zero_stage}: "
               f"emitted offload {new!r}", offload=new)
    if ch.cfg.sharding_group not in (None, ch.cfg.dp) and (
            ch.cfg.zero_stage not in fw.hybrid_shard_stages):
        ch.set(f"{trainer} cannot shard ZeRO-{ch.cfg.zero_stage} over part of the "
               f"data-parallel ranks: emitted sharding over all {ch.cfg.dp}",
               sharding_group=None)
    _loss_changes(ch, fw, job, trainer)
    if job.attention_kernel is not None and not fw.selects_attention_kernel:
        ch.set_job(f"{trainer}'s file leaves the fused attention kernel to the model code and "
                   f"PyTorch's SDPA, not the {job.attention_kernel} kernel the plan assumed: "
                   "re-estimated with the trainer's own", attention_kernel=None)
    if not fw.runs_expert_tp(cfg.tp, cfg.expert_tp):
        raise SpecError(f"{trainer} cannot run the plan's folded expert mesh (etp={cfg.etp} "
                        f"under tp={cfg.tp}, Megatron-Core's MoE parallel folding): emit "
                        "megatron, or plan with etp unset")
    if job.moe_dispatcher not in fw.moe_dispatchers:
        ch.set_job(f"{trainer}'s file dispatches a MoE layer's tokens with its own all-to-all, "
                   f"not the {job.moe_dispatcher} dispatcher the plan assumed: re-estimated "
                   "with it", moe_dispatcher="alltoall")
    if job.precision in FP4_PRECISIONS and fw.name != "megatron":
        fp4 = job.precision.upper()
        ch.set_job(f"the plan's {fp4} is Transformer Engine's recipe (Megatron-LM); {trainer}'s "
                   f"own {fp4} linears are not modelled: emitted MXFP8 and re-estimated with it",
                   precision="fp8", float8_recipe="mxfp8")
    if job.precision == "fp8" and job.float8_recipe == "blockwise" and fw.name != "megatron":
        ch.set_job(f"{trainer} has no block-wise float8 recipe (Transformer Engine's): emitted "
                   "torchao's tensor-wise one and re-estimated with it",
                   float8_recipe="tensorwise")
    low = job.low_precision_states
    if low and fw.name != "megatron":
        ch.set_job(f"{trainer} keeps fp32 optimizer states and master weights, not the plan's "
                   f"{', '.join(f'{k}={v}' for k, v in low.items())} (Megatron-LM's "
                   "precision-aware optimizer): re-estimated with fp32",
                   optimizer_state_dtype="fp32", master_weights_dtype="fp32")
    if job.activation_func_fp8_input_store:
        ch.set_job(f"{trainer}'s file cannot keep a SwiGLU's input in fp8: Megatron-Core's "
                   "activation_func_fp8_input_store is a TransformerConfig field with no "
                   "pretrain_gpt.py flag (Megatron-Bridge sets model."
                   "activation_func_fp8_input_store): emitted without it and re-estimated",
                   activation_func_fp8_input_store=False)
    own_grads = megatron_grad_bytes(dataclasses.replace(job, grad_reduce_in_fp32=None))
    if fw.name == "megatron" and megatron_grad_bytes(job) != own_grads:
        ch.set_job(f"{trainer} keeps {'fp32' if own_grads == 4 else '16-bit'} main gradients "
                   f"with {job.precision} (megatron/training/arguments.py), not the plan's: "
                   "re-estimated with them", grad_reduce_in_fp32=None)
    return ch


def _loss_changes(ch: Changes, fw: Framework, job: Job, trainer: str) -> None:
    """The loss the trainer's file runs where the plan assumed another: its own cross
    entropy (fused or not, compiled or not) on an fp32 copy of the logits."""
    if job.fused_cross_entropy is not None and job.fused_cross_entropy != fw.fused_cross_entropy \
            and not fw.cross_entropy_fusion_opt_in:  # Megatron-LM's file writes the switch
        ch.set_job(f"{trainer}'s file runs its own cross entropy "
                   f"({'fused' if fw.fused_cross_entropy else 'torch F.cross_entropy'}), not "
                   f"the {'fused' if job.fused_cross_entropy else 'unfused'} one the plan "
                   "assumed: re-estimated with it", fused_cross_entropy=None)
    if not job.loss_upcast:
        ch.set_job(f"{trainer}'s file casts the logits to fp32 for its cross entropy, not the "
                   "16-bit loss the plan assumed: re-estimated with it", loss_upcast=True)
    own_loss = loss_kind(fw, dataclasses.replace(job, compile_loss=None))
    if job.compile_loss is not None and loss_kind(fw, job) != own_loss:
        ch.set_job(f"{trainer}'s file runs its loss "
                   f"{'compiled with the model' if own_loss == 'compiled' else own_loss}, not "
                   "as the plan assumed: re-estimated with it", compile_loss=None)


def chunk_layers(model: ModelSpec | LayerCosts, cfg: ParallelConfig) -> int:
    """Transformer layers per pipeline chunk (stage, or virtual stage when interleaved);
    for explicit ``stage_layers``, the largest stage."""
    if cfg.stage_layers:
        return max(cfg.stage_layers)
    return model.num_layers // (cfg.pp * cfg.virtual_pipeline_stages)


def uniform_stage_recompute(ch: Changes, trainer: str) -> None:
    """A trainer with one recompute setting for every stage: per-stage recompute counts
    become the largest of them (each stage then recomputes at least what the plan asked)."""
    rec = ch.cfg.stage_recompute_layers
    if rec is None:
        return
    n = max(rec)
    if len(set(rec)) > 1:
        ch.warnings.append(f"{trainer} recomputes the same number of layers on every stage: "
                           f"emitted {n} (the plan recomputes {list(rec)} by stage)")
    layers = ch.cfg.stage_layers or ()
    full = bool(layers) and all(n >= s for s in layers)
    ch.cfg = dataclasses.replace(ch.cfg, stage_recompute_layers=None,
                                 recompute_num_layers=None if full else n)


def header_lines(plan: Planned, config: ParallelConfig, job: Job, est: Estimate, command: str,
                 warnings: tuple[str, ...]) -> list[str]:
    """The header every emitted file starts with (without comment markers)."""

    c = plan.cluster
    lines = [
        f"Generated by autoparallel-planner {__version__}: {plan.model.name} on "
        f"{c.num_gpus} x {c.gpu.name} ({c.num_nodes} node(s) of {c.gpus_per_node} GPUs"
        + (f", {c.scale_up} per NVLink domain" if c.scale_up > c.gpus_per_node else "") + "), "
        f"global batch {job.global_batch_size} x {job.seq_len} {job.unit}, {job.precision}",
        f"configuration: {describe(config)} ({job.framework})",
        f"predicted: step {est.step_time_s or 0:.3f} s, {est.tokens_per_s or 0:,.0f} {job.unit}/s, "
        f"MFU {100 * (est.mfu or 0):.1f}%, peak memory {est.peak_memory_bytes / GIB:.1f} of "
        f"{est.memory_capacity_bytes / GIB:.1f} GiB per GPU",
        f"command: {command}",
    ]
    if getattr(plan.model, "is_moe", False):
        lines.append(f"routing: {routing_words(job)}")
        if job.moe_dispatcher == "deepep":
            lines.append(deepep_note(c.gpu.amd))
    fit = hardware_profiles.fit_note(c.gpu.name)
    if fit:
        lines.append(f"fit: {fit}")
    lines += [f"WARNING: {w}" for w in warnings]
    return lines


def deepep_note(amd: bool) -> str:
    """Where the ``deep_ep`` module that a DeepEP dispatch imports (Megatron-LM's
    ``--moe-enable-deepep``, torchtitan's ``expert_parallel_comm_backend = "deepep"``) comes
    from: deepseek-ai/DeepEP builds for CUDA only (over NVSHMEM); on an AMD GPU, ROCm/DeepEP
    (over rocSHMEM) installs the same Python API, and its README says its AMD path "focuses
    on correctness and baseline overlap" without some of the CUDA kernels' optimizations."""
    if amd:
        return ("DeepEP on ROCm: build ROCm/DeepEP (setup.py --variant rocm, over rocSHMEM), "
                "which installs the deep_ep module the trainer imports; deepseek-ai/DeepEP "
                "builds for CUDA only. Its AMD kernels lack some of the CUDA ones' "
                "optimizations (its README), so the dispatch may run slower than estimated")
    return ("DeepEP: build deepseek-ai/DeepEP (over NVSHMEM for its inter-node kernels) into "
            "this environment: the trainer imports its deep_ep module")


def commented(lines: list[str], marker: str = "#") -> str:
    """``lines`` as comment lines, each one line whatever it holds: a newline, NUL or other
    control character in a name or path is written as its escape (``printable``), so no
    text can leave the comment and run as a command (shell) or key (TOML)."""
    return "\n".join(f"{marker} {printable(line)}" if line else marker for line in lines)


def micro_batches(job: Job, cfg: ParallelConfig) -> int:
    """Micro-batches per step per data-parallel rank: ``B / (dp * mbs)``."""
    return job.global_batch_size // (cfg.dp * cfg.micro_batch_size)
