"""Pipeline schedules as their trainers run them: each rank's op order, the event simulation
of one step, and the same makespan for a whole table of configurations at once.

A schedule is a fixed order of ops per pipeline rank. Each op starts when its rank is free and
the op it depends on has ended (the previous virtual stage's forward of the micro-batch; the
next one's backward, or the last stage's own forward; the input gradient before the weight
gradient), so a step's pipeline time is the longest path through that dependency graph. The
orders:

- ``gpipe``: every forward, then every backward (Huang et al. 2019;
  torch.distributed.pipelining ``ScheduleGPipe``).
- ``1f1b``: rank ``r`` runs ``min(p - r - 1, m)`` warm-up forwards, then one forward and one
  backward in turn, then the remaining backwards (DAPPLE, Fan et al. 2021; Megatron-LM
  ``forward_backward_pipelining_without_interleaving``; torch ``Schedule1F1B``; DeepSpeed's
  ``TrainSchedule``).
- ``interleaved-1f1b``: rank ``r`` holds chunks ``r, r + p, ...`` (Narayanan et al. 2021,
  Sec. 2.2.2). Micro-batches advance in rounds of ``k = m // max(1, m // p)`` per chunk;
  rank ``r`` runs ``min((v - 1) k + 2 (p - r - 1), m v)`` warm-up forwards; the ``i``-th
  forward is of chunk ``(i // k) mod v`` and the ``i``-th backward of chunk
  ``v - 1 - (i // k) mod v`` (torch ``ScheduleInterleaved1F1B``, whose rounds generalise
  Megatron-LM's, which needs ``m`` a multiple of ``p`` and then has ``k = p``).
- ``zero-bubble``: ZB-H1 as torch ``ScheduleInterleavedZeroBubble`` runs it with one chunk per
  rank (Qi et al. 2024): the backward splits into the input gradient ``B`` and the weight
  gradient ``W`` (half the backward each); rank ``r`` runs ``min(p - r - 1, m)`` warm-up
  forwards, then ``F``, ``B`` pairs, each followed by a deferred ``W`` once ``r`` pairs have
  run, and the weight gradients left at the end.
- ``zbv`` and ``dualpipev``: two chunks per rank placed as a V, torch's
  ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` (``costmodel.formulas.vschedules``).
- ``combined-1f1b``: Megatron-LM's ``--overlap-moe-expert-parallel-comm``, the interleaved
  order (one chunk without a pipeline) with one warm-up forward more and each steady-state
  forward and backward merged into one overlapped pair (``_combined_order``).

An overlapped pair ``O`` (DualPipeV, combined 1F1B) waits for both ops it merges and takes
the rank's forward and backward less what overlapping them saves (``hidden``: one chunk's
share of it).

``makespan`` evaluates the longest path for many configurations of one shape (``p``, ``m``,
``v``, schedule) at once, level by level of the graph; long steady states are played out only
until they repeat (``_periodic``), GPipe is a closed form; ``costmodel.formulas.pipelinetable``
applies it to the rows of a table, beside a cheap lower bound that lets a search time only
the rows that can win. ``tests/test_pipeline.py`` checks ``makespan`` against the event
simulation on random uneven stages and the bound below it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from costmodel.config import SCHEDULES
from costmodel.errors import SpecError
from costmodel.formulas.vschedules import (
    V_SCHEDULES,
    check_v,
    dualpipe_orders,
    v_orders,
    virtual_stage,
)

__all__ = ["Op", "Timeline", "makespan", "rank_orders", "simulate"]


class Op(NamedTuple):
    """One operation on one pipeline rank: ``kind`` ``F`` (forward), ``B`` (backward; with
    zero bubble only the input gradient), ``I`` (the V schedules' input gradient alone),
    ``W`` (a deferred weight gradient) or ``O`` (DualPipeV's forward of ``micro_batch`` /
    ``chunk`` overlapped with the full backward of ``b_micro_batch`` / ``b_chunk``), of
    micro-batch ``micro_batch`` and model chunk ``chunk`` (0 unless interleaved or V-shaped),
    from ``start`` to ``end`` seconds."""

    stage: int
    kind: str
    micro_batch: int
    chunk: int
    start: float
    end: float
    b_micro_batch: int = -1
    b_chunk: int = -1


@dataclass(frozen=True)
class Timeline:
    """A simulated schedule: every op of one step's pipeline phase (the optimizer step and
    gradient synchronisation that follow are not drawn)."""

    schedule: str
    num_stages: int
    num_micro_batches: int
    virtual_stages: int
    ops: tuple[Op, ...]

    @property
    def makespan(self) -> float:
        """Seconds from the first forward to the last backward."""
        return max(o.end for o in self.ops) - min(o.start for o in self.ops)

    def busy(self, stage: int) -> float:
        """Seconds pipeline rank ``stage`` computes."""
        return sum(o.end - o.start for o in self.ops if o.stage == stage)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ranks' time within the makespan."""
        total = self.makespan * self.num_stages
        return 1.0 - sum(self.busy(s) for s in range(self.num_stages)) / total


