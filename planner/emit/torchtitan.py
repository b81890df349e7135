"""torchtitan job-config TOML (torchtitan 0.2.x, ``--job.config_file``).

Field names and meanings follow ``torchtitan/config/job_config.py`` of torchtitan 0.2.2 (PyPI):
``[parallelism]`` data_parallel_replicate_degree x data_parallel_shard_degree is the
data-parallel degree (HSDP when both exceed 1), ``fsdp_reshard_after_forward`` "always" is
ZeRO-3 and "never" keeps the gathered parameters until backward (ZeRO-2); the pipeline split is
written out as ``module_fqns_per_model_part`` (one list of module names per stage, or per
virtual stage for looped schedules) so that the stages hold exactly the layers the plan
estimated: torchtitan's default split would count the embedding and the output as one layer
each. ``[training]`` local_batch_size is the batch per data-parallel rank per gradient
accumulation step; with pipeline parallelism the pipeline splits it into micro-batches of
``pipeline_parallel_microbatch_size`` (torchtitan/distributed/pipeline_parallel.py), so the
plan's micro-batches all run in one step. ``[activation_checkpoint]`` "selective" with option
"op" is per-op selective recompute; with a digit k it checkpoints every k-th block
(torchtitan/distributed/activation_checkpoint.py). Schedules are the names of
``torch.distributed.pipelining.schedules.get_schedule_class``; torch runs zero bubble as the
V-shaped ``ZBVZeroBubble`` with two stages per rank, and DeepSeek's ``DualPipeV`` likewise
(``costmodel.formulas.vschedules``); their parts are torchtitan's own V split.
"""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

from costmodel.config import V_SCHEDULES, Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.arrays import even_split
from costmodel.formulas.eager import float8_gathered_rows
from costmodel.formulas.estimate import Estimate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.vschedules import v_split
from costmodel.model import ModelSpec
from hardware_profiles.files import to_toml
from planner.emit.common import (
    Lowered,
    ReadBack,
    Target,
    chunk_layers,
    commented,
    header_lines,
    to_framework,
    uniform_stage_recompute,
)

#: Our model presets that are torchtitan 0.2.2 built-in flavors, with the shape a model must
#: have to use one (num_layers, hidden_size, num_heads, num_kv_heads);
#: torchtitan/models/llama3/__init__.py and torchtitan/models/qwen3/__init__.py.
FLAVORS: dict[str, tuple[str, str, tuple[int, int, int, int]]] = {
    "llama-3-8b": ("llama3", "8B", (32, 4096, 32, 8)),
    "llama-3-70b": ("llama3", "70B", (80, 8192, 64, 8)),
    "llama-3-405b": ("llama3", "405B", (126, 16384, 128, 8)),
    # torchtitan/models/qwen3/__init__.py (qk_norm=True, head_dim 128).
    "qwen3-32b": ("qwen3", "32B", (64, 5120, 64, 8)),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", (48, 2048, 32, 4)),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B", (94, 4096, 64, 4)),
    # torchtitan/models/deepseek_v3/__init__.py: 671B (no multi-token prediction).
    "deepseek-v3": ("deepseek_v3", "671B", (61, 7168, 128, 128)),
}


def family(model: ModelSpec) -> tuple[str, str]:
    """torchtitan's (model name, model-args class) for a preset's architecture: DeepSeek-V3
    for multi-head latent attention, Qwen3 for query and key norms, else Llama 3."""
    if model.is_mla:
        return "deepseek_v3", "DeepSeekV3ModelArgs"
    if model.qk_norm:
        return "qwen3", "Qwen3ModelArgs"
    return "llama3", "TransformerModelArgs"
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B",
             "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
RESHARD = {0: "default", 2: "never", 3: "always"}
#: torchtitan's model converter for float8 linears: torchao's float8 recipes, or its MX ones.
_QUANTIZE = {False: "quantize.linear.float8", True: "quantize.linear.mx"}


def flavor(model: ModelSpec) -> tuple[str, str] | None:
    """torchtitan's (model name, flavor) for ``model``, when it is a built-in flavor by name
    and by shape; None otherwise."""
    name, flv, shape = FLAVORS.get(model.name, ("", "", ()))
    own = (model.num_layers, model.hidden_size, model.num_heads, model.num_kv_heads)
    return (name, flv) if shape == own else None


