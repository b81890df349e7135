"""V-shaped pipeline schedules: two model chunks per rank, placed as a V, and the op orders
their trainers run.

With ``p`` ranks the model is cut into ``2p`` virtual stages; rank ``r`` holds stage ``r``
(chunk 0) and stage ``2p - 1 - r`` (chunk 1), so the first rank holds the embedding and the
output layer and the last rank passes its chunk-0 output to its own chunk 1 without a send
(Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6; DeepSeek-AI 2024, DeepSeek-V3
technical report, Sec. 3.2.1, and deepseek-ai/DualPipe's "cut-in-half" DualPipeV). The orders,
rank by rank, as torch.distributed.pipelining runs them (``ScheduleZBVZeroBubble``,
``ScheduleDualPipeV``; ``tests/test_pipeline_v.py`` compares them op for op when torch is
installed):

- ``zbv`` (ZB-V): ``2(p - r) - 1`` forwards of chunk 0; ``r`` pairs (chunk-1 forward, chunk-0
  forward); ``p - r`` triples (chunk-1 forward, input gradient, weight gradient); then the
  steady state alternates the chunks, each a forward, input gradient and weight gradient;
  the cool-down runs ``r`` pairs of input gradients (chunk 0, chunk 1), then ``p - r``
  (chunk-0 input gradient, its oldest weight gradient), then the weight gradients left,
  chunk 1's first. Orders are made for ``max(m, 2p - 1)`` micro-batches and the ops of the
  micro-batches past ``m`` dropped, as torch does.
- ``dualpipev``: ``2(p - r - 1)`` chunk-0 forwards; ``r + 1`` pairs of forwards (chunk 0,
  chunk 1); ``p - r - 1`` triples (chunk-1 input gradient, a deferred weight gradient,
  chunk-1 forward); then the main phase of ``m - 2p + r + 1`` pairs of overlapped ops
  (chunk-0 forward with chunk-1 full backward, chunk-1 forward with chunk-0 full backward;
  the last rank runs its very first pair apart); ``p - r - 1`` pairs (chunk-1 full backward,
  chunk-1 forward overlapped with chunk-0 backward); ``r + 1`` pairs of backwards (chunk 1,
  chunk 0), the second half of them input gradients only (the switch falls between the
  pair's two ops on odd ranks); ``p - r - 1`` pairs (a deferred weight gradient, a chunk-0
  backward); and the ``r + 1`` weight gradients still deferred. Needs ``m >= 2p``.

An op is ``(kind, micro_batch, chunk)``: ``F`` forward, ``B`` full backward, ``I`` input
gradient, ``W`` weight gradient; or ``("O", mb_f, chunk_f, mb_b, chunk_b)``, one micro-batch's
forward overlapped with another's full backward (DualPipe's paired micro-batches: the
dispatch and combine all-to-alls of each run under the other's compute).

DeepSeek's bidirectional DualPipe over ``p`` ranks runs DualPipeV's orders of ``p / 2`` ranks
on mirror ranks (``dualpipe_orders``) and is costed as that DualPipeV (``dualpipe_costing``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from costmodel.config import V_SCHEDULES, ParallelConfig
from costmodel.errors import SpecError

__all__ = ["V_SCHEDULES", "DualPipeCosting", "as_dualpipe", "costed_ranks", "dualpipe_costing",
           "dualpipe_orders", "in_flight", "v_orders", "v_rank_layers", "v_split",
           "virtual_stage"]


OpT = tuple  # ("F"|"B"|"I"|"W", mb, chunk) or ("O", mb_f, chunk_f, mb_b, chunk_b)


def virtual_stage(chunk: int, rank: int, p: int) -> int:
    """The virtual stage of ``chunk`` (0 or 1) on ``rank`` in a V of ``p`` ranks."""
    return rank if chunk == 0 else 2 * p - 1 - rank


def v_split(num_layers: int, p: int) -> tuple[int, ...]:
    """Layers per virtual stage (``2p`` of them, in virtual order) as torchtitan splits a
    V-shaped pipeline without ``pipeline_parallel_layers_per_stage``
    (torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part`` with
    ``input_weight = output_weight = 1``): the layers plus the embedding and the output layer,
    each counted as one, split evenly, the remainder one each to the first stages; then the
    first stage holds one layer fewer for the embedding and the last one fewer for the
    output. Rank ``r`` holds stages ``r`` and ``2p - 1 - r``."""
    n = 2 * p
    per, extra = divmod(num_layers + 2, n)
    out = [per + (i < extra) for i in range(n)]
    out[0] -= 1
    out[-1] -= 1
    if min(out) < 0:
        raise SpecError(f"{num_layers} layers are too few for a V of {n} stages (pp={p})")
    return tuple(out)


def v_rank_layers(chunks: tuple[int, ...]) -> list[int]:
    """Layers per rank of a V split (``v_split``): stages ``r`` and ``2p - 1 - r``."""
    n = len(chunks)
    return [chunks[r] + chunks[n - 1 - r] for r in range(n // 2)]


def check_v(p: int, m: int, schedule: str) -> None:
    """Refuse a shape the trainer does not run (``SpecError``)."""
    if schedule == "dualpipev" and m < 2 * p:
        raise SpecError(f"the dualpipev schedule needs at least 2 * pp = {2 * p} "
                        f"micro-batches, got {m} (torch ScheduleDualPipeV)")


@lru_cache(maxsize=256)
def v_orders(p: int, m: int, schedule: str) -> tuple[tuple[OpT, ...], ...]:
    """Each rank's ops in the order it runs them (module docstring)."""
    check_v(p, m, schedule)
    make = _zbv if schedule == "zbv" else _dualpipev
    return tuple(tuple(make(p, m, r)) for r in range(p))