def _check(p: int, m: int, v: int, schedule: str) -> None:
    if p < 1:
        raise SpecError("a pipeline needs at least one rank")
    if m < 1 or v < 1:
        raise SpecError("need at least one micro-batch and one chunk per rank")
    if schedule not in SCHEDULES:
        raise SpecError(f"unknown pipeline schedule {schedule!r}; one of "
                        f"{', '.join(SCHEDULES)}")
    if schedule in V_SCHEDULES:
        if v != 2:
            raise SpecError(f"the {schedule} schedule runs two chunks per rank "
                            f"(virtual_stages=2), got {v}")
        check_v(p, m, schedule)
    elif schedule == "dualpipe":
        if v != 1 or p % 2 or m % 2 or m < 2 * p:
            raise SpecError(f"dualpipe runs an even number of ranks (virtual_stages=1) and an "
                            f"even number of micro-batches, at least 2p; got p={p}, m={m}, "
                            f"virtual_stages={v}")
    elif schedule == "combined-1f1b":
        if (p > 1 and v < 2) or (p == 1 and v != 1):
            raise SpecError("combined-1f1b runs interleaved (virtual_stages >= 2) when p > 1, "
                            "one chunk without a pipeline")
    elif (v > 1) != (schedule == "interleaved-1f1b"):
        raise SpecError("virtual_stages > 1 goes with the interleaved-1f1b schedule only")


@lru_cache(maxsize=512)
def rank_orders(p: int, m: int, v: int, schedule: str, per_round: int | None = None
                ) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Each rank's ops in the order it runs them: ``(kind, micro_batch, chunk)`` (module
    docstring). ``per_round``: micro-batches per round of interleaving, by default the
    trainer's ``m // max(1, m // p)``."""
    _check(p, m, v, schedule)
    if schedule in V_SCHEDULES:
        return v_orders(p, m, schedule)
    if schedule == "dualpipe":
        return dualpipe_orders(p, m)
    k = per_round or _period(p, m, "interleaved-1f1b")
    return tuple(_rank_order(p, m, v, schedule, k, r) for r in range(p))


