"""Grid search: the fastest configurations that fit, exactly, without timing the whole space.

The cost model (``costmodel.formulas.tables.evaluate``) is evaluated on the factored space
(``planner.space.Space``) by branch and bound; the result is the one a full pass over every
row would give (``tests/test_search.py`` checks it against brute force over ``estimate()``).

- Level 0: each core (degrees, sequence parallel, micro-batch, schedule) once, with no ZeRO,
  no offload and no recompute. Its ``floor`` (the pipeline time without ZeRO-3 traffic and
  without what follows the last backward) bounds every configuration of the core from below:
  ZeRO, sharding, offload and recompute only add to a stage's time.
- Level 1: cores in order of that bound; each recompute option of a core, still without
  ZeRO, bounds the configurations of that (core, recompute) pair.
- Level 2: pairs whose bound does not exceed the k-th best step time found so far are
  expanded over their sharding options (ZeRO stage, sharding group, offload) and evaluated:
  memory first, and only the rows that fit are timed; a row's pipeline schedule is played out
  (``costmodel.formulas.pipeline``) only when its lower bound
  (``pipelinetable.pipeline_bound``, exact for equal stages) does not exceed the k-th best,
  so every plan's time is its schedule's.

The search stops at the first core whose bound exceeds the k-th best time. Order of the
result (ties included): step time, then peak memory, then the trainer's position in the list
searched, then the configuration's columns (``planner.space.COLUMNS``) in ascending order,
so smaller degrees and simpler options win ties.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.config import Job
from costmodel.formulas.arrays import is_v
from costmodel.formulas.estimate import plan_capacity
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.steptime import TIME_TERMS
from costmodel.formulas.tables import CostTable, evaluate
from costmodel.hardware import Cluster
from costmodel.model import ModelSpec
from planner.space import (
    COLUMNS,
    CORE,
    RECOMPUTATION,
    Constraints,
    Space,
    arrays,
    column_values,
    positions,
    spaces,
)

__all__ = ["Found", "MeshOutcome", "SearchResult", "least_gpus", "nodes_of", "search"]

MESH = ("dp", "tp", "pp", "cp", "ep", "etp")
# Step-time terms that follow the last backward (the rest is the pipeline's time).
POST_TERMS = ("dp_comm", "optimizer", "offload")
_MESH_COLS = [COLUMNS.index(c) for c in MESH]
_SCHEDULE_COL = COLUMNS.index("schedule")
FIRST_BATCH = 8
MAX_BATCH = 8192


@dataclass(frozen=True)
class Found:
    """One evaluated configuration: its trainer, row of ``COLUMNS``, step time (s), peak
    memory per GPU (bytes) on stage ``peak_stage``, and step-time terms (s)."""

    framework: str
    row: tuple[int, ...]
    step_time: float
    peak_memory: float
    peak_stage: int
    terms: dict[str, float]


@dataclass
class MeshOutcome:
    """What happened to one mesh (trainer, dp, tp, pp, cp, ep): its fastest configuration
    that fits, the one that missed the memory by the least, and the least lower bound of the
    configurations never timed because the bound alone was slower than the plan."""

    best: Found | None = None
    nearest: Found | None = None
    floor: float = np.inf


@dataclass
class SearchResult:
    """The top configurations (fastest first), per-mesh outcomes, counts of configurations
    (``space``, ``evaluated``, ``fit``, ``did_not_fit``, ``bounded``), the values each validity
    rule rejected per trainer, and the configuration with the least peak memory evaluated."""

    top: list[Found]
    meshes: dict[tuple[str, int, int, int, int, int, int], MeshOutcome]
    counts: dict[str, int]
    rejected: dict[str, dict[str, tuple[int, str]]]
    least_memory: Found | None
    jobs: dict[str, Job] = field(default_factory=dict)
    #: What was searched (``row_config`` reads a traced graph's stage split off it).
    model: ModelSpec | LayerCosts | None = None
    #: With ``search(by=...)``: column -> value code -> the fastest configuration that fits
    #: with that value (the search's order breaks ties), exactly as a search with the value
    #: fixed would return it.
    best_by: dict[str, dict[int, Found]] = field(default_factory=dict)
    #: Column -> value code -> the configuration with that value needing the least GPU memory
    #: (as ``least_memory``); exact for every value that ``best_by`` lacks.
    least_by: dict[str, dict[int, Found]] = field(default_factory=dict)


def _first_per(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The first index of ``order`` for each distinct value of ``keys`` (one per element of
    ``order``), in ``order``'s order."""
    _, idx = np.unique(keys, return_index=True)
    return order[np.sort(idx)]


