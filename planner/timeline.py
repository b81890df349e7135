"""Pipeline schedule timelines: when each pipeline rank runs which micro-batch.

``simulate`` plays a schedule out op by op from each rank's forward and backward time per
micro-batch: GPipe (all forwards, then all backwards; Huang et al. 2019), 1F1B (DAPPLE's early
backward, Fan et al. 2021: ``p - r - 1`` warm-up forwards on rank ``r``, then one forward and
one backward in turn), interleaved 1F1B (Narayanan et al. 2021, Megatron-LM: rank ``r`` holds
model chunks ``r, r + p, ...``; micro-batches advance in groups of ``p`` per chunk, with
``2 (p - r - 1) + (v - 1) p`` warm-up forwards) and zero bubble ZB-H1 (Qi et al. 2024: the
backward splits into the input gradient ``B`` and the weight gradient ``W``; a rank runs what
is ready, ``B`` first, then ``F`` while fewer than ``p - r`` micro-batches are in flight, and
``W`` to fill the gaps). Every op waits for the op it depends on (the previous virtual stage's
forward, the next one's backward). ``timeline`` takes the per-stage times from the cost model
(``costmodel.steptime.time_table``), splitting each stage's time per micro-batch into forward
and backward by their compute share; communication is inside the stage times, as there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from costmodel.config import Job, ParallelConfig, validate
from costmodel.errors import SpecError
from costmodel.hardware import Cluster
from costmodel.memory import ConfigArrays, memory_table
from costmodel.model import ModelSpec
from costmodel.steptime import time_table

__all__ = ["Op", "Timeline", "simulate", "timeline"]


class Op(NamedTuple):
    """One operation on one pipeline rank: ``kind`` ``F`` (forward), ``B`` (backward; with
    zero bubble only the input gradient) or ``W`` (zero bubble's weight gradient), of
    micro-batch ``micro_batch`` and model chunk ``chunk`` (0 unless interleaved), from
    ``start`` to ``end`` seconds."""

    stage: int
    kind: str
    micro_batch: int
    chunk: int
    start: float
    end: float


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


def _orders(p: int, m: int, v: int, schedule: str) -> list[list[tuple[str, int, int]]]:
    """Each rank's op order (kind, micro-batch, chunk) for the fixed-order schedules."""
    # Forward order of (micro-batch, chunk) on a rank: groups of p micro-batches per chunk.
    fwd = [(mb, c) for g in range(0, m, p) for c in range(v) for mb in range(g, min(g + p, m))]
    bwd = [(mb, v - 1 - c) for g in range(0, m, p) for c in range(v)
           for mb in range(g, min(g + p, m))]
    out = []
    for r in range(p):
        if schedule == "gpipe":
            warm = m * v
        elif v > 1:
            warm = min(2 * (p - r - 1) + (v - 1) * p, m * v)
        else:
            warm = min(p - r - 1, m)
        seq = [("F", *fwd[i]) for i in range(warm)]
        for i in range(m * v - warm):
            seq += [("F", *fwd[warm + i]), ("B", *bwd[i])]
        seq += [("B", *bwd[i]) for i in range(m * v - warm, m * v)]
        out.append(seq)
    return out


def simulate(forward: list[float], backward: list[float], num_micro_batches: int,
             schedule: str = "1f1b", virtual_stages: int = 1) -> Timeline:
    """Play a pipeline schedule out. ``forward[r]`` / ``backward[r]``: seconds one
    micro-batch takes through all of rank ``r``'s layers (its chunks together); ``schedule``:
    ``gpipe``, ``1f1b``, ``interleaved-1f1b`` (with ``virtual_stages`` chunks per rank) or
    ``zero-bubble``."""
    p, m, v = len(forward), int(num_micro_batches), int(virtual_stages)
    if p < 1 or len(backward) != p:
        raise SpecError("forward and backward need one time per pipeline rank")
    if m < 1 or v < 1:
        raise SpecError("need at least one micro-batch and one chunk per rank")
    if min(forward) < 0 or min(backward) < 0:
        raise SpecError("stage times must be non-negative")
    if schedule not in ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"):
        raise SpecError(f"unknown pipeline schedule {schedule!r}")
    if (v > 1) != (schedule == "interleaved-1f1b"):
        raise SpecError("virtual_stages > 1 goes with the interleaved-1f1b schedule only")
    last = p * v - 1
    end: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> end

    def dep(kind: str, mb: int, vs: int) -> tuple[str, int, int] | None:
        if kind == "F":
            return ("F", mb, vs - 1) if vs > 0 else None
        if kind == "B":
            return ("B", mb, vs + 1) if vs < last else ("F", mb, vs)
        return ("B", mb, vs)

    def length(kind: str, r: int) -> float:
        if kind == "F":
            return forward[r] / v
        return backward[r] / v / (2 if schedule == "zero-bubble" else 1)

    ops: list[Op] = []
    free = [0.0] * p
    if schedule != "zero-bubble":
        orders = _orders(p, m, v, schedule)
        nxt = [0] * p
        while any(nxt[r] < len(orders[r]) for r in range(p)):
            moved = False
            for r in range(p):
                while nxt[r] < len(orders[r]):
                    kind, mb, c = orders[r][nxt[r]]
                    vs = c * p + r
                    d = dep(kind, mb, vs)
                    if d is not None and d not in end:
                        break
                    start = max(free[r], end[d] if d is not None else 0.0)
                    free[r] = start + length(kind, r)
                    end[(kind, mb, vs)] = free[r]
                    ops.append(Op(r, kind, mb, c, start, free[r]))
                    nxt[r] += 1
                    moved = True
            if not moved:  # pragma: no cover - the orders above never deadlock
                raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    else:
        _zero_bubble(p, m, free, end, ops, dep, length)
    return Timeline(schedule=schedule, num_stages=p, num_micro_batches=m, virtual_stages=v,
                    ops=tuple(sorted(ops, key=lambda o: (o.stage, o.start))))


def _zero_bubble(p: int, m: int, free: list[float], end: dict, ops: list[Op], dep, length
                 ) -> None:
    """ZB-H1 by list scheduling in time order: B first, then F under the in-flight cap of
    ``p - r`` micro-batches (1F1B's activation memory), then W."""
    done = {k: [0] * p for k in "FBW"}
    while any(done["W"][r] < m for r in range(p)):
        best = None
        for r in range(p):
            cands = []
            for kind in "BFW":
                mb = done[kind][r]
                if mb >= m:
                    continue
                if kind == "F" and done["F"][r] - done["B"][r] >= p - r:
                    continue
                if kind == "W" and done["W"][r] >= done["B"][r]:
                    continue
                d = dep(kind, mb, r)
                if d is not None and d not in end:
                    continue
                start = max(free[r], end[d] if d is not None else 0.0)
                cands.append((start, "BFW".index(kind), kind, mb))
            if cands:
                c = min(cands)
                # Prefer B, then F, among what can start at the rank's earliest moment.
                at = [x for x in cands if x[0] <= c[0]]
                c = min(at, key=lambda x: x[1])
                if best is None or (c[0], r) < (best[0][0], best[1]):
                    best = (c, r)
        assert best is not None, "zero-bubble schedule deadlocked"
        (start, _, kind, mb), r = best
        free[r] = start + length(kind, r)
        end[(kind, mb, r)] = free[r]
        ops.append(Op(r, kind, mb, 0, start, free[r]))
        done[kind][r] += 1


def timeline(model: ModelSpec, cluster: Cluster, job: Job, config: ParallelConfig) -> Timeline:
    """The schedule of ``config``'s pipeline as the cost model times it: each rank's time per
    micro-batch (``time_table``'s stage times, communication included) split into forward and
    backward by their compute share."""
    validate(model, cluster, job, config)
    a = ConfigArrays.from_configs(model, [config])
    mem = memory_table(model, cluster, job, a)
    t = time_table(model, cluster, job, a, mem)
    assert t.forward_share is not None
    stage, share = t.stage_time[:, 0], t.forward_share[:, 0]
    fwd = [float(stage[r] * share[r]) for r in range(config.pp)]
    bwd = [float(stage[r] * (1 - share[r])) for r in range(config.pp)]
    return simulate(fwd, bwd, int(mem.num_micro_batches[0]), str(config.pipeline_schedule),
                    config.virtual_pipeline_stages)
