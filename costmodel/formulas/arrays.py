"""A table of parallel configurations as numpy columns (``ConfigArrays``), the codes its
columns use for schedules, recompute and offload, and the stage-major helpers every table
of the cost model shares (memory, step time, pipeline).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache
from typing import Any, Protocol

import numpy as np

from costmodel.config import V_SCHEDULES, ParallelConfig, accounted_split
from costmodel.errors import SpecError
from costmodel.formulas.vschedules import DualPipeCosting, v_rank_layers, v_split


class Layers(Protocol):
    """What the stage columns read of a model (a ``ModelSpec`` or ``LayerCosts``): its
    layers, and the kind of each in order (0, 1, ...: a preset's dense and MoE layers, a
    traced graph's distinct blocks)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def layer_kinds(self) -> tuple[int, ...]: ...

__all__ = ["OFFLOAD_CODES", "RECOMPUTE_CODES", "SCHEDULE_CODES", "ChunkPatterns", "ConfigArrays",
           "Distinct", "Stages", "accounted_columns", "distinct_rows", "divisors",
           "even_split", "first_argmax", "input_split", "interleaved_split", "ordered_sum"]

SCHEDULE_CODES = {"1f1b": 0, "interleaved-1f1b": 1, "gpipe": 2, "zero-bubble": 3, "zbv": 4,
                  "dualpipev": 5, "combined-1f1b": 6, "dualpipe": 7}
#: The codes of the V-shaped schedules (``V_SCHEDULES``).
V_CODES = tuple(SCHEDULE_CODES[s] for s in V_SCHEDULES)


def is_v(schedule: np.ndarray) -> np.ndarray:
    """Whether each row's schedule code is V-shaped (``V_CODES``)."""
    return np.isin(schedule, V_CODES)
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
OFFLOAD_CODES = {"none": 0, "optimizer": 1, "optimizer+params": 2}


@dataclass(frozen=True)
class ChunkPatterns:
    """The explicit chunk splits of a table's interleaved rows (``ParallelConfig.
    chunk_layers``), each distinct one once: ``layers`` ``[patterns, width]`` (virtual order,
    0 padding beyond ``count``), ``pp`` and ``count`` (chunks) ``[patterns]``, and ``of``
    ``[rows]`` each row's pattern (-1: an even split, or no interleaving). A search's table
    holds a handful of patterns for hundreds of thousands of rows."""

    layers: np.ndarray
    pp: np.ndarray
    count: np.ndarray
    of: np.ndarray
    vshape: np.ndarray | None = None  # [patterns] bool: chunks placed as a V (V_SCHEDULES)

    @staticmethod
    def of_splits(splits: Sequence[tuple[int, tuple[int, ...] | None]],
                  vshape: Sequence[bool] | None = None) -> ChunkPatterns | None:
        """Patterns of each row's (pp, chunks or None), V-shaped where ``vshape`` says so;
        None when no row has chunks."""
        ids: dict[tuple[int, tuple[int, ...], bool], int] = {}
        of = np.full(len(splits), -1, dtype=np.int64)
        for r, (p, chunks) in enumerate(splits):
            if chunks:
                v = bool(vshape[r]) if vshape is not None else False
                of[r] = ids.setdefault((p, chunks, v), len(ids))
        if not ids:
            return None
        width = max(len(c) for _, c, _ in ids)
        layers = np.zeros((len(ids), width), dtype=np.int64)
        pp = np.zeros(len(ids), dtype=np.int64)
        count = np.zeros(len(ids), dtype=np.int64)
        vs = np.zeros(len(ids), dtype=bool)
        for (p, chunks, v), i in ids.items():
            layers[i, :len(chunks)] = chunks
            pp[i], count[i], vs[i] = p, len(chunks), v
        return ChunkPatterns(layers=layers, pp=pp, count=count, of=of,
                             vshape=vs if vs.any() else None)

    def rank_chunks(self, u: int) -> np.ndarray:
        """Pattern ``u``'s chunk indices per rank, ``[pp, chunks per rank]`` (interleaved:
        ``r, r + p, ...``; V-shaped: ``r`` and ``2p - 1 - r``)."""
        p, n = int(self.pp[u]), int(self.count[u])
        if self.vshape is not None and self.vshape[u]:
            r = np.arange(p)
            return np.stack([r, 2 * p - 1 - r], axis=1)
        return np.arange(n).reshape(n // p, p).T

    def take(self, rows: np.ndarray) -> ChunkPatterns:
        """The patterns of the sub-table of ``rows``."""
        return replace(self, of=np.take(self.of, rows))


@dataclass(frozen=True)
class ConfigArrays:
    """A table of parallel configurations as columns (one entry per row).

    Stage columns have shape ``[rows, W]``: each column is one pipeline stage (``stage_index``),
    standing for ``stage_count`` stages exactly like it (0 marks padding beyond a row's
    stages). ``stage_layers`` counts the transformer layers a rank of that stage holds (all of
    its virtual chunks together) and ``stage_start`` the layers before it.

    With every stage its own column (``all_stages=True``, what ``estimate()`` reports per
    stage) ``W`` is the largest ``pp``. A uniform split needs at most four columns: the first
    stage, the first middle stage with the base number of layers, the first with one more
    (the remainder goes to the last stages), and the last stage. Middle stages of one class
    hold the same layers and parameters and take the same time, and the first of them holds
    the most micro-batches in flight under every schedule, so the peak memory, the slowest
    stage and the sums over stages come out exactly the same, with ``W <= 4``.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    shard: np.ndarray
    sp: np.ndarray
    mbs: np.ndarray
    schedule: np.ndarray
    v: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray  # 0 means every layer of the chunk
    offload: np.ndarray
    stage_layers: np.ndarray
    stage_index: np.ndarray
    stage_count: np.ndarray
    stage_start: np.ndarray
    stage_recompute: np.ndarray | None = None  # layers fully recomputed per stage; -1: the row's
    chunks: ChunkPatterns | None = None  # explicit interleaved chunks, by pattern
    etp: np.ndarray | None = None  # the experts' TP degree (ParallelConfig.etp); None: tp
    # Rows of DeepSeek's DualPipe, costed as DualPipeV (vschedules.DualPipeCosting): their
    # overlapped pairs hide the expert all-to-alls whatever the trainer and recompute, and
    # rank 0 holds the embedding once for both its stages; None: no row.
    dualpipe: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Number of configurations in the table."""
        return int(self.dp.shape[0])

    @cached_property
    def stage_major(self) -> Stages:
        """The stage columns transposed to ``[W, rows]`` (contiguous), made once per table
        (``memory_table`` and ``time_table`` both read them)."""
        def t(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(x.T)
        rec = self.stage_recompute
        return Stages(index=t(self.stage_index), count=t(self.stage_count),
                      layers=t(self.stage_layers), start=t(self.stage_start),
                      recompute=None if rec is None else t(rec))

    @cached_property
    def head_rank(self) -> np.ndarray:
        """The pipeline rank holding the last virtual stage (the output layer) per row:
        ``pp - 1``, or 0 where the chunks are placed as a V (``V_SCHEDULES``)."""
        return np.where(is_v(self.schedule), 0, self.pp - 1)

    @cached_property
    def expert_tp(self) -> np.ndarray:
        """The experts' tensor-parallel degree per row (``ParallelConfig.expert_tp``)."""
        return self.tp if self.etp is None else self.etp

    @cached_property
    def expert_share(self) -> np.ndarray:
        """How many more ways the routed experts' parameters split than the rest of a layer
        (``ep * etp / tp``): their shard per GPU is the tensor-parallel share over this, and
        their data-parallel group ``dp * cp`` over it (``ep`` without folding)."""
        return self.ep * self.expert_tp / self.tp

    @cached_property
    def kernel_groups(self) -> Distinct:
        """The rows grouped by all that one layer's kernels and saved activations per
        micro-batch depend on: ``tp, cp, mbs, sp, ep``, and whether ``torch.autocast`` may
        apply (ZeRO 0 and ``pp`` 1, ``costmodel.formulas.compute.autocast_rows``); their TP and CP
        collectives too. A search's chunk of tens of thousands of rows has a hundred or two
        such groups: ``LayerCosts`` and ``costmodel.formulas.stepterms`` compute each once."""
        return distinct_rows(self.tp, self.cp, self.mbs, self.sp, self.ep, self.expert_tp,
                             (self.zero == 0) & (self.pp == 1))

    @cached_property
    def mesh_groups(self) -> Distinct:
        """The rows grouped by their device mesh: ``dp, tp, cp, ep`` and the shard degree,
        all that the ranks and stride of a communicator a row forms depend on
        (``costmodel.formulas.comm.Topology.rows``)."""
        return distinct_rows(self.dp, self.tp, self.cp, self.ep, self.expert_tp, self.shard)

    @cached_property
    def kernel_rows(self) -> ConfigArrays:
        """The table of one row per ``kernel_groups`` group (its ``first``)."""
        return self.take(self.kernel_groups.first)

    def take(self, rows: np.ndarray, width: int | None = None) -> ConfigArrays:
        """The sub-table of ``rows``, its stage columns cut to the first ``width`` (which
        must hold every existing stage column of those rows)."""
        # np.take along the first axis: numpy's fancy indexing of the (rows, stages) columns
        # copies element by element, an order of magnitude slower.
        cols: dict[str, Any] = {f.name: np.take(getattr(self, f.name), rows, axis=0)
                                for f in fields(self)
                                if getattr(self, f.name) is not None and f.name != "chunks"}
        if self.chunks is not None:
            cols["chunks"] = self.chunks.take(rows)
        if width is not None:
            for key in ("stage_layers", "stage_index", "stage_count", "stage_start",
                        "stage_recompute"):
                if key in cols:
                    cols[key] = cols[key][:, :width]
        return ConfigArrays(**cols)

    @staticmethod
    def uniform_stages(num_layers: int, pp: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(stage_index, stage_count, stage_layers, stage_start), ``[rows, 4]``, of the even
        split of ``num_layers`` over each row's ``pp``: ``num_layers // pp`` each, the
        remainder one layer each to the last stages (the first stage already holds the
        embedding and, under 1F1B, the most micro-batches in flight)."""
        p = np.asarray(pp, dtype=np.int64)[:, None]
        base, rem = num_layers // p, num_layers % p
        cut = p - rem  # first stage with base + 1 layers
        # Candidate classes: first; middle with base layers; middle with base + 1; last.
        lo = np.concatenate([np.zeros_like(p), np.ones_like(p), np.maximum(cut, 1), p - 1],
                            axis=1)
        hi = np.concatenate([np.ones_like(p), np.minimum(cut, p - 1), p - 1, p], axis=1)
        lo[:, 3] = np.maximum(lo[:, 3], 1)  # the last stage is the first stage when p == 1
        count = np.maximum(hi - lo, 0)
        # Existing classes first, padding last, so that a table can be trimmed to its widest row.
        order = np.argsort(count == 0, axis=1, kind="stable")
        count = np.take_along_axis(count, order, axis=1)
        index = np.where(count > 0, np.take_along_axis(lo, order, axis=1), 0)
        layers = np.where(count > 0, base + (index >= cut), 0)
        start = index * base + np.maximum(index - cut, 0)
        return index, count, layers, start

    @staticmethod
    def every_stage(num_layers: int, pp: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``uniform_stages``' columns with every stage its own, ``[rows, max(pp)]``
        (padding beyond a row's stages has count 0): what a model whose layers are not
        all of one kind needs (``classes_exact``)."""
        p = np.asarray(pp, dtype=np.int64)[:, None]
        width = int(p.max()) if p.size else 1
        index = np.broadcast_to(np.arange(width), (p.shape[0], width)).copy()
        count = (index < p).astype(np.int64)
        base, rem = num_layers // p, num_layers % p
        cut = p - rem
        layers = np.where(count > 0, base + (index >= cut), 0)
        return index, count, layers, np.cumsum(layers, axis=1) - layers

    @staticmethod
    def classes_exact(model: Layers, pp: np.ndarray, v: np.ndarray) -> bool:
        """Whether ``uniform_stages`` is exact for these rows: it is when every layer after
        the first stage's first chunk is of one kind (a MoE model's leading dense layers
        within it); otherwise middle stages of one class may differ."""
        kinds = model.layer_kinds
        tail = max(len(kinds) - 1, 0)  # layers from ``tail`` on are of one kind
        while tail > 0 and kinds[tail - 1] == kinds[-1]:
            tail -= 1
        chunk = model.num_layers // (np.asarray(pp) * np.asarray(v))
        return bool(np.all(tail <= chunk))

    @classmethod
    def from_configs(cls, model: Layers, configs: Sequence[ParallelConfig],
                     all_stages: bool = True) -> ConfigArrays:
        """Columns for ``configs``; stage layers are split evenly unless a config fixes them.

        ``all_stages``: one column per pipeline stage; otherwise uniform splits use the four
        representative columns of ``uniform_stages``.
        """
        n = len(configs)
        pps = np.array([c.pp for c in configs], dtype=np.int64)
        vs = np.array([c.virtual_pipeline_stages for c in configs], dtype=np.int64)
        explicit = any(c.stage_layers is not None for c in configs)
        vshaped = [c.pipeline_schedule in V_SCHEDULES for c in configs]
        per_stage_rec = None
        if all_stages or explicit or any(vshaped) or not cls.classes_exact(model, pps, vs):
            index, count, layers, start = cls.every_stage(model.num_layers, pps)
            if explicit or any(vshaped):
                for r, c in enumerate(configs):
                    layers[r, : c.pp] = c.rank_layers or (
                        v_rank_layers(v_split(model.num_layers, c.pp)) if vshaped[r]
                        else even_split(model.num_layers, c.pp))
                start = np.cumsum(layers, axis=1) - layers

            width = index.shape[1]
            if any(c.stage_recompute_layers is not None for c in configs):
                per_stage_rec = np.full((n, width), -1, dtype=np.int64)
                for r, c in enumerate(configs):
                    if c.stage_recompute_layers is not None:
                        per_stage_rec[r, : c.pp] = c.stage_recompute_layers
        else:
            index, count, layers, start = cls.uniform_stages(model.num_layers, pps)

        def col(values: list[int | float]) -> np.ndarray:
            return np.asarray(values, dtype=np.int64)

        return cls(
            dp=col([c.dp for c in configs]),
            tp=col([c.tp for c in configs]),
            pp=pps,
            cp=col([c.cp for c in configs]),
            ep=col([c.ep for c in configs]),
            etp=col([c.expert_tp for c in configs])
            if any(c.etp is not None for c in configs) else None,
            dualpipe=np.array([isinstance(c, DualPipeCosting) for c in configs])
            if any(isinstance(c, DualPipeCosting) for c in configs) else None,
            zero=col([c.zero_stage for c in configs]),
            shard=col([c.shard_degree for c in configs]),
            sp=col([int(c.sequence_parallel) for c in configs]),
            mbs=col([c.micro_batch_size for c in configs]),
            schedule=col([SCHEDULE_CODES[str(c.pipeline_schedule)] for c in configs]),
            v=col([c.virtual_pipeline_stages for c in configs]),
            recompute=col([RECOMPUTE_CODES[c.recompute] for c in configs]),
            recompute_layers=col([c.recompute_num_layers or 0 for c in configs]),
            offload=col([OFFLOAD_CODES[c.offload] for c in configs]),
            stage_layers=layers,
            stage_index=index,
            stage_count=count,
            stage_start=start,
            stage_recompute=per_stage_rec,
            chunks=ChunkPatterns.of_splits(
                [(c.pp, c.chunk_layers or (v_split(model.num_layers, c.pp) if vsh else None))
                 for c, vsh in zip(configs, vshaped, strict=True)], vshaped),
        )


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order: every degree a dimension of ``n`` GPUs (or a
    batch of ``n``) can take. The one enumeration of degrees the searches use. None for
    ``n < 1``; a new list each call (from ``_divisors``' cache)."""
    return list(_divisors(operator.index(n)))


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` sorted, from its prime factors (trial division to sqrt(n)):
    the products of every power of each prime up to its multiplicity."""
    out = [1] if n >= 1 else []
    rest, p = n, 2
    while p * p <= rest:
        base, power = out, 1
        while rest % p == 0:
            rest //= p
            power *= p
            out = out + [d * power for d in base]
        p += 1 + (p > 2)
    if rest > 1:
        out += [d * rest for d in out]
    return tuple(sorted(out))


def even_split(num_layers: int, pp: int) -> list[int]:
    """The even split of ``num_layers`` over ``pp`` stages, remainder to the last stages."""
    base, rem = divmod(num_layers, pp)
    return [base + (i >= pp - rem) for i in range(pp)]


@lru_cache(maxsize=4096)
def interleaved_split(num_layers: int, pp: int, v: int, mtp: int = 0
                      ) -> tuple[int, ...] | None:
    """Layers per chunk (virtual order) an interleaved pipeline whose chunks do not split
    the layers evenly runs: Megatron-LM's accounted split (``costmodel.config.
    accounted_split``: the embedding, the loss and ``mtp`` multi-token prediction modules
    counted as layers; None where that does not divide either); None for an even split or
    no interleaving."""
    if v == 1 or num_layers % (pp * v) == 0:
        return None
    return accounted_split(num_layers, pp, v, mtp=mtp)


def accounted_columns(num_layers: int, mtp: int, pp: np.ndarray, v: np.ndarray,
                      index: np.ndarray, layers: np.ndarray, start: np.ndarray,
                      schedule: np.ndarray | None = None) -> ChunkPatterns | None:
    """``ConfigArrays.chunks`` of the rows of a table whose interleaving splits the layers
    unevenly (``interleaved_split``) or whose chunks are placed as a V (``schedule`` one of
    ``V_SCHEDULES``: torchtitan's split, ``v_split``), with their stage columns' layers and
    starts set to its ranks' (in place); None when no row does."""
    vshaped = np.zeros(len(pp), dtype=bool) if schedule is None else is_v(schedule)
    uneven = ((v > 1) & (num_layers % np.maximum(pp * v, 1) != 0)) | vshaped
    if not uneven.any():
        return None
    rows = np.flatnonzero(uneven)
    keys = pp[rows] * 8192 + v[rows] * 2 + vshaped[rows]
    pairs, pid = np.unique(keys, return_inverse=True)
    splits: list[tuple[int, tuple[int, ...] | None]] = []
    shapes = []
    ranks = np.zeros((len(pairs), int(pp[rows].max())), dtype=np.int64)
    for i, key in enumerate(int(k) for k in pairs):
        p, rest = divmod(key, 8192)
        vv, vsh = divmod(rest, 2)
        if vsh:
            split: tuple[int, ...] | None = v_split(num_layers, p)
            assert split is not None
            ranks[i, :p] = v_rank_layers(split)
        else:
            split = interleaved_split(num_layers, p, vv, mtp)
            if split is None:
                raise SpecError(f"pp={p} x virtual_pipeline_stages={vv} splits neither the "
                                f"{num_layers} layers nor them with the embedding and loss "
                                f"evenly")
            ranks[i, :p] = [sum(split[r::p]) for r in range(p)]
        splits.append((p, split))
        shapes.append(bool(vsh))
    starts = np.cumsum(ranks, axis=1) - ranks
    at = np.clip(index[rows], 0, ranks.shape[1] - 1)
    layers[rows] = np.where(layers[rows] > 0, ranks[pid[:, None], at], 0)
    start[rows] = starts[pid[:, None], at]
    of = np.full(len(pp), -1, dtype=np.int64)
    of[rows] = pid
    table = ChunkPatterns.of_splits(splits, shapes)
    assert table is not None
    return replace(table, of=of)


def input_split(num_layers: int, pp: int, first: int) -> list[int] | None:
    """The split a pipeline of a traced graph whose first stage must hold ``first`` layers
    (``LayerCosts.first_stage_layers``) runs by default: ``None`` where the even split
    already gives it them, else ``first`` layers then the rest split evenly."""
    if pp < 2 or num_layers // pp >= first or num_layers - first < pp - 1:
        return None
    return [first, *even_split(num_layers - first, pp - 1)]


@dataclass(frozen=True)
class Distinct:
    """Rows grouped by equal values of some columns (``distinct_rows``): ``first`` one row of
    each group, ``inverse`` each row's group (``x[inverse]`` spreads a per-group ``x`` over
    the rows)."""

    first: np.ndarray
    inverse: np.ndarray

    def spread(self, x: np.ndarray) -> np.ndarray:
        """A per-group array (groups on its last axis) per row."""
        return np.take(x, self.inverse, axis=-1)


#: Most combinations ``distinct_rows`` counts with ``np.bincount``; past it, it sorts.
_DENSE_CODES = 1 << 16
#: Columns whose values all lie below this are their own digits; others are ranked first.
_RAW_DIGITS = 64


def distinct_rows(*cols: np.ndarray) -> Distinct:
    """The rows grouped by equal values of the non-negative integer (or bool) ``cols``.

    The columns make one mixed-radix key per row, each column's digit its value (or, past
    ``_RAW_DIGITS``, the rank of its value among those present), and the
    keys present are the groups, in increasing order. Where the combinations would outnumber
    ``_DENSE_CODES``, the key so far is first replaced by its rank among the keys present (one
    sort of one integer column, far cheaper than sorting the rows: ``np.unique`` over rows
    compares them as byte strings), so the key stays below rows x digits."""
    n = len(cols[0])
    if not n:
        return Distinct(first=np.zeros(0, dtype=np.int64), inverse=np.zeros(0, dtype=np.int64))
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for c in cols:
        x = np.asarray(c)
        top = int(x.max()) + 1
        if x.dtype != bool and (top > _RAW_DIGITS or int(x.min()) < 0):
            x, top = _codes(x)
        if span > 1 and span * top > _DENSE_CODES:
            key, span = _codes(key)
        span *= top
        key = key * top + x
    inverse, k = _codes(key)
    first = np.empty(k, dtype=np.int64)
    first[inverse] = np.arange(n)
    return Distinct(first=first, inverse=inverse)


def _codes(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(the rank of each value of ``x`` among the distinct values present, how many are)."""
    if int(x.max()) >= _DENSE_CODES or int(x.min()) < 0:
        values, inverse = np.unique(x, return_inverse=True)
        return inverse.reshape(x.shape), len(values)
    present = np.bincount(x) > 0
    rank = np.cumsum(present) - 1
    return np.take(rank, x), int(rank[-1]) + 1


@dataclass(frozen=True)
class Stages:
    """``ConfigArrays``' stage columns stage-major, ``[W, rows]`` (``ConfigArrays.stage_major``)."""

    index: np.ndarray
    count: np.ndarray
    layers: np.ndarray
    start: np.ndarray
    recompute: np.ndarray | None


def stage_cumsum(x: np.ndarray) -> np.ndarray:
    """``np.cumsum(x, axis=0)`` of a stage-major array ``[W, rows]`` (the same additions in the
    same order), a row of stages at a time: numpy's cumsum along a short leading axis runs
    element by element, 10-20x slower than a few whole-row additions."""
    out = np.array(x, dtype=np.int64 if x.dtype == bool else x.dtype)
    for i in range(1, out.shape[0]):
        out[i] += out[i - 1]
    return out


def ordered_sum(xs: Iterable[np.ndarray], empty: np.ndarray | None = None) -> np.ndarray:
    """The sum of ``xs`` in order, the first as it is (``empty`` when there is none)."""
    out = None
    for x in xs:
        out = x if out is None else out + x
    if out is None:
        assert empty is not None, "a sum of no terms needs its empty value"
        return empty
    return out


def first_argmax(x: np.ndarray) -> np.ndarray:
    """``np.argmax(x, axis=0)`` of a stage-major array ``[P, rows]`` of finite values (the
    first of equal maxima), stage by stage: numpy's own reduces a short axis slowly."""
    best = x[0]
    idx = np.zeros(x.shape[1:], dtype=np.int64)
    for j in range(1, x.shape[0]):
        better = x[j] > best
        idx[better] = j
        best = np.maximum(best, x[j])
    return idx
