"""``plan()``: the fastest configuration that fits, the runners-up, and why the rest lost.

A ``Plan`` is data: ``to_json()`` writes the model, the cluster (its profiles included), the
job, the chosen configuration and what the search found; ``Plan.from_json()`` reads it back
and re-estimates the configuration without searching, reproducing the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.estimate import (
    Estimate,
    estimate,
    plan_capacity,
)
from costmodel.formulas.layercosts import LayerCosts
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import InferenceJob
from planner.advice import (
    check_fixed_degrees,
    infeasible,
)
from planner.alternatives import (
    TERM_LABELS,
    Alternative,
    describe,
    slower_reason,
)
from planner.alternatives import alternatives as lost_alternatives
from planner.inference import constraints_from, plan_inference
from planner.partition import partition as partition_stages
from planner.partition import stage_costs
from planner.result import MAX_TOP_K, SCHEMA_VERSION, ModuleSource, Plan, PlanInvalid, load_plan
from planner.search import SearchResult, search
from planner.space import FIELDS, Constraints, row_config

# Alternative, describe and the reasons live in planner.alternatives; re-exported here.
__all__ = ["SCHEMA_VERSION", "TERM_LABELS", "Alternative", "ModuleSource", "Plan",
           "PlanInvalid", "describe", "load_plan", "plan", "slower_reason"]


def _constraints(value: Constraints | str | Mapping[str, Any] | None) -> Constraints:
    if value is None:
        return Constraints()
    if isinstance(value, Constraints):
        return value
    if isinstance(value, str):
        return Constraints.preset(value)
    if isinstance(value, Mapping):
        return Constraints.from_dict(value)
    raise SpecError(f"constraints must be a Constraints, a preset name or a dict, got "
                    f"{type(value).__name__}")


def plan(model: Any, cluster: Cluster, job: Job, *,
         constraints: Constraints | str | Mapping[str, Any] | None = None,
         top_k: int = 5, partition: bool = True,
         progress: Callable[[float], None] | None = None,
         example_inputs: Any = None, loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """The fastest configuration of ``job`` on ``cluster`` that fits in memory.

    ``model``: a ``ModelSpec``, a ``LayerCosts``, a ``LayerGraph`` or a ``torch.nn.Module``
    with ``example_inputs`` (one micro-batch of what its forward takes, or a function of the
    micro-batch size returning one). A module is traced on the meta device, each of its
    blocks costed per TP degree (``costs_from_graph``), and searched as a preset is,
    returning a ``Plan``: a pipeline stage holds a run of its layers, whatever their kinds
    (the blocks between its input and output sides, ``LayerCosts.layer_kinds``).
    ``loss_fn(output) -> scalar``: the loss a module's backward starts from, traced and
    costed with it (default ``costmodel.trace.recorder.training_loss``: the cross entropy over the
    output's last dim that ``planner run`` trains it with).

    ``constraints``: a ``Constraints``, a preset name (``planner.space.PRESETS``) or its dict
    form; ``constraints.frameworks`` searches several trainers. ``top_k``: how many
    configurations (the plan and its runners-up) to rank. ``partition``: let the stage DP
    (``planner.partition``) rebalance the layers (and recomputed layers) of the pipelined
    top configurations when that is faster than the uniform split. ``progress``: called with
    the fraction of the search done (0 to 1), e.g. a ``planner.progress.Progress`` bar.
    Deterministic: ties are broken by peak memory, then the trainer's order, then the
    configuration's columns ascending.
    Raises ``Infeasible`` when nothing fits, naming the memory or GPUs that would.
    """
    if not isinstance(model, ModelSpec | LayerCosts):
        return _plan_module(model, cluster, job, example_inputs, progress, constraints,
                            top_k, partition, loss_fn)
    for name, value, kind, what in (
            ("model", model, (ModelSpec, LayerCosts), "ModelSpec or LayerCosts"),
            ("cluster", cluster, Cluster, "Cluster"),
            ("job", job, (Job, InferenceJob), "Job or an InferenceJob")):
        if not isinstance(value, kind):
            raise SpecError(f"{name} must be a {what}, got {type(value).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise SpecError(f"top_k must be a whole number from 1 to {MAX_TOP_K} (each runner-up "
                        f"is estimated and explained again), got {top_k!r}")
    if isinstance(job, InferenceJob):

        if not isinstance(model, ModelSpec):
            raise SpecError("serving (an InferenceJob) plans a preset, config.json or "
                            "ModelSpec; a traced module is planned for training")
        return plan_inference(model, cluster, job, constraints=constraints_from(constraints),
                              top_k=top_k)
    cons = _constraints(constraints)
    ep = cons.fixed.get("ep", 1)
    if not model.is_moe and ep != 1:
        raise SpecError(f"ep={ep} needs a mixture-of-experts model; {model.name} is dense "
                        "(drop the expert-parallel constraint)")
    serving_only = sorted((set(cons.fixed) | set(cons.allowed) | set(cons.max))
                          - set(FIELDS))
    if serving_only:
        raise SpecError(f"constraint field(s) {', '.join(serving_only)} apply to serving "
                        f"(an InferenceJob); a training search takes {', '.join(FIELDS)}")
    check_fixed_degrees(cons, cluster)
    t0 = time.perf_counter()
    res = search(model, cluster, job, cons, top_k=top_k, progress=progress)
    if not res.top:
        raise infeasible(model, cluster, job, cons, res)
    best = res.top[0]
    chosen_job = res.jobs[best.framework]
    cfg = row_config(np.array(best.row), model)
    est = estimate(model, cluster, chosen_job, cfg)
    alternatives = lost_alternatives(res, plan_capacity(cluster, job))
    if partition:
        cfg, est, chosen_job, alternatives = _refine(model, cluster, res, cfg, est, chosen_job,
                                                     alternatives)
    return Plan(model=model, cluster=cluster, job=chosen_job, config=cfg, estimate=est,
                alternatives=alternatives, counts=dict(res.counts), constraints=cons,
                search_seconds=time.perf_counter() - t0)


def _plan_module(model: Any, cluster: Cluster, job: Job, example_inputs: Any,
                 progress: Callable[[float], None] | None, constraints: Any, top_k: int,
                 partition: bool, loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """A torch module (or its ``LayerGraph``): traced on one micro-batch, each distinct block
    sharded per TP degree (``costmodel.trace.blockcosts.costs_from_graph``, with and without
    sequence parallelism), then the one search (``plan`` of its ``LayerCosts``) over both.
    The trace side (networkx, the ILP) is imported here, where a module is planned, so that
    planning a preset does not load it."""
    from costmodel.trace.blockcosts import costs_from_graph, with_autocast

    graph = _traced(model, cluster, job, example_inputs, loss_fn)
    costs = costs_from_graph(graph, cluster, job, sequence_parallel="both")
    if _autocast_searched(model, job, _constraints(constraints)):
        try:
            costs = with_autocast(
                costs, _traced_under_autocast(model, job, example_inputs, loss_fn), cluster, job)
        except SpecError as e:
            import warnings

            warnings.warn(f"{graph.name} could not be costed under torch.autocast ({e}); "
                          "the configurations a trainer runs so (torchtitan's DDP: ZeRO 0 "
                          "without TP, PP or CP) are costed from its bf16 trace, which omits "
                          "the casts (constrain --zero to avoid them)", stacklevel=3)
    return plan(costs, cluster, job, constraints=constraints, top_k=top_k,
                partition=partition, progress=progress)


def _traced(model: Any, cluster: Cluster, job: Job, example_inputs: Any,
            loss_fn: Callable[[Any], Any] | None = None) -> Any:
    """The ``LayerGraph`` ``plan`` reads for a module: ``model`` itself if it is one, else
    the module traced on one micro-batch of ``example_inputs`` (called with 1 when it is a
    function of the micro-batch size) in the job's precision, its backward from ``loss_fn``
    (default ``training_loss``)."""
    from costmodel.trace.graph import LayerGraph
    from costmodel.trace.recorder import training_loss

    if not isinstance(cluster, Cluster):
        raise SpecError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    if not isinstance(job, Job):
        raise SpecError(f"job must be a training Job for a torch module, got "
                        f"{type(job).__name__}")
    if isinstance(model, LayerGraph):
        graph = model
    else:
        if not hasattr(model, "named_parameters"):
            raise SpecError(f"model must be a ModelSpec, a LayerCosts, a LayerGraph or a "
                            f"torch nn.Module, got {type(model).__name__}")
        if example_inputs is None:
            raise SpecError("planning a torch module needs example_inputs=: one micro-batch "
                            "of what its forward takes, or a function of the micro-batch "
                            "size returning one")
        inputs = example_inputs(1) if callable(example_inputs) else example_inputs
        graph = LayerGraph.from_module(model, inputs, dtype=trace_dtype(job),
                                       loss_fn=loss_fn or training_loss)
    if not graph.num_params():
        raise SpecError(f"{graph.name} has no parameters: training it has nothing to update "
                        "and nothing to split; plan the module that holds its weights")
    shape = graph.inputs[0] if graph.inputs else ()
    if job.seq_len > 1 and tuple(shape[1:2]) != (job.seq_len,):
        if len(shape) == 2:
            raise SpecError(f"the example inputs hold sequences of {shape[1]} tokens but the "
                            f"job trains {job.seq_len}; trace the job's sequence length")
        # The costs come from the trace alone; a sequence length other than the inputs' own
        # would only relabel the throughput (samples x seq_len "tokens"), a number nothing
        # measured. Sequences of vectors [batch, seq, ...] count their seq tokens.
        raise SpecError(f"the example inputs ({'x'.join(map(str, shape)) or 'none'}) are not "
                        f"sequences of {job.seq_len} tokens ([batch, seq] token ids or "
                        "[batch, seq, ...] vectors): a module fed other inputs is costed from "
                        "its trace; leave the sequence length at 1 (seq_len=1; on the "
                        "command line, no --seq-len) and its throughput counts samples")
    return graph


def _autocast_searched(model: Any, job: Job, cons: Constraints) -> bool:
    """Whether a searched trainer trains some rows under ``torch.autocast`` (torchtitan's
    DDP: ``costmodel.formulas.compute.autocast_rows``) and ``model`` is a module to trace so (a
    ``LayerGraph`` given is planned as traced)."""
    from costmodel.frameworks import framework
    from costmodel.trace.graph import LayerGraph

    names = cons.frameworks or (job.framework,)
    return not isinstance(model, LayerGraph) and job.precision in ("bf16", "fp16") \
        and any(framework(n).autocast_ddp for n in names)


def _traced_under_autocast(model: Any, job: Job, example_inputs: Any,
                           loss_fn: Callable[[Any], Any] | None) -> Any:
    """The module traced as ``torch.autocast`` runs it: fp32 parameters, matmuls in the
    job's precision."""
    import torch

    from costmodel.trace.graph import LayerGraph
    from costmodel.trace.recorder import training_loss

    inputs = example_inputs(1) if callable(example_inputs) else example_inputs
    return LayerGraph.from_module(model, inputs, dtype=torch.float32,
                                  autocast=trace_dtype(job), loss_fn=loss_fn or training_loss)


def trace_dtype(job: Job) -> Any:
    """The torch dtype a module is traced in: the job's precision (fp8 runs its matmuls on
    bf16 activations)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16}.get(job.precision, torch.bfloat16)


def _refine(model: ModelSpec | LayerCosts, cluster: Cluster, res: SearchResult, cfg: ParallelConfig,
            est: Estimate, job: Job, alternatives: tuple[Alternative, ...]
            ) -> tuple[ParallelConfig, Estimate, Job, tuple[Alternative, ...]]:
    """Give the pipelined configurations among the top ones a non-uniform stage partition
    (``planner.partition``; per-stage recompute counts when they recompute fully) and keep
    the fastest result; the uniform split it replaced becomes a runner-up."""
    uniform_s = est.step_time_s
    assert uniform_s is not None  # estimate() always times the step
    best = (uniform_s, cfg, est, job)
    for f in res.top:
        c = row_config(np.array(f.row), model)
        if c.pp < 2 or c.virtual_pipeline_stages > 1:
            continue
        j = res.jobs[f.framework]
        costs = stage_costs(model, cluster, j, c)
        part = partition_stages(costs, model.num_layers, plan_capacity(cluster, j),
                         per_stage=c.recompute == "full")
        if part is None:
            continue
        c2 = part.apply(c)
        e2 = estimate(model, cluster, j, c2)
        step2 = e2.step_time_s
        assert step2 is not None  # estimate() always times the step
        if e2.fits and e2.within_reserve and step2 < best[0]:
            best = (step2, c2, e2, j)
    if best[1] is cfg:
        return cfg, est, job, alternatives
    uniform = Alternative(
        framework=job.framework, config=cfg, verdict="slower",
        reason=f"the uniform stage split: slower by "
        f"{100 * (uniform_s / best[0] - 1):.1f}% than the partition the stage DP "
        f"found", step_time_s=uniform_s, peak_memory_bytes=est.peak_memory_bytes)
    return best[1], best[2], best[3], (uniform, *alternatives)
