"""What the runtime (``planner.runtime.apply``, ``planner run``) can carry out of a plan, checked
before any process starts: the features it runs, the module's size against the plan's, and
which traced module a plan names.
"""

from __future__ import annotations

import os
from typing import Any

from costmodel.config import FP4_PRECISIONS, V_SCHEDULES, Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.frameworks import pipelining_problem
from costmodel.model import ModelSpec
from costmodel.units import GIB
from planner.result import ModuleSource, Plan

#: The schedules with two stages per rank, as ``unsupported`` names them.
_TWO_STAGES = {**{s: f"the V-shaped {s} schedule (two stages per rank, the output layer on "
                     "rank 0)" for s in V_SCHEDULES},
               "dualpipe": "DeepSeek's DualPipe (two copies of the model, fed from both "
                           "ends; torchtitan runs it as DualPipeV on pp / 2 ranks)"}


_FP4 = ("{} matmuls need Transformer Engine's FP4 recipe, which planner.apply does not "
        "convert to; use precision bf16 or emit megatron")
#: The precisions ``apply`` does not run, and what to do instead.
_PRECISIONS = {
    "fp16": "fp16 needs loss scaling, which planner.apply does not do; use precision bf16 or "
            "fp32",
    "fp8": "fp8 matmuls need torchao's Float8Linear, which planner.apply does not convert to; "
           "use precision bf16 or emit torchtitan with its float8 converter",
    **{p: _FP4.format(p) for p in FP4_PRECISIONS},
}