def _first_per_mesh(rows: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The first index of ``order`` for each mesh (``MESH`` columns) among ``rows``."""
    # One integer per mesh (np.unique over rows sorts them lexicographically, far slower).
    return _first_per(_mesh_key(rows[order]), order)


def _order(rows: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """The order of ``rows`` by ``keys`` (most significant first), then by the columns
    ascending: sorting by every column is slow (a 16-key lexsort), so only rows that tie on
    all ``keys`` are sorted by their columns."""
    o = np.lexsort(keys[::-1]) if keys else np.arange(len(rows))
    if len(o) < 2:
        return o
    same = np.ones(len(o) - 1, dtype=bool)
    for k in keys:
        ks = k[o]
        same &= ks[1:] == ks[:-1]
    if not same.any():
        return o
    group = np.cumsum(np.r_[True, ~same])  # runs of rows tied on every key
    tied = np.flatnonzero(np.r_[same, False] | np.r_[False, same])
    sub = o[tied]
    o[tied] = sub[np.lexsort((*rows[sub].T[::-1], group[tied]))]
    return o


def _mesh_key(rows: np.ndarray) -> np.ndarray:
    """One integer per mesh (``MESH`` columns) of each row."""
    mesh = rows[:, _MESH_COLS]
    if not len(mesh):
        return np.zeros(0, dtype=np.int64)
    dims = tuple(int(x) + 1 for x in mesh.max(axis=0))
    if math.prod(dims) < 2**62:
        return np.ravel_multi_index(mesh.T, dims)
    # Degrees too large to number every combination: number the distinct meshes (in the
    # same lexicographic order).
    return np.unique(mesh, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def _firsts(group: np.ndarray, rows: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """For each distinct value of ``group``, the index of its first row in the order of
    ``keys`` (most significant first) then the columns ascending; in order of the groups.
    No sort of every row: each key keeps only the rows at their group's minimum."""
    if not len(group):
        return np.zeros(0, dtype=np.int64)
    _, inv = np.unique(group, return_inverse=True)
    return _group_firsts(inv.ravel(), int(inv.max()) + 1, rows, keys)


def _mesh_ids(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's mesh (``MESH`` columns) as a number from 0, in the meshes' lexicographic
    order (as ``np.unique`` of ``_mesh_key`` numbers them), and how many numbers there are.
    No sort: each column's values are ranked through a table as long as its largest value
    (degrees are positive and at most the GPUs), then the ranks combined."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64), 0
    mesh = rows[:, _MESH_COLS]
    low, high = mesh.min(axis=0), mesh.max(axis=0)
    ranks, size = [], 1
    for c, (lo, hi) in enumerate(zip(low.tolist(), high.tolist(), strict=True)):
        if lo < 0 or hi > 1 << 24:
            break
        present = np.zeros(hi + 1, dtype=bool)
        present[mesh[:, c]] = True
        rank = np.cumsum(present) - 1
        ranks.append((rank[mesh[:, c]], int(rank[-1]) + 1))
        size *= ranks[-1][1]
    if len(ranks) < len(_MESH_COLS) or size > max(4 * len(rows), 1 << 16):
        _, inv = np.unique(_mesh_key(rows), return_inverse=True)  # too sparse for a table
        return inv.ravel(), int(inv.max()) + 1
    key = np.zeros(len(rows), dtype=np.int64)
    for rank, n in ranks:
        key = key * n + rank
    present = np.zeros(size, dtype=bool)
    present[key] = True
    ids = np.cumsum(present) - 1
    return ids[key], int(ids[-1]) + 1


def _group_min(ids: np.ndarray, count: int, x: np.ndarray) -> np.ndarray:
    """The least ``x`` of each group ``0 .. count - 1`` (``ids``: each element's group; NaN
    where a group holds one; infinite where it holds nothing)."""
    if count <= 1 << 15 and len(ids) > 4 * count:
        # Sorted by group in linear time (numpy's stable sort of 16-bit keys is a radix
        # sort), then one reduction per run: far faster than np.minimum.at.
        o = np.argsort(ids.astype(np.int16), kind="stable")
        g = ids[o]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        low = np.full(count, np.inf)
        low[g[starts]] = np.minimum.reduceat(x[o], starts)
        return low
    low = np.full(count, np.inf)
    np.minimum.at(low, ids, x)
    return low


def _group_firsts(ids: np.ndarray, count: int, rows: np.ndarray,
                  keys: Sequence[np.ndarray], at: np.ndarray | None = None) -> np.ndarray:
    """``_firsts`` of groups already numbered: ``ids`` each row's group (0 to ``count - 1``),
    ``at`` the rows of ``rows`` that ``ids`` and ``keys`` describe (default: all)."""
    cand = np.arange(len(ids))
    for k in keys:
        kc = np.asarray(k, dtype=float)[cand]
        low = _group_min(ids[cand], count, kc)
        cand = cand[kc == low[ids[cand]]]
    sub = rows[cand if at is None else at[cand]]
    o = cand[np.lexsort((*sub.T[::-1], ids[cand]))]
    return o[np.r_[True, ids[o][1:] != ids[o][:-1]]]


class _State:
    """The running top-k and per-mesh outcomes while spaces are searched; with ``by``
    (columns of ``COLUMNS``), also the fastest configuration per value of each, and the one
    with the least memory. ``values``: column -> every value code the spaces hold."""

    def __init__(self, top_k: int, capacity: float, host_capacity: float,
                 by: dict[str, np.ndarray] | None = None) -> None:
        self.k = top_k
        self.capacity = capacity
        self.host_capacity = host_capacity
        self.top: list[tuple[tuple[float, ...], Found]] = []
        self.meshes: dict[tuple[str, int, int, int, int, int, int], MeshOutcome] = {}
        self.counts = {"space": 0, "evaluated": 0, "fit": 0, "did_not_fit": 0, "bounded": 0}
        self.least: tuple[tuple[float, ...], Found] | None = None
        self.values = {COLUMNS.index(c): np.unique(v) for c, v in (by or {}).items()}
        self.best_by: dict[int, dict[int, tuple[tuple[float, ...], Found]]] = \
            {c: {} for c in self.values}
        self.least_by: dict[int, dict[int, tuple[tuple[float, ...], Found]]] = \
            {c: {} for c in self.values}

    def bound(self) -> float:
        """The k-th best step time (s) found so far (infinite before k are found)."""
        return self.top[-1][0][0] if len(self.top) >= self.k else np.inf

    def _slot(self, col: int) -> np.ndarray:
        """Per value of column ``col`` (``self.values``): the step time (s) of the fastest
        configuration found with it, infinite where none was found yet."""
        best = self.best_by[col]
        return np.array([best[int(v)][0][0] if int(v) in best else np.inf
                         for v in self.values[col]])

    def loosest(self) -> float:
        """A step time (s) beyond which a configuration improves nothing the search keeps:
        not the top k, nor the fastest of any value ``by`` tracks."""
        out = self.bound()
        for col in self.values:
            out = max(out, float(self._slot(col).max(initial=-np.inf)))
        return out

    def bounds(self, rows: np.ndarray, known: Sequence[str] = COLUMNS) -> np.ndarray:
        """Per row of ``COLUMNS``: the step time (s) beyond which it improves nothing kept,
        reading only the ``known`` columns (for the others, any value the spaces hold)."""
        out = np.full(len(rows), self.bound())
        for col in self.values:
            slot = self._slot(col)
            if COLUMNS[col] in known:
                vals = self.values[col]
                at = np.minimum(np.searchsorted(vals, rows[:, col]), len(vals) - 1)
                out = np.maximum(out, np.where(vals[at] == rows[:, col], slot[at], np.inf))
            else:
                out = np.maximum(out, slot.max(initial=-np.inf))
        return out

    def mesh(self, fw: str, row: np.ndarray) -> MeshOutcome:
        dp, tp, pp, cp, ep, etp = (int(row[c]) for c in _MESH_COLS)
        return self.meshes.setdefault((fw, dp, tp, pp, cp, ep, etp), MeshOutcome())

    def floors(self, fw: str, rows: np.ndarray, floor: np.ndarray) -> None:
        """Record configurations skipped by their bound (one row per mesh is enough)."""
        if not len(rows):
            return
        for i in _first_per_mesh(rows, np.argsort(floor, kind="stable")):
            out = self.mesh(fw, rows[i])
            out.floor = min(out.floor, float(floor[i]))

    def add(self, fw: str, fw_rank: int, rows: np.ndarray, res: CostTable) -> None:
        """Fold evaluated rows into the state."""
        if not len(rows):
            return
        step, peak, stage = res.step_time, res.peak_memory, res.peak_stage
        timed = np.isfinite(step)
        fit = self._count(fw, rows, res, timed)

        def found(i: int) -> Found:
            return Found(framework=fw, row=tuple(int(x) for x in rows[i]),
                         step_time=float(step[i]), peak_memory=float(peak[i]),
                         peak_stage=int(stage[i]),
                         terms={t: float(res.terms[t][i]) for t in TIME_TERMS})

        def key(i: int) -> tuple[float, ...]:
            return (float(step[i]), float(peak[i]), fw_rank, *(float(x) for x in rows[i]))

        # The rows that fit in the search's order: step time, peak memory, columns ascending.
        fits = np.flatnonzero(fit)
        fits = fits[_order(rows[fits], step[fits], peak[fits])]
        self._merge_top(fits, step, peak, key, found)
        self._by_value(self.best_by, rows, fits, key, found)
        self._mesh_best(fw, fw_rank, rows, fits, key, found)
        self._mesh_nearest(fw, rows, np.flatnonzero(~timed), peak, found)
        self._least(fw_rank, rows, peak, res.cpu_memory, found)

    def _count(self, fw: str, rows: np.ndarray, res: CostTable, timed: np.ndarray
               ) -> np.ndarray:
        """Count the rows evaluated, fitting, not fitting and bounded (a lower bound on their
        time already exceeded the k-th best, so they were not played out; their meshes'
        floors are recorded); returns which rows fit and were timed exactly."""
        bounded = timed & ~res.exact
        self.counts["bounded"] += int(bounded.sum())
        self.floors(fw, rows[bounded], res.step_time[bounded])
        fit = timed & res.exact
        self.counts["evaluated"] += len(rows) - int(bounded.sum())
        self.counts["fit"] += int(fit.sum())
        self.counts["did_not_fit"] += int((~timed).sum())
        return fit

    def _merge_top(self, fits: np.ndarray, step: np.ndarray, peak: np.ndarray,
                   key: Callable[[int], tuple[float, ...]],
                   found: Callable[[int], Found]) -> None:
        """Merge the fitting rows ``fits`` (in the search's order) into the top k. Candidates
        with the step time (s) and peak memory (bytes) of a better-ordered one are the same
        plan for the user (e.g. selective recompute with fused attention recomputes
        nothing): only the first is kept."""
        cand = []
        seen = set()
        for i in fits:
            tag = (float(step[i]), float(peak[i]))
            if tag not in seen:
                seen.add(tag)
                cand.append((key(i), found(i)))
                if len(cand) == self.k:
                    break
        merged: list[tuple[tuple[float, ...], Found]] = []
        for item in sorted(self.top + cand, key=lambda x: x[0]):
            if not merged or item[0][:2] != merged[-1][0][:2]:
                merged.append(item)
        self.top = merged[: self.k]

    def _mesh_best(self, fw: str, fw_rank: int, rows: np.ndarray, fits: np.ndarray,
                   key: Callable[[int], tuple[float, ...]],
                   found: Callable[[int], Found]) -> None:
        """Per mesh, the fastest fitting row (``fits`` in the search's order)."""
        if not len(fits):
            return
        for i in _first_per_mesh(rows, fits):
            out = self.mesh(fw, rows[i])
            cur = out.best
            if cur is None or key(i) < (cur.step_time, cur.peak_memory, fw_rank, *cur.row):
                out.best = found(i)

    def _mesh_nearest(self, fw: str, rows: np.ndarray, missed: np.ndarray, peak: np.ndarray,
                      found: Callable[[int], Found]) -> None:
        """Per mesh, the row that missed the memory by the least (then columns ascending)
        among ``missed``, the rows that did not fit."""
        if not len(missed):
            return
        ids, count = _mesh_ids(rows)
        for i in missed[_group_firsts(ids[missed], count, rows, (peak[missed],), missed)]:
            out = self.mesh(fw, rows[i])
            cur = out.nearest
            if cur is None or (float(peak[i]), *rows[i]) < (cur.peak_memory, *cur.row):
                out.nearest = found(i)

    def _least(self, fw_rank: int, rows: np.ndarray, peak: np.ndarray, cpu: np.ndarray,
               found: Callable[[int], Found]) -> None:
        """The least GPU memory (bytes) among rows whose offloaded part (``cpu`` bytes) fits
        the host (else any row)."""
        host_ok = cpu <= self.host_capacity

        def lkey(i: int) -> tuple[float, ...]:
            return (float(not host_ok[i]), float(peak[i]), fw_rank, *(float(x) for x in rows[i]))

        low = int(_firsts(np.zeros(len(rows), dtype=np.int64), rows, ~host_ok, peak)[0])
        if self.least is None or lkey(low) < self.least[0]:
            self.least = (lkey(low), found(low))
        for col, slot in self.least_by.items():
            self._keep(slot, rows, _firsts(rows[:, col], rows, ~host_ok, peak), col, lkey,
                       found)

    def _by_value(self, slots: dict[int, dict[int, tuple[tuple[float, ...], Found]]],
                  rows: np.ndarray, order: np.ndarray, key: Callable[[int], tuple[float, ...]],
                  found: Callable[[int], Found]) -> None:
        """Per tracked column and value: keep the first row of ``order`` with that value
        where its ``key`` is below the one kept."""
        for col, slot in slots.items():
            self._keep(slot, rows, _first_per(rows[order, col], order), col, key, found)

    @staticmethod
    def _keep(slot: dict[int, tuple[tuple[float, ...], Found]], rows: np.ndarray,
              firsts: np.ndarray, col: int, key: Callable[[int], tuple[float, ...]],
              found: Callable[[int], Found]) -> None:
        """Keep each row of ``firsts`` (one per value of column ``col``) in ``slot`` where its
        ``key`` is below the one kept for its value."""
        for i in firsts.tolist():
            v = int(rows[i, col])
            cur = slot.get(v)
            if cur is None or key(i) < cur[0]:
                slot[v] = (key(i), found(i))


def _timed(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, rows: np.ndarray,
           state: _State, fw: str, rank: int) -> None:
    """Evaluate ``rows`` into ``state``: memory and lower bounds on the step time first; then
    the pipeline schedules played out in order of the bound while the bound does not exceed
    the k-th best (each played-out row can only lower it)."""
    vee = is_v(rows[:, _SCHEDULE_COL])
    if vee.any() and not vee.all():
        # V-shaped rows need a column per stage (``space.arrays``): apart, the others keep
        # the four representative columns.
        for part in (rows[~vee], rows[vee]):
            _timed(model, cluster, job, part, state, fw, rank)
        return
    res = evaluate(model, cluster, job, arrays(model, rows), capacity=state.capacity,
                   host_capacity=state.host_capacity, exact_below=-np.inf)
    lazy = np.isfinite(res.step_time) & ~res.exact
    state.add(fw, rank, rows, res)  # the lazy rows count as bounded until played out
    cand = np.flatnonzero(lazy)
    cand = cand[np.argsort(res.step_time[cand], kind="stable")]
    pos, batch = 0, FIRST_BATCH
    while pos < len(cand) and res.step_time[cand[pos]] <= state.loosest():
        take = cand[pos:pos + batch]
        take = take[res.step_time[take] <= state.bounds(rows[take])]
        state.counts["bounded"] -= len(take)
        state.add(fw, rank, rows[take], evaluate(model, cluster, job, arrays(model, rows[take])))
        pos += batch
        batch = min(2 * batch, MAX_BATCH)


def _search_one(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job, space: Space, rank: int,
                state: _State, tick: Callable[[float], None]) -> None:
    fw = space.framework
    n = len(space.cores)
    nz, nr = space.sizes
    state.counts["space"] += int((nz * nr).sum())
    if not n:
        return
    base = space.core_rows(np.arange(n))
    f0 = evaluate(model, cluster, job, arrays(model, base), exact_below=-np.inf).floor
    order = np.lexsort((np.arange(n), f0))
    pos, batch = 0, FIRST_BATCH
    while pos < n and f0[order[pos]] <= state.loosest():
        chunk = order[pos:pos + batch]
        # The cores of this batch whose floor already exceeds their bound are bounded too.
        above = f0[chunk] > state.bounds(base[chunk], CORE)
        over = chunk[above]
        state.counts["bounded"] += int((nz[over] * nr[over]).sum())
        state.floors(fw, base[over], f0[over])
        chunk = chunk[~above]
        pos += batch
        batch = min(2 * batch, MAX_BATCH)
        # Level 1: (core, recompute) without ZeRO; and (core, sharding) without recompute,
        # whose pipeline time (the step without what follows the last backward) bounds every
        # recompute option of that sharding.
        core = np.repeat(chunk, nr[chunk])
        rec = positions(nr[chunk])
        bare = space.core_rows(core, rec)
        f1 = evaluate(model, cluster, job, arrays(model, bare), exact_below=-np.inf).floor
        keep = f1 <= state.bounds(bare, CORE + RECOMPUTATION)
        state.counts["bounded"] += int(nz[core[~keep]].sum())
        state.floors(fw, bare[~keep], f1[~keep])
        if not keep.any():
            continue
        unrec = space.expand(chunk, None)
        # (The pipelines' lower bounds: exact for equal stages, and enough for a bound.)
        res_z = evaluate(model, cluster, job, arrays(model, unrec), exact_below=-np.inf)
        pipe = res_z.step_time - sum(res_z.terms[t] for t in POST_TERMS)
        # Level 2: the pairs that survive both bounds, evaluated.
        rows = space.expand(core[keep], rec[keep])
        loc = np.empty(n, dtype=np.int64)
        loc[chunk] = np.cumsum(nz[chunk]) - nz[chunk]  # where each core's shardings start
        kept = core[keep]
        zpos = np.repeat(loc[kept], nz[kept]) + positions(nz[kept])
        ok = pipe[zpos] <= state.bounds(rows)
        state.counts["bounded"] += int((~ok).sum())
        state.floors(fw, rows[~ok], pipe[zpos][~ok])
        rows = rows[ok]
        if not len(rows):
            continue
        _timed(model, cluster, job, rows, state, fw, rank)
        tick(min(pos, n) / n)
    rest = order[pos:]
    rest = rest if pos < n else rest[:0]
    state.counts["bounded"] += int((nz[rest] * nr[rest]).sum())
    state.floors(fw, base[rest], f0[rest])


def search(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
           constraints: Constraints | None = None, top_k: int = 5,
           capacity: float | None = None,
           progress: Callable[[float], None] | None = None,
           by: Sequence[str] = ()) -> SearchResult:
    """The ``top_k`` fastest configurations that fit ``capacity`` bytes per GPU (default: the
    GPU's memory) and the node's host memory, over every trainer the constraints name
    (default: ``job.framework``); the default capacity keeps ``job.memory_reserve`` of the
    GPU free (``costmodel.formulas.estimate.plan_capacity``). ``progress`` is called with the
    fraction
    of the cores (ordered by bound) passed so far, from 0 to 1.

    ``by``: columns of ``COLUMNS``; for each value of each, the search also finds the fastest
    configuration that fits and the one with the least memory (``SearchResult.best_by``,
    ``least_by``), as one search per value with that value fixed would, in one pass: a
    configuration is pruned only when its bound exceeds the k-th best and the best found
    for every value it has."""
    cap = float(plan_capacity(cluster, job) if capacity is None else capacity)
    todo = spaces(model, cluster, job, constraints)
    for c in by:
        if c not in COLUMNS:
            raise ValueError(f"search(by=...): {c!r} is not a column; use {COLUMNS}")
    values = {c: np.concatenate([column_values(s, c) for _, s in todo]) for c in by}
    state = _State(max(1, top_k), cap, cluster.host_memory_bytes_per_gpu, values)
    rejected = {}
    jobs = {}
    for rank, (j, space) in enumerate(todo):
        def tick(frac: float, rank: int = rank) -> None:
            if progress is not None:
                progress((rank + frac) / len(todo))

        _search_one(model, cluster, j, space, rank, state, tick)
        tick(1.0)
        rejected[space.framework] = space.rejected
        jobs[space.framework] = j
    return SearchResult(top=[f for _, f in state.top], meshes=state.meshes,
                        counts=state.counts, rejected=rejected,
                        least_memory=state.least[1] if state.least else None, jobs=jobs,
                        model=model,
                        best_by={COLUMNS[c]: {v: f for v, (_, f) in d.items()}
                                 for c, d in state.best_by.items()},
                        least_by={COLUMNS[c]: {v: f for v, (_, f) in d.items()}
                                  for c, d in state.least_by.items()})


def nodes_of(gpus: int, gpus_per_node: int) -> str:
    """A GPU count in the cluster's own units: ``16 nodes of 8 GPUs (128 GPUs)``."""
    nodes = gpus // gpus_per_node
    return (f"{nodes} node{'s' if nodes != 1 else ''} of {gpus_per_node} "
            f"GPU{'s' if gpus_per_node != 1 else ''} ({gpus} GPUs)")


def least_gpus(model: ModelSpec | LayerCosts, cluster: Cluster, job: Job,
               constraints: Constraints | None = None, doublings: int = 6) -> int | None:
    """The fewest GPUs, doubling the nodes up to ``doublings`` times (rounded up to whole
    scale-up domains past one), on which some configuration with micro-batch 1 fits in
    memory; None if none does."""
    cons = (constraints or Constraints()).merge(Constraints(fixed={"micro_batch_size": 1}))
    for d in range(1, doublings + 1):
        bigger = replace(cluster, num_nodes=cluster.whole_domains(cluster.num_nodes * 2**d))
        res = search(model, bigger, job, cons, top_k=1)
        if res.top:
            return bigger.num_gpus
    return None