class _Counter:
    """Next micro-batch per (kind, chunk) on one rank."""

    def __init__(self) -> None:
        self.n: dict[tuple[str, int], int] = {}

    def take(self, kind: str, chunk: int) -> int:
        i = self.n.get((kind, chunk), 0)
        self.n[(kind, chunk)] = i + 1
        return i

    def get(self, kind: str, chunk: int) -> int:
        return self.n.get((kind, chunk), 0)


def _zbv(p: int, m: int, r: int) -> list[OpT]:
    n = max(m, 2 * p - 1)
    c = _Counter()
    ops: list[OpT] = []

    def put(kind: str, chunk: int) -> None:
        ops.append((kind, c.take(kind, chunk), chunk))

    ops_f0 = [("F", 0)] * (2 * (p - r) - 1) + [("F", 1), ("F", 0)] * r \
        + [("F", 1), ("I", 1), ("W", 1)] * (p - r)
    for kind, chunk in ops_f0:
        put(kind, chunk)
    while c.get("F", 1) < c.get("F", 0) or c.get("F", 0) < n:
        if c.get("F", 0) < n:
            put("F", 0)
        for kind, chunk in (("I", 0), ("W", 0), ("F", 1), ("I", 1), ("W", 1)):
            put(kind, chunk)
    for kind, chunk in [("I", 0), ("I", 1)] * r + [("I", 0), ("W", 0)] * (p - r):
        put(kind, chunk)
    for chunk in (1, 0):
        while c.get("W", chunk) < c.get("I", chunk):
            put("W", chunk)
    return [op for op in ops if op[1] < m]


class _DualPipeV:
    """One rank's DualPipeV order, built phase by phase (``v_orders``)."""

    def __init__(self) -> None:
        self.c = _Counter()
        self.ops: list[OpT] = []
        self.deferred: deque[tuple[int, int]] = deque()  # (micro-batch, chunk) of pending W

    def fwd(self, chunk: int) -> None:
        self.ops.append(("F", self.c.take("F", chunk), chunk))

    def bwd(self, chunk: int, full: bool) -> None:
        """A full backward, or the input gradient alone with its weight gradient deferred."""
        mb = self.c.take("B", chunk)
        self.ops.append(("B" if full else "I", mb, chunk))
        if not full:
            self.deferred.append((mb, chunk))

    def weight(self) -> None:
        """The oldest deferred weight gradient, if any."""
        if self.deferred:
            mb, chunk = self.deferred.popleft()
            self.ops.append(("W", mb, chunk))

    def pair(self, f_chunk: int) -> None:
        """A forward of ``f_chunk`` overlapped with a full backward of the other chunk."""
        b_chunk = 1 - f_chunk
        self.ops.append(("O", self.c.take("F", f_chunk), f_chunk, self.c.take("B", b_chunk),
                         b_chunk))

    def drain(self, r: int, p: int) -> None:
        """The last phases: r + 1 pairs of backwards, the later half input gradients only
        (switching between a pair's two ops on odd ranks); p - r - 1 (weight gradient,
        chunk-0 backward); the deferred weight gradients."""
        zb = False
        half = (r + 1) // 2
        for i in range(r + 1):
            zb = zb or (i == half and r % 2 == 1)
            self.bwd(1, not zb)
            zb = zb or (i == half and r % 2 == 0)
            self.bwd(0, not zb)
        for _ in range(p - r - 1):
            self.weight()
            self.bwd(0, False)
        for _ in range(r + 1):
            self.weight()