def unsupported(model: ModelSpec | LayerCosts, job: Job, cfg: ParallelConfig,
                reference: bool = True) -> list[str]:
    """Each feature of (model, job, config) that ``apply`` cannot run, as a sentence saying
    what to do instead; empty when it runs. ``model``: a preset, or a traced module's
    ``LayerCosts``. ``reference``: the module is the project's reference transformer
    (``planner.runtime.model``), whose limits apply too."""
    out = []
    traced = isinstance(model, LayerCosts) and model.spec is None
    if isinstance(model, LayerCosts):
        if model.spec is None:
            out += _traced_unsupported(model, cfg, reference)
        else:
            model = model.spec
    if cfg.cp > 1:
        out.append(f"context parallel (cp={cfg.cp}) is not run by planner.apply (torch's "
                   "context_parallel needs CUDA attention kernels); plan with --cp 1 or emit "
                   "torchtitan, which runs it on GPUs")
    if cfg.ep > 1:
        out.append(f"expert parallel (ep={cfg.ep}) is not run by planner.apply; plan with "
                   "--ep 1 or " + ("emit torchtitan, whose train spec for the module applies "
                                   "it" if traced else "emit torchtitan or megatron, which "
                                   "run it"))
    if model.is_moe and cfg.tp > 1:
        out.append("tensor parallel of mixture-of-experts layers is not run by planner.apply "
                   "(the experts are batched weights, which no DTensor style for a linear "
                   "splits); plan with --tp 1 or emit torchtitan or megatron")
    if cfg.zero_stage == 1:
        out.append("ZeRO-1 (optimizer states sharded, gradients whole) has no torch-native "
                   "composable form; use zero_stage 2 (FSDP keeping parameters through "
                   "backward), which also shards the gradients, or emit deepspeed/megatron")
    if job.precision in _PRECISIONS:
        out.append(_PRECISIONS[job.precision])
    if cfg.offload == "optimizer":
        out.append("offloading only the optimizer states (DeepSpeed ZeRO-Offload) has no "
                   "torch-native form; use offload 'optimizer+params' (FSDP's "
                   "CPUOffloadPolicy) or emit deepspeed")
    if cfg.offload == "optimizer+params" and cfg.zero_stage < 2:
        out.append("offload 'optimizer+params' runs through FSDP's CPUOffloadPolicy and "
                   "needs zero_stage 2 or 3")
    if cfg.pipeline_schedule in _TWO_STAGES:
        out.append(f"{_TWO_STAGES[str(cfg.pipeline_schedule)]} is not run by planner.apply; "
                   "emit torchtitan, which runs it, or plan with another schedule")
    problem = pipelining_problem(str(cfg.pipeline_schedule), cfg.pp,
                                 job.global_batch_size // (cfg.dp * cfg.micro_batch_size))
    if problem:
        out.append(f"torch.distributed.pipelining's {problem}; change the micro-batch size "
                   "or the schedule")
    if job.optimizer not in ("adam", "adamw", "sgd"):
        out.append(f"optimizer {job.optimizer!r} is not in torch.optim; planner.apply builds "
                   "adam, adamw or sgd")
    if reference and isinstance(model, ModelSpec):
        out += _reference_unsupported(model, cfg)
    return out


def _reference_unsupported(model: ModelSpec, cfg: ParallelConfig) -> list[str]:
    """What the reference transformer (``planner.runtime.model``) does not build or split."""
    out = []
    if model.tied_embeddings and cfg.tp > 1 and cfg.pp == 1:
        out.append("tied input and output embeddings split over tensor-parallel ranks in "
                   "one pipeline stage are not run by the reference transformer; use "
                   "tp = 1, pp > 1 or an untied model")
    if model.position_embedding == "learned" and cfg.sequence_parallel:
        out.append("learned position embeddings with sequence parallel are not run by "
                   "the reference transformer; plan without --sequence-parallel")
    if model.sliding_window or model.attention_sinks:
        out.append("local attention windows and attention sinks are traced but not trained "
                   "by the reference transformer (its TP plan does not split the sinks and "
                   "its windowed attention is written out, not fused); emit the plan for a "
                   "trainer (planner emit --target megatron)")
    if model.is_mla and (cfg.tp > 1 or cfg.cp > 1):
        out.append("multi-head latent attention split over tensor- or context-parallel ranks "
                   "is not run by the reference transformer (its shared rotary key's "
                   "gradient would need a reduction over the ranks it does not apply); "
                   "use tp = 1 and cp = 1, or Megatron-LM (planner emit --target megatron)")
    for bad, what in ((model.patch_size > 0, "vision patch embeddings"),
                      (model.mtp_layers > 0, "multi-token prediction modules"),
                      (model.post_norms, "norms after the attention and the MLP"),
                      (model.num_token_types > 0, "token-type embeddings"),
                      (model.embedding_norm, "an embedding norm")):
        if bad:
            out.append(f"the reference transformer has no {what}; pass your own module")
    return out


def _traced_unsupported(costs: LayerCosts, cfg: ParallelConfig, reference: bool) -> list[str]:
    """What ``apply`` does not run yet of a traced module's plan."""
    out = []
    refusal = costs.tp_refusal(cfg.tp, cfg.sequence_parallel)
    if refusal:
        out.append(refusal)
    tied = any(c.shared_params for b in costs.blocks for c in b.by_tp.values())
    if reference and tied and cfg.tp > 1:
        out.append("tied input and output embeddings split over tensor-parallel ranks are "
                   "not run from a traced module's layouts (its head is the embedding's "
                   "matmul in the model's own forward); use tp = 1 or an untied model")
    return out


FORCE_ENV = "PLANNER_FORCE"  # set to 1 by 'planner run --force' for the processes it starts


def check(plan: Plan, reference: bool = True, force: bool = False) -> None:
    """Raise ``SpecError`` naming every feature of ``plan`` that ``apply`` cannot run, and
    ``Infeasible`` when its estimate does not fit the GPUs' memory (unless ``force``, or
    ``PLANNER_FORCE=1`` in the environment, as ``planner run --force`` sets it)."""
    if not isinstance(plan, Plan):
        raise SpecError(f"planner.apply takes a Plan (planner.plan(...), or "
                        f"Plan.from_json(path) for a saved one), got {type(plan).__name__}")
    if plan.is_inference:
        raise SpecError("this is a serving plan (an InferenceJob); planner.apply trains. Serve "
                        "it with 'planner emit PLAN --target vllm' (or tensorrt-llm)")
    job, cfg, est = plan.training()
    problems = unsupported(plan.model, job, cfg, reference)
    if problems:
        raise SpecError("planner.apply cannot run this plan: " + "; ".join(problems))
    if not (force or os.environ.get(FORCE_ENV) == "1") and not est.fits:
        raise Infeasible(f"the plan does not fit: {est.peak_memory_bytes / GIB:.1f} GiB "
                         f"per GPU of {est.memory_capacity_bytes / GIB:.1f} GiB; re-plan "
                         "it, or pass force=True (planner run --force) to run it anyway")


#: How far a module's parameter count may be from the plan's model's before ``apply``
#: refuses it as another model (a module may add a bias or norm the count leaves out, never
#: a fiftieth of the model).
PARAMS_TOLERANCE = 0.02


def check_size(plan: Plan, module: Any) -> None:
    """Refuse a ``module`` whose parameter count is not the plan's model's: a model of
    another width or depth than the plan was made for."""
    have = sum(int(p.numel()) for p in module.parameters())
    want = plan.model.num_params()
    if abs(have - want) > PARAMS_TOLERANCE * want:
        raise SpecError(f"the module has {have:,} parameters but the plan's model "
                        f"{plan.model.name!r} has {want:,}: it is not the model the plan was "
                        "made for (plan this module: planner.plan(module, ...))")


def traced_source(plan: Plan, model: str | None) -> tuple[str, ModuleSource]:
    """The ``module:attr`` the minimal training loop builds a traced module's plan from
    (``model``, else the one the plan records) and the traced inputs it feeds it; a
    ``SpecError`` when neither names the module (a plan of a module planned in Python), or
    when the loop cannot feed its inputs (not one tensor of a recorded shape). ``planner
    run`` asks before starting any process, each process again as it starts."""
    source = plan.module
    name = model or (source.model if source is not None else None)
    if name is None:
        raise SpecError(f"this plan is of a torch module planned in memory "
                        f"({plan.model.name}), and does not say where its code is: give "
                        "'planner run PLAN --model module:attr' naming it, or plan it with "
                        "'planner plan --model module:attr'")
    if source is None or len(source.input_shapes) != 1:
        raise SpecError("the minimal loop trains a module of one input tensor whose traced "
                        "shape the plan records ('planner plan --model module:attr "
                        "--input-shape ...'); for others write a script calling planner.apply "
                        "(planner run --script)")
    return name, source
