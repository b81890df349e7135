"""Non-uniform pipeline stages: which layers each stage holds, and how many it recomputes.

A uniform split gives every stage L/p layers, but the first stage also holds the embedding and
the most micro-batches in flight, and the last the LM head and the loss; with a large
vocabulary or a memory-tight first stage the stages are imbalanced. Following Alpa, DAPPLE and
Mist, ``partition()`` assigns contiguous runs of layers to the p stages to minimise the slowest
stage's time per micro-batch, under each stage's memory capacity, and (when the configuration
recomputes fully) lets each stage recompute a different number of its layers.

Stage costs come from the cost model itself: ``stage_costs`` evaluates one pipeline-stage
column per candidate (stage s, first layer i, layers l, recomputed layers r) with
``costmodel.formulas.memory.memory_table`` and ``costmodel.formulas.steptime.time_table``, so the
time and memory
of the chosen partition are exactly what ``estimate()`` reports for it.

Two exact solvers over the same costs:

- ``partition`` (dynamic program). With ``T(s, j)`` the least achievable slowest-stage time
  when stages ``0..s`` hold layers ``0..j-1``::

      T(0, j) = min_r  t(0, 0, j, r)                       over r with m(0, 0, j, r) <= M
      T(s, j) = min_{l, r} max(T(s-1, j-l), t(s, j-l, l, r))  over m(s, j-l, l, r) <= M

  and the answer is ``T(p-1, L)``.
- ``partition_ilp`` (CP-SAT). Binary ``y[s, i, l, r]``: stage s holds layers i..i+l-1 and
  recomputes r of them; only candidates within the memory capacity M get a variable.

      (a) sum_{i,l,r} y[s,i,l,r] = 1                      for every stage s
      (b) stage 0 starts at layer 0: y[0,i,l,r] = 0 for i > 0
      (c) stage s+1 starts where stage s ends:
          sum_{i,l,r} (i+l) y[s,i,l,r] = sum_{i,l,r} i y[s+1,i,l,r]
      (d) the last stage ends at layer L: sum (i+l) y[p-1,i,l,r] = L
      (e) T >= sum_{i,l,r} t(s,i,l,r) y[s,i,l,r]           for every stage s
      minimise T   (times in integer nanoseconds)

Both are checked against brute force over every composition in ``tests/test_partition.py``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from costmodel.config import Job, ParallelConfig
from costmodel.errors import SpecError
from costmodel.formulas.arrays import input_split
from costmodel.formulas.checks import validate
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import ConfigArrays, memory_table
from costmodel.formulas.steptime import time_table
from costmodel.formulas.tables import take
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec

__all__ = ["Partition", "StageCosts", "brute_force", "partition", "partition_ilp",
           "stage_costs"]


@dataclass(frozen=True)
class StageCosts:
    """Time per micro-batch (s) and peak memory (bytes) of every candidate stage.

    ``time[s, i, l, r]`` / ``memory[s, i, l, r]``: stage ``s`` holding layers ``i .. i+l-1`` and
    fully recomputing ``r`` of them (``r`` is 0 unless the configuration recomputes fully);
    ``inf`` where the candidate is impossible. ``starts_matter``: whether the first layer
    changes the cost (layers of several kinds); otherwise only ``i = 0`` is filled
    and stands for every start.
    """

    time: np.ndarray
    memory: np.ndarray
    starts_matter: bool

    def at(self, s: int, i: int, n: int, r: int) -> tuple[float, float]:
        """(time, memory) of a candidate."""
        k = i if self.starts_matter else 0
        return float(self.time[s, k, n, r]), float(self.memory[s, k, n, r])


@dataclass(frozen=True)
class Partition:
    """Layers per stage, fully recomputed layers per stage (``None`` unless recompute is
    full), the slowest stage's time per micro-batch (s) and each stage's peak memory (bytes)."""

    stage_layers: tuple[int, ...]
    stage_recompute: tuple[int, ...] | None
    slowest: float
    memory: tuple[float, ...]

    def apply(self, cfg: ParallelConfig) -> ParallelConfig:
        """``cfg`` with this partition."""
        return replace(cfg, stage_layers=self.stage_layers, recompute_num_layers=None,
                       stage_recompute_layers=self.stage_recompute)


def stage_costs(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, cfg: ParallelConfig
                ) -> StageCosts:
    """Cost of every (stage, first layer, layers, recomputed layers) candidate of ``cfg``."""
    if cfg.virtual_pipeline_stages > 1 or cfg.pipeline_schedule == "dualpipe":
        raise SpecError("non-uniform stages need a schedule with one stage per rank (not "
                        "interleaved, V-shaped or DualPipe)")
    p, L = cfg.pp, model.num_layers
    # A traced graph's first stage holds the layers before its last read of the model's
    # inputs (LayerCosts.first_stage_layers): checked on a split that gives it them.
    split = input_split(L, p, model.first_stage_layers)
    validate(model, cluster, job, replace(cfg, stage_layers=tuple(split) if split else None,
                                          stage_recompute_layers=None))
    per_stage = cfg.recompute == "full"
    # Where the layers are not all of one kind (a MoE model's leading dense layers, a
    # traced graph's distinct blocks) a stage's cost depends on its first layer too.
    mixed = len(set(model.layer_kinds)) > 1
    starts = range(L) if mixed else range(1)
    cand = [(s, i, n, r) for s in range(p) for i in starts for n in range(1, L - p + 2)
            if i + n <= L or not mixed for r in (range(n + 1) if per_stage else (0,))]
    c = np.array(cand, dtype=np.int64)
    base = ConfigArrays.from_configs(model, [replace(cfg, stage_layers=None,
                                                     stage_recompute_layers=None)])
    # The configuration's row repeated, one stage column per candidate.
    a = replace(take(base, np.zeros(len(c), dtype=np.int64), 1), stage_index=c[:, :1],
                stage_count=np.ones((len(c), 1), np.int64), stage_layers=c[:, 2:3],
                stage_start=c[:, 1:2], stage_recompute=c[:, 3:4] if per_stage else None)
    mem = memory_table(model, cluster, job, a)
    # Only each candidate's own stage time is read: no pipeline to play out.
    tt = time_table(model, cluster, job, a, mem, exact_below=-np.inf)
    shape = (p, len(starts), L + 1, L + 1)
    time = np.full(shape, np.inf)
    memory = np.full(shape, np.inf)
    time[c[:, 0], c[:, 1], c[:, 2], c[:, 3]] = tt.stage_time[0]
    memory[c[:, 0], c[:, 1], c[:, 2], c[:, 3]] = mem.total[0]
    # The first stage holds at least the layers that read the model's inputs.
    time[0, :, :model.first_stage_layers] = np.inf
    return StageCosts(time=time, memory=memory, starts_matter=mixed)


def _best_options(costs: StageCosts, capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """Per (stage, start, layers): the fastest recompute count that fits (fewest recomputed
    first among equals) and its time; ``inf`` where none fits."""
    t = np.where(costs.memory <= capacity, costs.time, np.inf)
    r = np.argmin(t, axis=3)
    return np.take_along_axis(t, r[..., None], axis=3)[..., 0], r


def _result(costs: StageCosts, layers: list[int], recs: list[int], per_stage: bool
            ) -> Partition:
    starts = np.cumsum([0, *layers[:-1]])
    tm = [costs.at(s, int(i), n, r) for s, (i, n, r) in enumerate(zip(starts, layers, recs,
                                                                       strict=True))]
    return Partition(stage_layers=tuple(layers),
                     stage_recompute=tuple(recs) if per_stage else None,
                     slowest=max(t for t, _ in tm), memory=tuple(m for _, m in tm))


def partition(costs: StageCosts, num_layers: int, capacity: float, per_stage: bool
              ) -> Partition | None:
    """The dynamic program of the module docstring; ``None`` if no partition fits."""
    p = costs.time.shape[0]
    L = num_layers
    bt, br = _best_options(costs, capacity)

    def option(s: int, start: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = start if costs.starts_matter else np.zeros_like(start)
        return bt[s, k, n], br[s, k, n]

    best = np.full((p, L + 1), np.inf)
    choice = np.zeros((p, L + 1, 2), dtype=np.int64)  # (layers, recomputed) of stage s
    j = np.arange(1, L - p + 2)
    t0, r0 = option(0, np.zeros_like(j), j)
    best[0, j] = t0
    choice[0, j, 0], choice[0, j, 1] = j, r0
    for s in range(1, p):
        for end in range(s + 1, L - (p - 1 - s) + 1):
            # T(s, end) = min over the stage's layers n of max(T(s-1, end-n), t(s, end-n, n)).
            n = np.arange(1, end - s + 1)
            t, r = option(s, end - n, n)
            val = np.maximum(best[s - 1, end - n], t)
            k = int(np.argmin(val))  # fewest layers first among equals
            if np.isfinite(val[k]):
                best[s, end] = val[k]
                choice[s, end] = (n[k], r[k])
    if not np.isfinite(best[p - 1, L]):
        return None
    layers: list[int] = []
    recs: list[int] = []
    end = L
    for s in range(p - 1, -1, -1):
        count, rec = (int(x) for x in choice[s, end])
        layers.append(count)
        recs.append(rec)
        end -= count
    return _result(costs, layers[::-1], recs[::-1], per_stage)


def partition_ilp(costs: StageCosts, num_layers: int, capacity: float, per_stage: bool,
                  time_limit_s: float = 30.0) -> Partition | None:
    """The CP-SAT formulation of the module docstring; ``None`` if no partition fits."""
    from ortools.sat.python import cp_model

    p = costs.time.shape[0]
    L = num_layers
    # The CamelCase API runs on every supported ortools (>= 9.8, which has no snake_case
    # names), but the stubs of newer releases omit it: hence the attr-defined ignores.
    m = cp_model.CpModel()
    y: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for s in range(p):
        for i in range(0 if s == 0 else s, L - (p - s) + 1 if s else 1):  # (b)
            for n in range(1, L - i - (p - 1 - s) + 1):
                for r in range(n + 1) if per_stage else (0,):
                    t, mem = costs.at(s, i, n, r)
                    if np.isfinite(t) and mem <= capacity:
                        y[s, i, n, r] = m.NewBoolVar(  # type: ignore[attr-defined]
                            f"y_{s}_{i}_{n}_{r}")
    ns = {k: round(costs.at(*k)[0] * 1e9) for k in y}
    horizon = max(ns.values(), default=0)
    T = m.NewIntVar(0, horizon, "T")  # type: ignore[attr-defined]
    for s in range(p):
        mine = [k for k in y if k[0] == s]
        if not mine:
            return None
        m.AddExactlyOne(y[k] for k in mine)  # type: ignore[attr-defined]  # (a)
        m.Add(sum(ns[k] * y[k] for k in mine) <= T)  # type: ignore[attr-defined]  # (e)
        end = sum((k[1] + k[2]) * y[k] for k in mine)
        if s + 1 < p:
            m.Add(  # type: ignore[attr-defined]
                end == sum(k[1] * y[k] for k in y if k[0] == s + 1))  # (c)
        else:
            m.Add(end == L)  # type: ignore[attr-defined]  # (d)
    m.Minimize(T)  # type: ignore[attr-defined]
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    if solver.Solve(m) != cp_model.OPTIMAL:
        return None
    chosen = sorted(k for k in y if solver.Value(y[k]))
    return _result(costs, [k[2] for k in chosen], [k[3] for k in chosen], per_stage)


def brute_force(costs: StageCosts, num_layers: int, capacity: float, per_stage: bool
                ) -> float:
    """The least slowest-stage time over every composition and recompute choice (tests)."""
    p = costs.time.shape[0]
    best = np.inf
    for cuts in itertools.combinations(range(1, num_layers), p - 1):
        layers = np.diff([0, *cuts, num_layers])
        starts = np.cumsum([0, *layers[:-1]])
        slow = 0.0
        for s, (i, n) in enumerate(zip(starts, layers, strict=True)):
            opts = [costs.at(s, int(i), int(n), r) for r in
                    (range(int(n) + 1) if per_stage else (0,))]
            fits = [t for t, mem in opts if mem <= capacity]
            slow = max(slow, min(fits)) if fits else np.inf
        best = min(best, slow)
    return float(best)
