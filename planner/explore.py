"""Exploring beyond one plan: the whole space's throughput-vs-memory frontier, and what-if
sweeps over the cluster (number of GPUs, inter-node bandwidth, GPU kind).

``frontier`` times every configuration of the space (not only what the branch and bound
needs), in chunks, so it costs seconds where ``plan`` costs a fraction of one: use it to
look, not to choose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.tables import evaluate
from costmodel.hardware import GPU, Cluster
from costmodel.model import ModelSpec
from planner.plan import _constraints, plan
from planner.result import Plan
from planner.space import Constraints, arrays, positions, row_config, spaces

__all__ = ["SWEEPS", "WHATIF_GPUS", "Frontier", "SweepPoint", "frontier", "sweep", "what_if",
           "what_if_label"]

CHUNK_CORES = 2048


@dataclass(frozen=True)
class Frontier:
    """Every configuration of a space, timed. ``step_time_s`` and ``peak_memory_bytes`` (per
    GPU) hold one entry per configuration kept for drawing (all of them, or an even sample of
    ``max_points``, always with the frontier); ``fits`` whether each fits. ``pareto`` indexes
    the configurations no other beats on both step time and memory, in order of memory;
    ``pareto_configs`` are those configurations. ``tokens_per_step`` turns step times into
    throughput; ``capacity_bytes`` is the GPU's memory; ``total`` counts every configuration
    timed. ``frameworks``: the trainer of each kept configuration; ``configs``: each kept
    configuration (filled when ``frontier`` is asked for them, else empty)."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    fits: np.ndarray
    pareto: np.ndarray
    pareto_configs: tuple[ParallelConfig, ...]
    tokens_per_step: int
    capacity_bytes: float
    total: int
    frameworks: tuple[str, ...] = ()
    configs: tuple[ParallelConfig, ...] = ()

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Throughput of each kept configuration, tokens per second."""
        return self.tokens_per_step / self.step_time_s


def frontier(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
             constraints: Constraints | str | Mapping[str, Any] | None = None, *,
             max_points: int = 20_000, seed: int = 0, keep_configs: bool = False,
             progress: Callable[[float], None] | None = None) -> Frontier:
    """Time every configuration of the space (under ``constraints``) and find the
    throughput-vs-memory Pareto frontier; keep ``max_points`` of the rest (an even random
    sample with ``seed``) for drawing, and with ``keep_configs`` each kept one's
    ``ParallelConfig`` (for hover text and selection: ``planner serve``)."""
    cons = _constraints(constraints)
    steps, peaks, rows = [], [], []
    owners = []  # per chunk of rows: the position in ``todo`` of the trainer's (job, space)
    todo = spaces(model, cluster, job, cons)
    total_cores = sum(len(s.cores) for _, s in todo) or 1
    done = 0
    for t, (j, space) in enumerate(todo):
        nr = space.sizes[1]
        for lo in range(0, len(space.cores), CHUNK_CORES):
            cores = np.arange(lo, min(lo + CHUNK_CORES, len(space.cores)))
            table = space.expand(np.repeat(cores, nr[cores]), positions(nr[cores]))
            # Lower bounds first (pipelines not played out): the rows drawn are made exact
            # below.
            res = evaluate(model, cluster, j, arrays(model, table), exact_below=-np.inf)
            steps.append(res.step_time)
            peaks.append(res.peak_memory)
            rows.append(table)
            owners.append(np.full(len(table), t))
            done += len(cores)
            if progress is not None:
                progress(done / total_cores)
    if not steps:
        raise Infeasible(f"no valid configuration of {model.name} on {cluster.num_gpus} GPUs "
                         "under these constraints")
    step = np.concatenate(steps)
    peak = np.concatenate(peaks)
    table = np.concatenate(rows)
    owner = np.concatenate(owners)
    exact = np.zeros(len(step), dtype=bool)

    def play(idx: np.ndarray) -> None:
        """Replace the bounds of rows ``idx`` by their pipelines played out."""
        idx = idx[~exact[idx]]
        for t in np.unique(owner[idx]):
            mine = idx[owner[idx] == t]
            step[mine] = evaluate(model, cluster, todo[t][0],
                                  arrays(model, table[mine])).step_time
            exact[mine] = True

    # Pareto: in order of memory (then time), keep each row faster than all before it. A
    # front of exact rows is the exact front (every other row's bound, and so its time, is
    # above a front row's), so play the front out until it is all exact.
    while True:
        order = np.lexsort((step, peak))
        best = np.minimum.accumulate(step[order])
        keep = np.ones(len(order), dtype=bool)
        keep[1:] = step[order][1:] < best[:-1]
        front = order[keep]
        if exact[front].all():
            break
        play(front[~exact[front]])
    rng = np.random.default_rng(seed)
    sample = np.arange(len(step)) if len(step) <= max_points else \
        rng.choice(len(step), size=max_points, replace=False)
    shown = np.union1d(sample, front)
    play(shown)
    where = np.searchsorted(shown, front)
    cap = float(cluster.gpu.memory_bytes)
    return Frontier(step_time_s=step[shown], peak_memory_bytes=peak[shown],
                    fits=peak[shown] <= cap, pareto=where,
                    pareto_configs=tuple(row_config(table[i], model) for i in front),
                    tokens_per_step=job.tokens_per_step, capacity_bytes=cap, total=len(step),
                    frameworks=tuple(todo[t][0].framework for t in owner[shown]),
                    configs=tuple(row_config(table[i], model) for i in shown)
                    if keep_configs else ())


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: the swept ``value``, the ``cluster`` it made, and the ``plan``
    found there (``None`` with the reason in ``error`` when nothing fits)."""

    value: Any
    cluster: Cluster
    plan: Plan | None
    error: str | None = None


