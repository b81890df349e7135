"""Pipeline schedule timelines: when each pipeline rank runs which micro-batch.

The schedules, their op orders and the event simulation live in ``costmodel.formulas.pipeline``,
where
the step-time model plays the same schedules out (``costmodel.formulas.steptime``), so a timeline
and
the estimate of its configuration always agree. ``timeline`` takes the per-stage times from
the cost model (``costmodel.formulas.steptime.time_table``), splitting each stage's time per
micro-batch into forward and backward by the forward pass's share of its compute, as the
estimate does; communication is inside the stage times, as there.
"""

from __future__ import annotations

from costmodel.config import Job, ParallelConfig
from costmodel.formulas.checks import validate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import ConfigArrays, memory_table
from costmodel.formulas.pipeline import Op, Timeline, simulate
from costmodel.formulas.steptime import time_table
from costmodel.formulas.vschedules import costed_ranks, dualpipe_costing
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec

__all__ = ["Op", "Timeline", "simulate", "timeline"]


def timeline(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, config: ParallelConfig
             ) -> Timeline:
    """The schedule of ``config``'s pipeline as the cost model times it: each rank's time per
    micro-batch (``time_table``'s stage times, communication included) split into forward and
    backward by their compute share, and what an overlapped pair saves there
    (``TimeTable.hidden``)."""
    validate(model, cluster, job, config)
    costed = dualpipe_costing(config)
    a = ConfigArrays.from_configs(model, [costed])
    mem = memory_table(model, cluster, job, a)
    t = time_table(model, cluster, job, a, mem)
    assert t.forward_share is not None
    stage, share = t.stage_time[:, 0], t.forward_share[:, 0]
    # DualPipe's rank r holds the stages of its half rank min(r, pp - 1 - r) of the costed
    # DualPipeV (vschedules.dualpipe_costing); its own op order and dependencies are played.
    half = costed_ranks(config)
    fwd = [float(stage[h] * share[h]) for h in half]
    bwd = [float(stage[h] - stage[h] * share[h]) for h in half]
    hidden = None if t.hidden is None else [float(t.hidden[h, 0]) for h in half]
    m = int(mem.num_micro_batches[0]) * (config.pp // costed.pp)
    return simulate(fwd, bwd, m, str(config.pipeline_schedule), config.virtual_pipeline_stages,
                    hidden)
