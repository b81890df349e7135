"""What the planner tells a user besides the plan: warnings on a plan (GPUs mostly idle, a
sequence longer than a learned position table, a serving plan too slow for an interactive
service), and, when nothing fits or nothing is valid, what is missing and what would do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.estimate import Estimate, estimate, plan_capacity
from costmodel.formulas.layercosts import LayerCosts
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from costmodel.serving.inference import InferenceEstimate, InferenceJob
from costmodel.units import GIB
from planner.alternatives import TERM_LABELS, describe
from planner.search import SearchResult, least_gpus, nodes_of
from planner.space import RULES, Constraints, row_config

__all__ = ["IDLE_SHARE", "SERVING_TPOT_S", "SERVING_TTFT_S", "check_fixed_degrees",
           "idle_warning", "infeasible", "nothing_fits", "position_warning",
           "serving_warnings"]


IDLE_SHARE = 0.5  # idle_warning: GPUs computing for less of the step than this


def _busy(est: Estimate) -> float:
    """The share of the step the GPUs spend computing (model and recompute)."""
    bd = est.time_breakdown_s
    step = est.step_time_s or 0.0
    return (bd.get("compute", 0.0) + bd.get("recompute", 0.0)) / step if step > 0 else 1.0


def idle_warning(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, cfg: ParallelConfig,
                 est: Estimate) -> str | None:
    """A warning when the GPUs compute for less than ``IDLE_SHARE`` of the step (waiting on
    the pipeline's bubble or on communication: the batch is small for this many GPUs),
    naming the least global batch with which this configuration computes for more of it;
    ``None`` otherwise."""
    busy = _busy(est)
    if busy >= IDLE_SHARE:
        return None
    bd = est.time_breakdown_s
    step = est.step_time_s or 1.0
    why = max((t for t in bd if not t.endswith("_total") and t not in ("compute", "recompute")),
              key=lambda t: bd[t])
    msg = (f"the GPUs compute for {100 * busy:.0f}% of the step and wait the rest, mostly "
           f"on {TERM_LABELS.get(why, why)} ({100 * bd[why] / step:.0f}%)")
    unit = cfg.dp * cfg.micro_batch_size
    m0 = est.num_micro_batches
    for m in sorted({m0 * 2**k for k in range(1, 7)} | set(range(m0 + 1, m0 + 2 * cfg.pp))):
        bigger = dataclasses.replace(job, global_batch_size=unit * m)
        try:
            e = estimate(model, cluster, bigger, cfg)
        except SpecError:
            continue
        if _busy(e) >= IDLE_SHARE:
            return msg + (f"; a global batch of {unit * m} or more keeps this configuration "
                          "computing for most of the step")
    return msg + "; the batch is small for this many GPUs: fewer GPUs would waste less"


def _tp_refusals(model: ModelSpec | LayerCosts, res: SearchResult) -> str:
    """Where the search refused a traced module's TP layouts (rule ``tp_runs``), why, per
    degree it refused: the modules split in a layout no style runs, or the sequence split
    its own forward would make (``LayerCosts.tp_refusal``); ``""`` otherwise."""
    if not isinstance(model, LayerCosts) or not any("tp_runs" in rej
                                                    for rej in res.rejected.values()):
        return ""
    why = dict.fromkeys(model.tp_refusal(t, sp) for t in model.tp_degrees
                        for sp in (False, True))
    return "".join(f". {w}" for w in why if w)


def infeasible(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, cons: Constraints,
                res: SearchResult) -> Infeasible:
    """What is missing when nothing fits (or nothing is valid)."""
    cap = plan_capacity(cluster, job)
    if res.least_memory is None:
        rules = "; ".join(f"{RULES[r]} (rejected {ex})" for rej in res.rejected.values()
                          for r, (_, ex) in sorted(rej.items()))
        return Infeasible(f"no valid configuration of {model.name} on {cluster.num_gpus} GPUs "
                          f"under these constraints: {rules or 'none'}"
                          + _tp_refusals(model, res))
    low = res.least_memory
    cfg = row_config(np.array(low.row), model)
    if low.peak_memory <= cap:  # it fits the GPU: what it offloads does not fit the host
        est = estimate(model, cluster, res.jobs.get(low.framework, job), cfg)
        per_node = cluster.gpus_per_node
        return Infeasible(
            f"nothing fits in host memory: the configuration needing the least GPU memory "
            f"({describe(cfg)}, {low.framework}) fits the GPU but offloads "
            f"{est.cpu_memory_bytes / GIB:.1f} GiB per GPU to CPU memory "
            f"({per_node * est.cpu_memory_bytes / GIB:.1f} GiB per node of {per_node}), and "
            f"the cluster's nodes have {cluster.host_memory_gib:g} GiB (host_memory_gib); "
            "give the cluster its real host memory, offload less (--offload), or use more GPUs")
    reserve = (f" ({cluster.gpu.memory_bytes / GIB:.1f} GiB less the "
               f"{100 * job.memory_reserve:.0f}% memory reserve)" if job.memory_reserve else "")
    msg = nothing_fits(cap, low.peak_memory, f"{describe(cfg)}, {low.framework}", reserve)
    more = least_gpus(model, cluster, job, cons)
    if more:
        msg += f", or {nodes_of(more, cluster.gpus_per_node)} (the fewest doubling the nodes)"
    if cfg.micro_batch_size > 1:
        msg += f", or a micro-batch under {cfg.micro_batch_size}"
    return Infeasible(msg)


#: Latency bounds a serving plan is warned against when the job sets none: MLPerf
#: Inference's Llama-2-70B server scenario (v4.0 rules): first token within 2 s, then
#: 200 ms per output token.
SERVING_TTFT_S = 2.0
SERVING_TPOT_S = 0.2


def serving_warnings(job: InferenceJob, e: InferenceEstimate) -> tuple[str, ...]:
    """A serving plan slower than an interactive service allows, where the job set no bound
    of its own (``max_ttft_s`` / ``max_tpot_s``)."""
    out = []
    if job.max_ttft_s is None and e.ttft_s > SERVING_TTFT_S:
        out.append(f"the first token takes {e.ttft_s:.1f} s, beyond the {SERVING_TTFT_S:g} s "
                   "an interactive service allows (MLPerf's server bound): more tensor "
                   "parallelism, a smaller batch, or --max-ttft-ms to search under a bound")
    if job.max_tpot_s is None and e.tpot_s > SERVING_TPOT_S:
        out.append(f"each output token takes {1e3 * e.tpot_s:.0f} ms, beyond the "
                   f"{1e3 * SERVING_TPOT_S:.0f} ms an interactive service allows (MLPerf's "
                   "server bound): more tensor parallelism, a smaller batch, or "
                   "--max-tpot-ms to search under a bound")
    return tuple(out)


def nothing_fits(capacity_bytes: float, least_bytes: float, config: str, reserve: str = ""
                 ) -> str:
    """The first words of an ``Infeasible`` for a memory a training or serving search found
    nothing to fit in: ``capacity_bytes`` per GPU (``reserve``: how it was derived), the
    least any configuration needs (``least_bytes``, of ``config`` in words), and so the GPU
    that would fit; callers add what else would."""
    return (f"nothing fits in {capacity_bytes / GIB:.1f} GiB per GPU{reserve}: the least "
            f"memory any configuration needs is {least_bytes / GIB:.1f} GiB per GPU "
            f"({config}); a GPU with at least {least_bytes / GIB:.1f} GiB would fit")


def check_fixed_degrees(cons: Constraints, cluster: Cluster) -> None:
    """Degrees the constraints fix (dp, tp, pp, cp) must divide the cluster's GPUs: say so,
    as ``estimate`` does, instead of an empty search."""
    fixed = {k: cons.fixed[k] for k in ("dp", "tp", "pp", "cp") if cons.fixed.get(k)}
    product = int(np.prod(list(fixed.values()))) if fixed else 1
    if cluster.num_gpus % product:
        shown = " x ".join(f"{k}={v}" for k, v in fixed.items())
        raise SpecError(f"{shown} = {product} GPUs does not divide the cluster's "
                        f"{cluster.num_gpus}; change the degrees or the number of GPUs")


def position_warning(model: ModelSpec | LayerCosts, job: Job) -> str | None:
    """A warning when the sequence is longer than the model's learned position table
    (GPT-2's ``n_positions``, BERT's 512): a model trained from scratch can have a larger
    table, a pretrained checkpoint cannot run it; ``None`` otherwise."""
    m = model.spec if isinstance(model, LayerCosts) else model
    if not (isinstance(m, ModelSpec) and m.position_embedding == "learned"
            and job.seq_len > m.max_position_embeddings > 0):
        return None
    return (f"the sequence ({job.seq_len:,} tokens) is longer than the model's learned "
            f"position table ({m.max_position_embeddings:,}): the plan assumes a table of "
            f"{job.seq_len:,} positions, which a model trained from scratch can have but a "
            "pretrained checkpoint has not")