def _with_gpus(cluster: Cluster, value: Any) -> Cluster:
    n = int(value)
    if n < 1 or n % cluster.gpus_per_node:
        raise SpecError(f"sweep over num_gpus: {value!r} is not a positive multiple of the "
                        f"{cluster.gpus_per_node} GPUs per node")
    return replace(cluster, num_nodes=n // cluster.gpus_per_node)


def _with_bandwidth(cluster: Cluster, value: Any) -> Cluster:
    gbps = float(value)
    if not gbps > 0:
        raise SpecError(f"sweep over inter_node_gbps: {value!r} is not a positive bandwidth")
    old = cluster.inter_link
    link = replace(old, bandwidth_bytes_per_s=gbps * 1e9, name=f"{old.name}@{gbps:g}GB/s")
    return replace(cluster, inter_node_link=link)


def _with_gpu(cluster: Cluster, value: Any) -> Cluster:
    gpu = value if isinstance(value, GPU) else GPU.preset(str(value))
    return replace(cluster, gpu=gpu, intra_node_link=None)


#: What ``sweep`` can vary: ``num_gpus`` (whole nodes), ``inter_node_gbps`` (GB/s per NIC,
#: one direction; the link's latency and efficiency are kept) and ``gpu`` (a profile name).
SWEEPS: dict[str, Callable[[Cluster, Any], Cluster]] = {
    "num_gpus": _with_gpus, "inter_node_gbps": _with_bandwidth, "gpu": _with_gpu,
}


def sweep(model: ModelSpec, cluster: Cluster, job: Job, over: str, values: Sequence[Any], *,
          constraints: Constraints | str | Mapping[str, Any] | None = None,
          progress: Callable[[float], None] | None = None) -> list[SweepPoint]:
    """The plan at each value of one cluster property (``SWEEPS``), everything else kept."""
    if over not in SWEEPS:
        raise SpecError(f"cannot sweep {over!r}; choose from {', '.join(SWEEPS)}")
    if not len(values):
        raise SpecError("a sweep needs at least one value")
    return _plan_each(model, [(v, SWEEPS[over](cluster, v)) for v in values], job,
                      constraints, progress)


def _plan_each(model: ModelSpec | LayerCosts, points: Sequence[tuple[Any, Cluster]], job: Job,
               constraints: Constraints | str | Mapping[str, Any] | None,
               progress: Callable[[float], None] | None) -> list[SweepPoint]:
    """The plan on each (value, cluster) point; ``None`` with the reason where nothing
    fits."""
    out = []
    for i, (v, c) in enumerate(points):
        try:
            out.append(SweepPoint(value=v, cluster=c,
                                  plan=plan(model, c, job, constraints=constraints, top_k=1)))
        except Infeasible as e:
            out.append(SweepPoint(value=v, cluster=c, plan=None, error=str(e)))
        if progress is not None:
            progress((i + 1) / len(points))
    return out


#: The GPU types ``what_if`` tries by default (the job's own is always among the points).
WHATIF_GPUS = ("a100-80gb", "h100-sxm", "h200", "b200", "mi300x")


def what_if(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, *,
            constraints: Constraints | str | Mapping[str, Any] | None = None,
            gpu_counts: Sequence[int] | None = None, gpus: Sequence[str] | None = None,
            progress: Callable[[float], None] | None = None) -> list[SweepPoint]:
    """The same job planned on other GPU counts (default: half and twice the cluster's, in
    whole nodes) and on other GPU types (default ``WHATIF_GPUS``, same node shape, each
    GPU's own links), each point a ``SweepPoint`` whose ``value`` is ``(num_gpus, gpu
    name)``; the first point is the job as asked. Rank them with ``Estimate.step_time_s``
    and ``Estimate.usd_per_million_tokens``."""
    n, per = cluster.num_gpus, cluster.gpus_per_node
    counts = [c for c in (gpu_counts if gpu_counts is not None else (n // 2, 2 * n))
              if c >= per and c % per == 0 and c != n]
    kinds = [g for g in (gpus if gpus is not None else WHATIF_GPUS) if g != cluster.gpu.name]
    clusters = [cluster] + [_with_gpus(cluster, c) for c in dict.fromkeys(counts)] \
        + [_with_gpu(cluster, g) for g in dict.fromkeys(kinds)]
    return _plan_each(model, [((c.num_gpus, c.gpu.name), c) for c in clusters], job,
                      constraints, progress)


def what_if_label(point: SweepPoint) -> str:
    """``"128 x h100-sxm"``: a what-if point's GPUs."""
    return f"{point.cluster.num_gpus} x {point.cluster.gpu.name}"