def lower(model: ModelSpec | LayerCosts, job: Job, cfg: ParallelConfig) -> Lowered:
    """``cfg`` as torchtitan 0.2 runs it (see the module docstring). A traced module's plan
    (its ``LayerCosts``) is trained by the user's own train spec, whose parallelize function
    applies the plan's TP layouts as they are (``render`` writes them)."""
    builtin = isinstance(model, ModelSpec)
    if isinstance(model, ModelSpec) and (not model.causal or model.patch_size):
        raise SpecError(f"torchtitan trains decoder-only language models; {model.name} is "
                        f"not one: emit it for deepspeed instead")
    ch = to_framework(cfg, job, "torchtitan", "torchtitan")
    if builtin and ch.cfg.tp > 1 and not ch.cfg.sequence_parallel:
        ch.set("torchtitan 0.2 always shards norms and dropout over the sequence with tensor "
               "parallelism: emitted sequence parallel", sequence_parallel=True)
    if ch.cfg.pipeline_schedule == "zero-bubble":
        # torchtitan/distributed/pipeline_parallel.py (0.2.2) refuses a multi-stage schedule
        # with one stage per rank, which ZB-H1 as estimated (and as 'planner run' runs it,
        # torch's ScheduleInterleavedZeroBubble) is; it runs zero bubble as the V-shaped
        # ZBVZeroBubble, which the estimate times as ``zbv``.
        if ch.cfg.stage_layers:
            ch.set("torchtitan 0.2.2 runs zero bubble only with 2 stages per rank (the V "
                   "schedule), which these uneven one-stage-per-rank layers are not: emitted "
                   "1F1B", pipeline_schedule="1f1b")
        else:
            ch.set("torchtitan 0.2.2 runs zero bubble only with 2 stages per rank: emitted the "
                   "V-shaped ZBVZeroBubble (zbv)", pipeline_schedule="zbv",
                   virtual_pipeline_stages=2)
    if isinstance(model, ModelSpec) and (model.sliding_window or model.attention_sinks
                                         or model.post_norms):
        ch.warnings.append(
            f"torchtitan 0.2.2's built-in models have no local attention windows, attention "
            f"sinks or post-norms: {model.name} needs a train spec of your own (the file "
            f"names it as [model])")
    if builtin and isinstance(model, ModelSpec) and model.mtp_layers:
        ch.warnings.append(
            f"torchtitan 0.2.2's deepseek_v3 has no multi-token prediction: the file trains "
            f"{model.name} without its {model.mtp_layers} MTP module(s), which the estimate "
            f"counts (a little slower and fuller than the run)")
    uniform_stage_recompute(ch, "torchtitan")
    if ch.job.distribute_saved_activations and ch.cfg.recompute == "full" and ch.cfg.tp > 1:
        ch.set_job("torchtitan keeps each recomputed layer's whole input on every TP rank (no "
                   "distributed saved activations): emitted so", distribute_saved_activations=False)
    n = ch.cfg.recompute_num_layers
    if n is not None:
        c = chunk_layers(model, ch.cfg)
        k = max(1, c // n)
        if c % n:
            ch.set(f"torchtitan recomputes every k-th block: {n} of {c} layers per chunk is "
                   f"not a whole period, emitted every {k}-th ({c // k} layers per chunk)",
                   recompute_num_layers=None if k == 1 else c // k)
    if job.precision == "fp16":
        ch.set_job("torchtitan trains in bf16 or fp32, not fp16: emitted bf16",
                   precision="bf16")
    if job.optimizer not in ("adamw", "adam"):
        ch.set_job(f"torchtitan's optimizers are Adam and AdamW, not {job.optimizer}: "
                   f"emitted AdamW", optimizer="adamw")
    _lower_moe(model, ch)
    if job.tp_comm_overlap and ch.cfg.tp > 1 and not job.compile:
        # torchtitan refuses async TP without torch.compile (its micro-pipelined collectives
        # are a compiler pass), so the file compiles the model, which the estimate then times.
        ch.set_job("torchtitan's async TP needs torch.compile: emitted with compile on",
                   compile=True)
    return ch.result()


def _lower_moe(model: ModelSpec | LayerCosts, ch: Any) -> None:
    """DeepEP as torchtitan 0.2.2 runs it ([parallelism] expert_parallel_comm_backend
    "deepep"): its DeepSeek-V3 and Llama 4 parallelize functions refuse it without expert
    parallelism or with the experts split over TP ("DeepEP with Expert Tensor Parallelism
    (ETP) is not supported yet"); there the file runs its all-to-all."""
    if not model.is_moe or ch.job.moe_dispatcher != "deepep":
        return
    if ch.cfg.ep == 1 or ch.cfg.expert_tp > 1:
        why = "without expert parallelism (ep=1)" if ch.cfg.ep == 1 else \
            f"with the experts split over tensor parallel (etp={ch.cfg.expert_tp})"
        ch.set_job(f"torchtitan 0.2.2 runs DeepEP only with expert parallelism and unsplit "
                   f"experts, not {why}: emitted its all-to-all", moe_dispatcher="alltoall")


def _parts(model: ModelSpec | LayerCosts, cfg: ParallelConfig) -> list[list[str]]:
    """Module names per pipeline model part, in model order (a traced module's: its layers'
    paths, the input side's modules first and the output side's last)."""
    if cfg.stage_layers:
        sizes = list(cfg.stage_layers)
    elif cfg.pipeline_schedule in V_SCHEDULES:
        sizes = list(v_split(model.num_layers, cfg.pp))  # torchtitan's own V split
    else:
        # The cost model's even split: the remainder to the last parts (ConfigArrays.
        # uniform_stages).
        sizes = even_split(model.num_layers, cfg.pp * cfg.virtual_pipeline_stages)
    if isinstance(model, LayerCosts):
        names = model.layer_names()
        emb, head = model.edges()
        first = [m for m in (emb.members if emb else ()) if not m.startswith("(")]
        last = [m for m in (head.members if head else ()) if not m.startswith("(")]
    else:
        names = [f"layers.{j}" for j in range(model.num_layers)]
        first, last = ["tok_embeddings"], ["norm", "output"]
    parts, start = [], 0
    for i, n in enumerate(sizes):
        part = names[start:start + n]
        start += n
        if i == 0:
            part = first + part
        if i == len(sizes) - 1:
            part += last
        parts.append(part)
    return parts


def _float8_filter(model: ModelSpec | LayerCosts) -> list[str]:
    """The module FQNs torchtitan's float8 converter is told to leave in bf16: a preset's
    ``output`` layer and its MoE routers' gates (torchtitan's names), a traced module's
    output-side layers (its head)."""
    if isinstance(model, ModelSpec):
        return ["output", "router.gate"] if model.is_moe else ["output"]
    return [m for b in model.blocks if b.kind == "head" for m in b.members]


def sections(model: ModelSpec | LayerCosts, job: Job, cfg: ParallelConfig
             ) -> dict[str, dict[str, Any]]:
    """The job config as TOML tables (a traced module's ``[model]`` names it: register a
    train spec of that name)."""
    name, flv = ((flavor(model) or (family(model)[0], model.name))
                 if isinstance(model, ModelSpec) else (model.name, model.name))
    shard = (cfg.sharding_group or cfg.dp) if cfg.zero_stage else 1
    mdl: dict[str, Any] = {"name": name, "flavor": flv}
    if job.precision == "fp8":
        mdl["converters"] = [_QUANTIZE[job.float8_recipe == "mxfp8"]]
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": cfg.dp // shard,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": RESHARD[cfg.zero_stage],
        "tensor_parallel_degree": cfg.tp,
        "pipeline_parallel_degree": cfg.pp,
        "context_parallel_degree": cfg.cp,
        "expert_parallel_degree": cfg.ep,
    }
    if model.is_moe:
        # torchtitan 0.2.2 splits the experts over TP only when told to (its
        # expert_tensor_parallel_degree defaults to 1: "partial dp + all tp -> ep"); the
        # estimate's experts split as the plan's etp (tp unless folded).
        par["expert_tensor_parallel_degree"] = cfg.expert_tp
        if job.moe_dispatcher == "deepep":
            par["expert_parallel_comm_backend"] = "deepep"
        if cfg.pipeline_schedule == "dualpipev" and cfg.pp > 1 and cfg.ep > 1:
            # torchtitan 0.2.2 overlaps one micro-batch's expert dispatch and combine with
            # another's compute in DualPipeV (pipeline_parallel_expert_parallel_overlap, on by
            # default) and refuses that with activation checkpointing
            # (torchtitan/distributed/dual_pipe_v.py, get_dual_pipe_v_flag).
            par["pipeline_parallel_expert_parallel_overlap"] = cfg.recompute == "none"
    if cfg.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[str(cfg.pipeline_schedule)]
        par["pipeline_parallel_microbatch_size"] = cfg.micro_batch_size
        par["module_fqns_per_model_part"] = _parts(model, cfg)
    ac: dict[str, Any] = {"mode": cfg.recompute}
    if cfg.recompute == "selective":
        ac["selective_ac_option"] = "op"
    elif cfg.recompute_num_layers is not None:
        ac = {"mode": "selective",
              "selective_ac_option": str(chunk_layers(model, cfg) // cfg.recompute_num_layers)}
    out = {
        "job": {"description": f"{model.name}: plan by autoparallel-planner"},
        "model": mdl,
        "optimizer": {"name": "AdamW" if job.optimizer == "adamw" else "Adam"},
        "training": {
            "local_batch_size": (job.global_batch_size // cfg.dp if cfg.pp > 1
                                 else cfg.micro_batch_size),
            "global_batch_size": job.global_batch_size,
            "seq_len": job.seq_len,
            "mixed_precision_param": "float32" if job.precision == "fp32" else "bfloat16",
            "mixed_precision_reduce": "float32",
            "enable_cpu_offload": cfg.offload == "optimizer+params",
        },
        "parallelism": par,
        "activation_checkpoint": ac,
    }
    if job.precision == "fp8":
        # torchao's dynamic scaling recipe the job names (Job.float8_recipe), whose casts
        # the cost model times (costmodel.formulas.eager.float8_cast_time); the output layer
        # (and a MoE router) kept in bf16 as the cost model keeps them
        # (headcompute.lm_head_compute): torchtitan converts every linear whose FQN contains
        # none of filter_fqns.
        if job.float8_recipe == "mxfp8":
            # torchao's MX training (torchtitan JobConfig quantize.linear.mx: recipe
            # mxfp8_cublas, the cuBLAS block-scaled matmul).
            out["quantize.linear.mx"] = {"recipe_name": "mxfp8_cublas",
                                         "filter_fqns": _float8_filter(model)}
        else:
            out["quantize.linear.float8"] = {"recipe_name": job.float8_recipe,
                                             "filter_fqns": _float8_filter(model)}
        if float8_gathered_rows(job.framework, job, cfg.zero_stage):
            # FSDP gathers the float8 weights the cost model counts at 1 byte
            # (costmodel.formulas.eager.float8_param_gather), with one amax all-reduce for all.
            out["quantize.linear.float8"].update(enable_fsdp_float8_all_gather=True,
                                                  precompute_float8_dynamic_scale_for_fsdp=True)
    if job.compile:
        # torch.compile of the blocks and the loss (Job.compile; lower turns it on for async TP).
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
    if job.tp_comm_overlap and cfg.tp > 1:
        par["enable_async_tensor_parallel"] = True
    return out


def render(*, plan: Any, config: ParallelConfig, job: Job, estimate: Estimate, command: str,
           warnings: tuple[str, ...]) -> str:
    """The TOML text."""
    head = header_lines(plan, config, job, estimate, command, warnings)
    c = plan.cluster
    head.append(f"run: torchrun --nproc-per-node {c.gpus_per_node} --nnodes {c.num_nodes} "
                '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" -m torchtitan.train '
                "--job.config_file torchtitan.toml (or the slurm target)")
    if isinstance(plan.model, LayerCosts):
        head += _module_notes(plan, config)
    elif flavor(plan.model) is None:
        m = plan.model
        # A model with query and key norms is torchtitan's Qwen3 (Qwen3ModelArgs qk_norm).
        fam, args = family(m)
        extra = f", head_dim={m.head_dim}, qk_norm=True" if m.qk_norm else ""
        if m.is_mla:
            extra = (f", q_lora_rank={m.q_lora_rank}, kv_lora_rank={m.kv_lora_rank}, "
                     f"qk_nope_head_dim={int(m.head_dim or 0) - m.qk_rope_head_dim}, "
                     f"qk_rope_head_dim={m.qk_rope_head_dim}, v_head_dim={m.v_head_dim}")
        head.append(f"{m.name} is not a torchtitan built-in flavor: register flavor "
                    f"{m.name!r} for model {fam!r} ({args} dim={m.hidden_size}, "
                    f"n_layers={m.num_layers}, n_heads={m.num_heads}, n_kv_heads="
                    f"{m.num_kv_heads}, vocab_size={m.vocab_size}, ffn hidden "
                    f"{m.ffn_hidden_size}{extra}) or set [model] to your own train spec")
    return commented(head) + "\n\n" + to_toml(_nested(sections(plan.model, job, config)))


def _module_notes(plan: Any, config: ParallelConfig) -> list[str]:
    """Header lines of a traced module's file: the train spec it needs, and the
    tensor-parallel plan the ILP chose, as DTensor styles by module path, for its
    parallelize function."""
    costs: LayerCosts = plan.model
    source = f" ({plan.module.model})" if plan.module is not None else ""
    out = [f"{costs.name}{source} is a traced torch module: register a torchtitan train spec "
           f"named {costs.name!r} that builds it; [parallelism] holds the plan's degrees"]
    if config.tp > 1:
        try:
            styles = costs.variant(config.sequence_parallel).tp_plan(config.tp)
        except SpecError as e:
            out.append(f"tensor parallel: {e}")
        else:
            out.append("tensor-parallel plan for its parallelize function (module path -> "
                       "DTensor style; colwise/rowwise: ColwiseParallel/RowwiseParallel, "
                       "vocab: RowwiseParallel of the embedding, head: ColwiseParallel with "
                       "the logits gathered):")
            out += [f"  {path}: {style}" for path, style in sorted(styles.items())]
    return out


def _nested(tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """torchtitan's dotted table names (``quantize.linear.float8``) as nested tables, the
    form ``to_toml`` writes them from."""
    out: dict[str, Any] = {}
    for name, values in tables.items():
        t = out
        for part in name.split("."):
            t = t.setdefault(part, {})
        t.update(values)
    return out


def read(text: str, model: ModelSpec) -> ReadBack:
    """The configuration a torchtitan TOML written by ``render`` describes."""
    d = tomllib.loads(text)
    par, tr, ac = d["parallelism"], d["training"], d["activation_checkpoint"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    zero = {v: k for k, v in RESHARD.items()}[par["fsdp_reshard_after_forward"]]
    dp, pp = rep * shard, par["pipeline_parallel_degree"]
    schedule, v, stage_layers, mbs = None, 1, None, tr["local_batch_size"]
    if pp > 1:
        schedule = {t: s for s, t in SCHEDULES.items()}[par["pipeline_parallel_schedule"]]
        mbs = par["pipeline_parallel_microbatch_size"]
        sizes = [sum(m.startswith("layers.") for m in part)
                 for part in par["module_fqns_per_model_part"]]
        if schedule == "interleaved-1f1b":
            v = len(sizes) // pp
        elif schedule in V_SCHEDULES:
            v = 2
            if tuple(sizes) != v_split(model.num_layers, pp):
                stage_layers = tuple(sizes)
        elif len(set(sizes)) > 1:
            stage_layers = tuple(sizes)
    tp = par["tensor_parallel_degree"]
    # torchtitan's default expert TP is 1 (the experts over all TP ranks, unsplit).
    etp = par.get("expert_tensor_parallel_degree", 1) if model.is_moe else tp
    cfg = ParallelConfig(
        dp=dp, tp=tp, pp=pp, cp=par["context_parallel_degree"],
        ep=par["expert_parallel_degree"], etp=None if etp == tp else etp, zero_stage=zero,
        sharding_group=shard if zero and rep > 1 else None,
        sequence_parallel=tp > 1, micro_batch_size=mbs,
        pipeline_schedule=schedule, virtual_pipeline_stages=v,
        offload="optimizer+params" if tr["enable_cpu_offload"] else "none",
        stage_layers=stage_layers, recompute="none")
    option = ac.get("selective_ac_option", "")
    if ac["mode"] == "selective" and option.isdigit():
        k = int(option)
        c = chunk_layers(model, cfg)
        cfg = dataclasses.replace(cfg, recompute="full",
                                  recompute_num_layers=None if k == 1 else c // k)
    else:
        cfg = dataclasses.replace(cfg, recompute=ac["mode"])
    return ReadBack(config=cfg, global_batch_size=tr["global_batch_size"],
                    seq_len=tr["seq_len"])


TARGET = Target(name="torchtitan", filename="torchtitan.toml", lower=lower, render=render,
                read=read)