def _vs(chunk: int, rank: int, p: int, schedule: str) -> int:
    """The virtual stage of ``chunk`` on ``rank``: interleaved ``chunk * p + rank``, V-shaped
    ``costmodel.formulas.vschedules.virtual_stage``; under DualPipe the stage of the
    direction ``chunk`` runs on ``rank`` (``dualpipe_orders``)."""
    if schedule == "dualpipe":
        return rank if chunk ^ (rank >= p // 2) == 0 else p - 1 - rank
    return virtual_stage(chunk, rank, p) if schedule in V_SCHEDULES else chunk * p + rank


def _rank_order(p: int, m: int, v: int, schedule: str, k: int, r: int
                ) -> tuple[tuple[str, int, int], ...]:
    """Rank ``r``'s ops (``rank_orders``)."""
    if schedule == "gpipe":
        return tuple([("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)])
    n = m * v
    warm = min((v - 1) * k + 2 * (p - r - 1) if v > 1 else p - r - 1, n)
    if schedule == "combined-1f1b":
        return _combined_order(n, v, k, min(warm + 1, n))
    # The i-th forward and the i-th backward of the rank, in micro-batch order per chunk.
    fwd = _numbered([(i // k) % v for i in range(n)], "F")
    bwd = _numbered([v - 1 - (i // k) % v for i in range(n)], "B")
    zb = schedule == "zero-bubble"
    seq = list(fwd[:warm])
    w_done = 0
    for j in range(n):
        if warm + j < n:
            seq.append(fwd[warm + j])
        seq.append(bwd[j])
        if zb and j >= r:  # the weight gradient deferred by r input gradients
            seq.append(("W", *bwd[w_done][1:]))
            w_done += 1
    if zb:
        seq += [("W", *x[1:]) for x in bwd[w_done:]]
    return tuple(seq)


def _combined_order(n: int, v: int, k: int, warm: int) -> tuple[tuple, ...]:
    """Megatron-LM's combined 1F1B on one rank (``--overlap-moe-expert-parallel-comm``,
    megatron/core/pipeline_parallel/combined_1f1b.py): the interleaved order's warm-up with
    one forward more, then each steady-state forward merged with the oldest backward into one
    overlapped op ``("O", mb_f, chunk_f, mb_b, chunk_b)``, then the backwards left."""
    fwd = _numbered([(i // k) % v for i in range(n)], "F")
    bwd = _numbered([v - 1 - (i // k) % v for i in range(n)], "B")
    pairs = [("O", *fwd[warm + j][1:], *bwd[j][1:]) for j in range(n - warm)]
    return tuple(fwd[:warm] + pairs + bwd[n - warm:])


def _numbered(chunks: list[int], kind: str) -> list[tuple[str, int, int]]:
    """Ops of ``kind`` for a sequence of chunks, each numbering its own micro-batches."""
    seen = [0] * (max(chunks) + 1)
    out = []
    for c in chunks:
        out.append((kind, seen[c], c))
        seen[c] += 1
    return out


def _dep(kind: str, mb: int, vs: int, last: int) -> tuple[str, int, int] | None:
    """The op that (kind, micro-batch, virtual stage) waits for on another rank: a forward
    the previous stage's forward, an input gradient (``B`` or ``I``, both keyed ``B``) the
    next stage's or the last stage's own forward, a weight gradient its input gradient."""
    if kind == "F":
        return ("F", mb, vs - 1) if vs > 0 else None
    if kind in ("B", "I"):
        return ("B", mb, vs + 1) if vs < last else ("F", mb, vs)
    return ("B", mb, vs)


def _op_share(kind: str, schedule: str, v: int) -> tuple[int, float]:
    """(0 forward / 1 backward / 2 overlapped pair, fraction of a rank's per-micro-batch time
    of that side) of one op: the input and weight gradients half a backward each."""
    if kind == "F":
        return 0, 1.0 / v
    if kind == "O":
        return 2, 1.0 / v
    half = kind in ("I", "W") or schedule == "zero-bubble"
    return 1, 1.0 / v / (2 if half else 1)


def _parts(op: tuple, r: int, p: int, schedule: str, last: int
           ) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """(what one op of rank ``r`` completes, what it waits for), keyed as ``_dep``."""
    if op[0] == "O":
        _, mf, cf, mb, cb = op
        done = [("F", mf, _vs(cf, r, p, schedule)), ("B", mb, _vs(cb, r, p, schedule))]
        return done, [d for d in (_dep("F", *done[0][1:], last), _dep("B", *done[1][1:], last))
                      if d is not None]
    kind, mb, c = op
    vs = _vs(c, r, p, schedule)
    d = _dep(kind, mb, vs, last)
    return [("B" if kind == "I" else kind, mb, vs)], [] if d is None else [d]


def simulate(forward: list[float], backward: list[float], num_micro_batches: int,
             schedule: str = "1f1b", virtual_stages: int = 1,
             hidden: list[float] | None = None) -> Timeline:
    """Play a pipeline schedule out. ``forward[r]`` / ``backward[r]``: seconds one
    micro-batch takes through all of rank ``r``'s layers (its chunks together); ``schedule``:
    ``gpipe``, ``1f1b``, ``interleaved-1f1b`` (with ``virtual_stages`` chunks per rank),
    ``zero-bubble``, or the V-shaped ``zbv`` and ``dualpipev`` (two chunks per rank).
    ``hidden[r]``: seconds per micro-batch (all chunks) that running a forward overlapped with
    another micro-batch's backward saves on rank ``r`` (the pairs of DualPipeV and combined
    1F1B; 0 if ``None``)."""
    p, m, v = len(forward), int(num_micro_batches), int(virtual_stages)
    if len(backward) != p or p < 1:
        raise SpecError("forward and backward need one time per pipeline rank")
    _check(p, m, v, schedule)
    if min(forward) < 0 or min(backward) < 0:
        raise SpecError("stage times must be non-negative")
    chunks = 2 if schedule == "dualpipe" else v  # each op runs one of the rank's chunks
    saved = [0.0] * p if hidden is None else list(hidden)
    weight = (forward, backward, [f + b - h for f, b, h in zip(forward, backward, saved,
                                                                      strict=True)])
    orders = rank_orders(p, m, v, schedule)
    last = p * v - 1
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    nxt = [0] * p
    ops: list[Op] = []
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                op = orders[r][nxt[r]]
                done, deps = _parts(op, r, p, schedule, last)
                if any(d not in end for d in deps):
                    break
                side, share = _op_share(op[0], schedule, chunks)
                start = max([free[r]] + [end[d] for d in deps])
                free[r] = start + weight[side][r] * share
                for key in done:
                    end[key] = free[r]
                ops.append(Op(r, op[0], op[1], op[2], start, free[r], *op[3:]))
                nxt[r] += 1
                moved = True
        if not moved:  # pragma: no cover - rank_orders never deadlock (tests/test_pipeline.py)
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    return Timeline(schedule=schedule, num_stages=p, num_micro_batches=m, virtual_stages=v,
                    ops=tuple(sorted(ops, key=lambda o: (o.stage, o.start))))


@dataclass(frozen=True)
class _Graph:
    """The dependency graph of one schedule shape, nodes sorted by level (a node's level is one
    more than its predecessors'): node ``n`` ends at ``max(end[prev[n]], end[dep[n]],
    end[dep2[n]]) + weight[key[n]] * share[n]`` (index ``-1``: time 0), ``key`` indexing the
    per-rank weights ``[F of rank 0..p-1, B of rank 0..p-1]`` and, for the overlapped pairs
    of DualPipeV and combined 1F1B, ``[O of rank 0..p-1]`` after them;
    ``bounds[l]:bounds[l + 1]`` are the nodes of level ``l``. ``steady[r]``: rows of the
    nodes rank ``r`` runs for each of its steady-state backwards (the forward just before
    it, the backward, and with zero bubble the weight gradient just after it; combined 1F1B:
    each overlapped pair; a V schedule: each micro-batch's ``_V_GROUPS``)."""

    prev: np.ndarray
    dep: np.ndarray
    dep2: np.ndarray | None
    key: np.ndarray
    share: np.ndarray
    bounds: np.ndarray
    steady: tuple[np.ndarray, ...]


_KINDS = {"F": 0, "B": 1, "I": 1, "W": 2, "O": 3}


def _op_rows(p: int, orders: tuple, schedule: str) -> list[np.ndarray]:
    """Each rank's ops as rows ``(kind code, micro-batch, virtual stage, the pair's backward
    micro-batch, its virtual stage, side, parts)``: the op takes ``1 / (parts * v)`` of its
    side's per-micro-batch time (``_op_share``)."""
    out = []
    for r, seq in enumerate(orders):
        rows = []
        for op in seq:
            vs = _vs(op[2], r, p, schedule)
            pair = (op[3], _vs(op[4], r, p, schedule)) if op[0] == "O" else (0, 0)
            side, share = _op_share(op[0], schedule, 1)
            rows.append((_KINDS[op[0]], op[1], vs, *pair, side, round(1 / share)))
        out.append(np.array(rows, dtype=np.int64).reshape(-1, 7))
    return out


@lru_cache(maxsize=256)
def _graph(p: int, m: int, v: int, schedule: str, per_round: int | None = None) -> _Graph:
    orders = rank_orders(p, m, v, schedule, per_round)
    ops = _op_rows(p, orders, schedule)
    sizes = np.array([len(o) for o in ops])
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    allops = np.concatenate(ops)
    n = len(allops)
    kind, mb, vs, mb2, vs2 = (allops[:, i] for i in range(5))
    rank = np.repeat(np.arange(p), sizes)
    ids = np.full((3, m, p * v), -1, dtype=np.int64)
    plain = kind < 3
    ids[kind[plain], mb[plain], vs[plain]] = np.flatnonzero(plain)
    pair = np.flatnonzero(~plain)  # an overlapped pair completes a forward and a backward
    ids[0, mb[pair], vs[pair]] = pair
    ids[1, mb2[pair], vs2[pair]] = pair
    prev = np.arange(n) - 1
    prev[start] = -1
    last = p * v - 1

    def waits(k: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        # F waits for the previous virtual stage's F; B for the next one's B (the last
        # stage's for its own F); W for its B.
        return np.where(k == 0, np.where(s > 0, ids[0, b, np.maximum(s - 1, 0)], -1),
                        np.where(k == 1, np.where(s < last, ids[1, b, np.minimum(s + 1, last)],
                                                  ids[0, b, s]),
                                 ids[1, b, s]))

    dep = waits(np.where(kind == 3, 0, kind), mb, vs)
    dep2 = np.where(kind == 3, waits(np.ones_like(kind), mb2, vs2), -1) if pair.size else None
    key = allops[:, 5] * p + rank
    share = 1.0 / (allops[:, 6] * v)
    # Levels, rank by rank in lockstep: each round every rank runs its next op if what it
    # waits for ran in an earlier round.
    level = np.full(n, -1, dtype=np.int64)
    ptr = np.zeros(p, dtype=np.int64)

    def done(d: np.ndarray, lv: int) -> np.ndarray:
        return (d < 0) | ((level[np.maximum(d, 0)] >= 0) & (level[np.maximum(d, 0)] < lv))

    for lv in range(n + 1):
        live = np.flatnonzero(ptr < sizes)
        if not len(live):
            break
        cand = start[live] + ptr[live]
        ready = done(dep[cand], lv)
        if dep2 is not None:
            ready &= done(dep2[cand], lv)
        level[cand[ready]] = lv
        ptr[live[ready]] += 1
    else:  # pragma: no cover - rank_orders never deadlock (tests/test_pipeline.py)
        raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(int(level.max()) + 2))
    new_id = np.empty(n, dtype=np.int64)
    new_id[order] = np.arange(n)

    def renum(x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, new_id[np.maximum(x, 0)], -1)

    steady = []
    width = 3 if schedule == "zero-bubble" else 2
    for r in range(p) if schedule == "combined-1f1b" else ():
        k = ops[r][:, 0]  # each overlapped pair is a group of its own
        steady.append(new_id[start[r] + np.flatnonzero(k == 3)][:, None])
    for r in range(p) if schedule in V_SCHEDULES else ():
        steady.append(new_id[start[r] + _v_steady(ops[r], p, schedule)])
    for r in range(p) if schedule not in (*V_SCHEDULES, "combined-1f1b") else ():
        k = ops[r][:, 0]
        i = np.flatnonzero((k[1:] == 1) & (k[:-1] == 0)) + 1  # a B right after an F
        if width == 3:
            i = i[i + 1 < len(k)]
            i = i[k[i + 1] == 2]
        cols = [i - 1, i] + ([i + 1] if width == 3 else [])
        steady.append(new_id[start[r] + np.stack(cols, axis=1)])
    return _Graph(prev=renum(prev)[order], dep=renum(dep)[order],
                  dep2=None if dep2 is None else renum(dep2)[order], key=key[order],
                  share=share[order][:, None], bounds=bounds, steady=tuple(steady))


#: A V schedule's steady-state group per micro-batch, (kind code, chunk) op by op
#: (``vschedules``): ZB-V's forward, input and weight gradient of each chunk in turn,
#: DualPipeV's two overlapped pairs (a chunk-0 and a chunk-1 forward).
_V_GROUPS = {"zbv": ((0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)),
             "dualpipev": ((3, 0), (3, 1))}


def _v_steady(ops: np.ndarray, p: int, schedule: str) -> np.ndarray:
    """Rows (within a rank's ``_op_rows``) of each steady-state group of a V schedule,
    ``[groups, width]``: every run of the ops ``_V_GROUPS`` names, in order (an op's chunk:
    whether its (forward's) virtual stage is in the V's second half)."""
    pattern = _V_GROUPS[schedule]
    width = len(pattern)
    n = len(ops) - width + 1
    if n <= 0:
        return np.zeros((0, width), dtype=np.int64)
    kind, chunk = ops[:, 0], (ops[:, 2] >= p).astype(np.int64)
    hit = np.ones(n, dtype=bool)
    for j, (k, c) in enumerate(pattern):
        hit &= (kind[j:j + n] == k) & (chunk[j:j + n] == c)
    starts = np.flatnonzero(hit)
    return starts[:, None] + np.arange(width)[None, :]


def _play(p: int, m: int, v: int, schedule: str, weights: np.ndarray,
          per_round: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Longest path of one shape for ``weights`` ``[2p, rows]`` (forward then backward of each
    rank per micro-batch; ``[3p, rows]`` with the overlapped pairs' after them): the makespan
    per row, and the end times ``[nodes, rows]``."""
    g = _graph(p, m, v, schedule, per_round)
    n = len(g.key)
    end = np.zeros((n + 1, weights.shape[1]))  # the extra last row: index -1, time 0
    w = weights[g.key] * g.share
    for lo, hi in itertools.pairwise(g.bounds):
        before = np.maximum(end[g.prev[lo:hi]], end[g.dep[lo:hi]])
        if g.dep2 is not None:
            before = np.maximum(before, end[g.dep2[lo:hi]])
        end[lo:hi] = before + w[lo:hi]
    return end[:-1].max(axis=0), end


def _period(p: int, m: int, schedule: str) -> int:
    """Micro-batches per period of the steady state: one, or a round of interleaving."""
    return m // max(1, m // p) if schedule in ("interleaved-1f1b", "combined-1f1b") else 1


def _cut(p: int, m: int, v: int, schedule: str) -> int:
    """The fewest micro-batches, in whole periods, whose graph holds a window of ``4p + 2``
    steady groups on every rank plus a period after it (``_periodic``)."""
    k = _period(p, m, schedule)
    if schedule in V_SCHEDULES:  # 2p - 1 micro-batches before the first rank's steady state
        return 2 * p + (4 * p + 2) + p + 2
    warm0 = ((v - 1) * k + 2 * (p - 1) if v > 1 else p - 1) + (schedule == "combined-1f1b")
    need_groups = warm0 + (4 * p + 2) + k * v + p  # steady groups of rank 0, plus W's delay
    return -(-need_groups // (k * v)) * k


def _periodic(g: _Graph, p: int, per: int, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose steady state already repeats, and the time a period adds to them.

    The schedule's graph is the same from one period of the steady state to the next (each
    rank's next forward-backward group depends on the groups before it the same way), so when
    a window of consecutive groups longer than any dependency reaches (``4p + 2`` on every
    rank) ends exactly ``delta`` later one period on, every later period does too: the graph
    with more micro-batches is this one with periods of ``delta`` inserted. ``per``: steady
    groups per period on a rank."""
    width = 4 * p + 2
    if len(g.steady[0]) < width + per:
        return np.zeros(end.shape[1], dtype=bool), np.zeros(end.shape[1])
    d = []
    for r in range(p):
        s = g.steady[r]
        hi = len(g.steady[0]) - per  # rank 0 has the fewest steady groups
        lo = max(hi - width, 0)
        a, b = s[lo:hi].ravel(), s[lo + per:hi + per].ravel()
        d.append(end[b] - end[a])
    diff = np.concatenate(d, axis=0)
    delta = diff.max(axis=0)  # all equal to rounding; max does not depend on the layout
    scale = np.maximum(np.abs(end).max(axis=0), 1e-30)
    return (diff.max(axis=0) - diff.min(axis=0)) <= 1e-12 * scale, delta


def makespan(forward: np.ndarray, backward: np.ndarray, num_micro_batches: int,
             schedule: str, virtual_stages: int = 1, hidden: np.ndarray | None = None
             ) -> np.ndarray:
    """The pipeline's time (s) for many configurations of one shape: ``forward`` and
    ``backward`` ``[p, rows]`` are each rank's seconds per micro-batch (all its chunks);
    ``hidden`` ``[p, rows]`` what an overlapped pair saves (``simulate``). Equal to
    ``simulate(...).makespan`` row by row.

    GPipe in closed form: its forward wave is a flow shop of identical jobs, ``sum_r F_r +
    (m - 1) max_r F_r``, and its backward wave, which starts when the last rank's forwards end,
    the same in ``B`` (Huang et al. 2019). The others play the graph out; past ``_cut``
    micro-batches only to ``_cut``, and the rows whose steady state repeats (``_periodic``)
    add the rest in whole periods, the others are played out for twice as many, and so on.
    A V schedule's period is one micro-batch (``_V_GROUPS``)."""
    p = forward.shape[0]
    m, v = int(num_micro_batches), int(virtual_stages)
    _check(p, m, v, schedule)
    if schedule == "gpipe":
        return (forward.sum(axis=0) + backward.sum(axis=0)
                + (m - 1) * (forward.max(axis=0) + backward.max(axis=0)))
    weights = np.concatenate([forward, backward], axis=0)
    saved = 0.0 if hidden is None else hidden
    if schedule in V_SCHEDULES:
        weights = np.concatenate([weights, forward + backward - saved], axis=0)
    elif schedule == "combined-1f1b":
        h = np.broadcast_to(saved, forward.shape)
        if p == 1:  # a forward, m - 1 overlapped pairs, a backward
            return m * (forward[0] + backward[0]) - (m - 1) * h[0]
        weights = np.concatenate([weights, forward + backward - h], axis=0)
    if p == 1 and schedule not in V_SCHEDULES:
        return m * (forward[0] + backward[0])
    k = _period(p, m, schedule)
    cut = _cut(p, m, v, schedule)
    out = np.empty(weights.shape[1])
    todo = np.arange(weights.shape[1])
    while len(todo):
        if cut >= m:
            out[todo] = _play(p, m, v, schedule, weights[:, todo])[0]
            break
        # The shorter graph keeps the trainer's rounds of k micro-batches.
        short, end = _play(p, cut, v, schedule, weights[:, todo], k)
        per = 1 if schedule in V_SCHEDULES else k * v  # a V group is one micro-batch's
        ok, delta = _periodic(_graph(p, cut, v, schedule, k), p, per, end)
        out[todo[ok]] = short[ok] + (m - cut) // k * delta[ok]
        todo = todo[~ok]
        cut *= 2  # not yet repeating: a longer transient
    return out