def _dualpipev(p: int, m: int, r: int) -> list[OpT]:
    s = _DualPipeV()
    for _ in range(2 * (p - r - 1)):
        s.fwd(0)
    for _ in range(r + 1):
        s.fwd(0)
        s.fwd(1)
    for _ in range(p - r - 1):
        s.bwd(1, False)
        s.weight()
        s.fwd(1)
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # the last rank's first pair runs apart
            s.fwd(0)
            s.bwd(1, True)
        else:
            s.pair(0)
        s.pair(1)
    for _ in range(p - r - 1):
        s.bwd(1, True)
        s.pair(1)
    s.drain(r, p)
    return s.ops


@lru_cache(maxsize=128)
def dualpipe_orders(p: int, m: int) -> tuple[tuple[OpT, ...], ...]:
    """Each rank's ops under DeepSeek's bidirectional DualPipe over ``p`` ranks (even) and
    ``m`` micro-batches (even, at least ``2p``): ``m / 2`` enter at rank 0 and run stages
    ``0 .. p - 1`` on ranks ``0 .. p - 1`` (direction 0), the others enter at rank ``p - 1``
    and run them on ranks ``p - 1 .. 0`` (direction 1). Rank ``r`` runs DualPipeV's order
    (``_dualpipev``) of its half rank ``h = min(r, p - 1 - r)`` over ``p / 2`` ranks and
    ``m / 2`` micro-batches, as deepseek-ai/DualPipe@3da1bbe's ``DualPipe.step`` runs steps
    1-8 of ``DualPipeV.step`` with ``half_rank``, ``num_half_ranks`` and ``half_num_chunks``;
    its chunk 0 is the direction that enters at its own end (direction 0 on the first half
    of the ranks, 1 on the second: ``phase ^= is_in_second_half``), chunk 1 the other.
    Micro-batches are numbered ``0 .. m/2 - 1`` in direction 0 and ``m/2 .. m - 1`` in
    direction 1 (the stage an op runs: ``pipeline._vs``)."""
    half = p // 2
    base = v_orders(half, m // 2, "dualpipev")
    out = []
    for r in range(p):
        first = (0, m // 2) if r < half else (m // 2, 0)  # each chunk's first micro-batch
        ops: list[OpT] = []
        for op in base[min(r, p - 1 - r)]:
            if op[0] == "O":
                ops.append(("O", op[1] + first[op[2]], op[2], op[3] + first[op[4]], op[4]))
            else:
                ops.append((op[0], op[1] + first[op[2]], op[2]))
        out.append(tuple(ops))
    return tuple(out)


def in_flight(p: int, m: int, schedule: str) -> tuple[tuple[float, ...], float, float]:
    """(per rank, the most chunk-micro-batches whose activations it holds at once, in units
    of all its layers for one micro-batch (so halved: two chunks); the embedding's count on
    rank 0 (chunk 0) and the output layer's (chunk 1) at that rank's peak).

    Played from the op orders: a forward adds its chunk's activations and a backward (full or
    input gradient) frees them (the weight gradient keeps only the linears' inputs, which the
    1F1B count leaves out as well); an overlapped pair holds both at its start. The peak is
    reached by the steady state, which more micro-batches only lengthen: past ``4p + 4`` the
    orders of ``4p + 4`` give it (``tests/test_pipeline_v.py``)."""
    return _in_flight(p, min(m, 4 * p + 4), schedule)


@lru_cache(maxsize=512)
def _in_flight(p: int, m: int, schedule: str) -> tuple[tuple[float, ...], float, float]:
    """``in_flight`` played from the orders of ``m`` micro-batches."""
    layers = []
    emb = head = 0.0
    for r, seq in enumerate(v_orders(p, m, schedule)):
        held = [0, 0]
        best, at_best = 0, (0, 0)
        for op in seq:
            if op[0] in ("F", "O"):
                held[op[2]] += 1
                if sum(held) > best:
                    best, at_best = sum(held), (held[0], held[1])
            if op[0] in ("B", "I"):
                held[op[2]] -= 1
            elif op[0] == "O":
                held[op[4]] -= 1
        layers.append(best / 2)
        if r == 0:
            emb, head = float(at_best[0]), float(at_best[1])
    return tuple(layers), emb, head


@dataclass(frozen=True, kw_only=True)
class DualPipeCosting(ParallelConfig):
    """The DualPipeV configuration that a DualPipe one is costed as (``dualpipe_costing``).
    Its type tells the tables that each overlapped pair hides its expert all-to-alls whatever
    the trainer and recompute: DualPipe's own chunks do (DeepSeek-V3 report, Sec. 3.2.1)."""


def dualpipe_costing(cfg: ParallelConfig) -> ParallelConfig:
    """``cfg`` as the cost tables take it: itself, or for DeepSeek's bidirectional DualPipe
    over ``pp`` ranks and ``dp`` pipelines the DualPipeV over ``pp / 2`` ranks and ``2 dp``
    pipelines (a ``DualPipeCosting``), which runs the same ops on the same GPUs.

    deepseek-ai/DualPipe@3da1bbe: ``DualPipe.step`` (dualpipe.py) on rank ``r`` with ``m``
    micro-batches runs steps 1-8 of ``DualPipeV.step`` (dualpipev.py) with the half rank
    ``h = min(r, pp - 1 - r)``, ``pp / 2`` ranks and ``m / 2`` micro-batches in their place,
    and rank ``r`` holds stages ``r`` and ``pp - 1 - r`` (examples/example_dualpipe.py), which
    are DualPipeV rank ``h``'s two virtual stages of the same ``pp``-stage split: the two
    directions are the V's two arms, mirror ranks ``r`` and ``pp - 1 - r`` run the same ops
    at the same times, and per GPU the layers, parameters (two stages: the README's "2x"),
    activations (``pp + 1``) and bubble (``(pp/2 - 1)(F&B + B - 3W)``) are the same
    (DualPipe README, "Pipeline Bubbles and Memory Usage Comparison"); ``m / 2`` per DualPipeV
    pipeline is what ``2 dp`` pipelines give each. Left out: each stage's gradients are
    summed over its ``2 dp`` copies in two steps (the ``dp`` pipelines', then the mirror
    rank's) rather than one reduction over ``2 dp`` (ZeRO then shards its optimizer states
    over those ``2 dp`` copies), and the two middle ranks pass each micro-batch's
    activations to each other once where DualPipeV's last rank keeps them."""
    if cfg.pipeline_schedule != "dualpipe":
        return cfg
    values = {f.name: getattr(cfg, f.name) for f in fields(ParallelConfig)}
    values.update(pp=cfg.pp // 2, dp=cfg.dp * 2, pipeline_schedule="dualpipev",
                  virtual_pipeline_stages=2)
    return DualPipeCosting(**values)


def costed_ranks(cfg: ParallelConfig) -> list[int]:
    """For each pipeline rank of ``cfg``, the rank of ``dualpipe_costing(cfg)`` it runs as:
    itself, or under DualPipe its half rank ``min(r, pp - 1 - r)``."""
    if cfg.pipeline_schedule != "dualpipe":
        return list(range(cfg.pp))
    return [min(r, cfg.pp - 1 - r) for r in range(cfg.pp)]


def as_dualpipe(cfg: ParallelConfig) -> ParallelConfig | None:
    """The DualPipe that runs ``cfg``'s pipeline: a DualPipeV's over twice its ranks and half
    its pipelines (the DualPipe ``dualpipe_costing`` costs as it), else the same ranks with one
    stage each; None where the DualPipe shape does not take it (an odd dp under a DualPipeV,
    an odd pp or fewer than 4 ranks, a sharding group that does not divide the new dp)."""
    try:
        if cfg.pipeline_schedule == "dualpipev":
            if cfg.dp % 2:
                return None
            return replace(cfg, pp=2 * cfg.pp, dp=cfg.dp // 2, stage_layers=None,
                           pipeline_schedule="dualpipe", virtual_pipeline_stages=1)
        if cfg.pp % 2 or cfg.pp < 4:
            return None
        return replace(cfg, pipeline_schedule="dualpipe", virtual_pipeline_stages=1,
                       stage_recompute_layers=None, stage_layers=cfg.stage_layers
                       if cfg.virtual_pipeline_stages == 1 else None)
    except SpecError:
        return None
