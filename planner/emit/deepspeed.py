"""DeepSpeed ``ds_config.json`` (DeepSpeed 0.19).

Keys follow the DeepSpeed configuration reference (https://www.deepspeed.ai/docs/config-json/)
and ``deepspeed/runtime/config.py``: ``train_batch_size`` must equal
``train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size``;
``zero_optimization.stage`` 0-3 with ``offload_optimizer`` (stage >= 1) and ``offload_param``
(stage 3); ``tensor_parallel.autotp_size`` is DeepSpeed's AutoTP training (no sequence
parallel); ``pipeline`` configures ``PipelineModule``'s engine, which runs 1F1B with ZeRO 0 or 1
and partitions layers by its own method (``uniform`` here), and checkpoints every
``activation_checkpoint_interval`` layers; ``sequence_parallel_size`` is DeepSpeed-Ulysses
(all-to-all sequence parallel). DeepSpeed 0.19 removed MiCS (hybrid ZeRO-3 sharding;
deepspeedai/DeepSpeed issue 8489). The file is plain JSON; the header and the launcher line
are the ``_comment`` list, which DeepSpeed ignores.
"""

from __future__ import annotations

import json
import re
from typing import Any

from costmodel.config import Job, ParallelConfig
from costmodel.formulas.estimate import Estimate
from costmodel.model import ModelSpec
from hardware_profiles.files import printable
from planner.emit.common import (
    Lowered,
    ReadBack,
    Target,
    header_lines,
    micro_batches,
    to_framework,
    uniform_stage_recompute,
)

#: Communication bucket sizes (elements): DeepSpeed's documented defaults (5e8 for the ZeRO
#: reduce / all-gather buckets, 5e7 for the ZeRO-3 prefetch bucket, 1e5 for the ZeRO-3
#: persistence threshold; https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training).
REDUCE_BUCKET = 500_000_000
PREFETCH_BUCKET = 50_000_000
PERSISTENCE_THRESHOLD = 100_000


def lower(model: ModelSpec, job: Job, cfg: ParallelConfig) -> Lowered:
    """``cfg`` as DeepSpeed runs it (see the module docstring)."""
    ch = to_framework(cfg, job, "deepspeed", "DeepSpeed")
    # Per-stage recompute counts first: they need the plan's stage split, dropped next.
    uniform_stage_recompute(ch, "DeepSpeed")
    if ch.cfg.stage_layers:
        ch.set(f"DeepSpeed's PipelineModule partitions layers by a method, not by explicit "
               f"counts: emitted the uniform split (the plan's stages hold "
               f"{list(ch.cfg.stage_layers)} layers)", stage_layers=None)
    if ch.cfg.sequence_parallel:
        ch.set("DeepSpeed AutoTP has no sequence parallelism: emitted tensor parallelism "
               "without it", sequence_parallel=False)
    if ch.cfg.recompute == "selective":
        ch.set("DeepSpeed checkpoints whole layers, not the attention core: emitted full "
               "recompute", recompute="full", recompute_num_layers=None)
    elif ch.cfg.recompute_num_layers is not None:
        ch.set(f"DeepSpeed checkpoints every layer or none: emitted full recompute of every "
               f"layer (the plan recomputes {ch.cfg.recompute_num_layers} per chunk)",
               recompute_num_layers=None)
    if ch.cfg.cp > 1:
        ch.warnings.append(f"DeepSpeed splits the sequence with Ulysses all-to-all "
                           f"(sequence_parallel_size={ch.cfg.cp}), not the ring exchange the "
                           f"estimate models; the model must use DistributedAttention")
    return ch.result()


def config_dict(job: Job, cfg: ParallelConfig) -> dict[str, Any]:
    """The ds_config as a dict (without ``_comment``)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage, "overlap_comm": job.overlap_grad_reduce,
                            "contiguous_gradients": True, "reduce_bucket_size": REDUCE_BUCKET}
    if cfg.zero_stage in (1, 2):
        zero["allgather_bucket_size"] = REDUCE_BUCKET
    if cfg.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = PREFETCH_BUCKET
        zero["stage3_param_persistence_threshold"] = PERSISTENCE_THRESHOLD
    if cfg.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cfg.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    out: dict[str, Any] = {
        "train_batch_size": job.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": micro_batches(job, cfg),
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if job.precision == "bf16" or job.precision == "fp8":
        out["bf16"] = {"enabled": True}
    elif job.precision == "fp16":
        out["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if cfg.tp > 1:
        out["tensor_parallel"] = {"autotp_size": cfg.tp}
    if cfg.cp > 1:
        out["sequence_parallel_size"] = cfg.cp
    out["pipeline"] = {"stages": cfg.pp, "partition": "uniform",
                       "activation_checkpoint_interval": int(cfg.recompute == "full")}
    out["activation_checkpointing"] = {"partition_activations": cfg.tp > 1,
                                       "contiguous_memory_optimization": False,
                                       "cpu_checkpointing": False}
    return out


def launcher(plan: Any, cfg: ParallelConfig) -> list[str]:
    """How the training script is started and what it must build."""
    c = plan.cluster
    lines = [f"launch: deepspeed --num_nodes {c.num_nodes} --num_gpus {c.gpus_per_node} "
             f"--hostfile hostfile train.py --deepspeed --deepspeed_config ds_config.json"]
    if cfg.pp > 1:
        lines.append(f"the script builds PipelineModule(layers, num_stages={cfg.pp}, "
                     f"partition_method='uniform', activation_checkpoint_interval="
                     f"{int(cfg.recompute == 'full')})")
    elif cfg.recompute == "full":
        lines.append("the script wraps each transformer layer in "
                     "deepspeed.checkpointing.checkpoint")
    if cfg.ep > 1:
        lines.append(f"the script builds its expert layers as deepspeed.moe.layer.MoE("
                     f"ep_size={cfg.ep})")
    return lines


def render(*, plan: Any, config: ParallelConfig, job: Job, estimate: Estimate, command: str,
           warnings: tuple[str, ...]) -> str:
    """The JSON text."""
    head = header_lines(plan, config, job, estimate, command, warnings)
    body = {"_comment": [printable(line) for line in head + launcher(plan, config)]}
    body.update(config_dict(job, config))
    return json.dumps(body, indent=2) + "\n"


def read(text: str, model: ModelSpec) -> ReadBack:
    """The configuration a ds_config written by ``render`` describes."""
    d = json.loads(text)
    notes = "\n".join(d.get("_comment", []))
    ep = re.search(r"ep_size=(\d+)", notes)
    run = re.search(r"--num_nodes (\d+) --num_gpus (\d+)", notes)
    zero = d["zero_optimization"]
    mbs, gas = d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"]
    tp = d.get("tensor_parallel", {}).get("autotp_size", 1)
    pipe = d.get("pipeline", {})
    offload = ("optimizer+params" if "offload_param" in zero
               else "optimizer" if "offload_optimizer" in zero else "none")
    cfg = ParallelConfig(
        dp=d["train_batch_size"] // (mbs * gas), tp=tp, pp=pipe.get("stages", 1),
        cp=d.get("sequence_parallel_size", 1), ep=int(ep.group(1)) if ep else 1,
        zero_stage=zero["stage"],
        micro_batch_size=mbs, offload=offload,
        recompute="full" if pipe.get("activation_checkpoint_interval") else "none")
    return ReadBack(config=cfg, global_batch_size=d["train_batch_size"],
                    num_gpus=int(run.group(1)) * int(run.group(2)) if run else None)


TARGET = Target(name="deepspeed", filename="ds_config.json", lower=lower, render=render,
                read=read)
