"""What a mixture-of-experts plan's routing assumptions cost: the same job searched again
with each other token dispatcher (``Job.moe_dispatcher``) a searched trainer runs
(``Framework.moe_dispatchers``) and with forced even routing (``Job.moe_load_imbalance``
1.0), for ``planner.explain``. The dispatcher and the load are the job's (what the trainer
runs, how the router balances), not the search's: these say what changing them would buy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodel.config import MOE_DISPATCHERS, Job
from costmodel.formulas.moe import routed_load
from costmodel.frameworks import framework
from planner.alternatives import Choice, Option
from planner.result import Plan
from planner.search import search
from planner.space import Constraints, row_config

__all__ = ["ROUTING_FIELDS", "routing_choices"]

#: The routing fields ``routing_choices`` reports (not ``ParallelConfig`` fields: the job's).
ROUTING_FIELDS = ("moe_dispatcher", "moe_load")


def _searched(plan: Plan, value: object, job: Job, constraints: Constraints | None = None
              ) -> Option:
    """The fastest configuration of ``job`` under ``constraints`` (default the plan's),
    against the plan."""
    _, _, e = plan.training()
    cons = plan.constraints if constraints is None else constraints
    res = search(plan.model, plan.cluster, job, cons, top_k=1)
    if not res.top:
        return Option(value=value, verdict="does not fit",
                      reason="no configuration fits with it under these constraints")
    best = res.top[0]
    base = e.step_time_s or 0.0
    pct = 100.0 * (best.step_time / base - 1.0) if base else 0.0
    grew = best.terms.get("ep_comm", 0.0) - e.time_breakdown_s.get("ep_comm", 0.0)
    word = "faster" if pct < 0 else "slower"
    reason = (f"{word} by {abs(pct):.1f}% ({best.step_time:.3f} s), the expert dispatch "
              f"{'+' if grew >= 0 else '-'}{1e3 * abs(grew):.0f} ms")
    return Option(value=value, verdict=word, reason=reason, framework=best.framework,
                  config=row_config(np.array(best.row), plan.model),
                  step_time_s=best.step_time, peak_memory_bytes=best.peak_memory)


def routing_choices(plan: Plan) -> tuple[Choice, ...]:
    """For a MoE plan: its dispatcher against each other one that a searched trainer runs
    (over those trainers alone: torchtitan has no all-gather dispatcher), and its busiest
    rank's load against forced even routing, each the fastest configuration searched with
    it; none for a dense model."""
    job, _, _ = plan.training()
    if not getattr(plan.model, "is_moe", False):
        return ()
    searched = plan.constraints.frameworks or (job.framework,)
    dispatchers = []
    for d in MOE_DISPATCHERS:
        runs = tuple(f for f in searched if d in framework(f).moe_dispatchers)
        if d != job.moe_dispatcher and runs:
            dispatchers.append(_searched(plan, d, replace(job, moe_dispatcher=d),
                                         replace(plan.constraints, frameworks=runs)))
    out = [Choice(field="moe_dispatcher", chosen=job.moe_dispatcher, fixed=True,
                  options=tuple(dispatchers))]
    load = routed_load(job)
    if load != 1.0:
        even = replace(job, moe_load_imbalance=1.0, moe_capacity_factor=None)
        out.append(Choice(field="moe_load", chosen=round(load, 3), fixed=True,
                          options=(_searched(plan, 1.0, even),)))
    return tuple(out)
