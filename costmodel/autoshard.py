"""Intra-op sharding of a traced ``LayerGraph`` on a 2-D device mesh, as an ILP (Alpa, Zheng et
al. 2022, Sec. 4), combined with a pipeline-stage DP over its layers (Sec. 5).

**The sharding graph.** The forward ops of the graph, with views contracted into the edges
(a view only renames dims: ``costmodel.sharding.view_map``) and constant subgraphs (index
tables, rotary angles: nothing flows into them from the inputs or the parameters) dropped.
A run of identical blocks is one block with weight ``repeat``. Parameters, model inputs and
constants take whatever layout their consumer asks for, at no cost.

**Strategies.** Node ``v`` shards each mesh axis along one of its loops or replicates
(``costmodel.sharding.op_loops``); a loop may take both axes when its size is divisible by
the whole mesh. A strategy ``k`` fixes the layout of the output and of every input, and has
a compute time ``c[v, k]`` (forward + backward: ``costmodel.compute`` gemm, flash-attention
and memory-bound costs on the local shard), a gradient-synchronisation time ``g[v, k]``
(converting the partial gradients of replicated parameters back: the data-parallel
all-reduce), a backward time ``b[v, k]`` it may overlap with, and memory ``m[v, k]``
(parameter + gradient + optimizer bytes of the shard, and the activations it saves times
the micro-batches in flight).

**Partial sums carried.** An op linear in some of its inputs (a gather, the first input of
a sum, either factor of a product, an add of partial sums) also has strategies that take a
partial sum on one axis and hand it on unreduced, or that take its output's gradient as a
partial sum and hand partial gradients back (``ShardingProblem._carries``), so one reduction
may serve several ops: a MoE layer's experts are reduced once after the weighted combine, as
Megatron-LM's row-parallel experts are, not once per routed copy.

**Resharding.** Where a producer's output layout differs from the layout a consumer needs,
the collective that converts it is inserted (``costmodel.sharding.reshard_time``), forward,
and its gradient's conversion backward. Consumers that need the same layout of one tensor
share one conversion: for producer ``u`` and each distinct (layout, gradient layout) class
``c`` its consumers may need, ``r[u, k, c]`` is the cost of converting output layout ``k``.

**ILP** (OR-Tools with SCIP; times in microseconds, memory in MiB). Binary ``x[v, k]``: node
``v`` uses strategy ``k``; ``w[u, c]`` in [0, 1]: some consumer of ``u`` needs class ``c``;
``y[u, k, c]`` in [0, 1]: ``u`` uses ``k`` and converts to ``c``; ``e >= 0`` the exposed
gradient synchronisation (``w``, ``y`` are 0/1 at the optimum since ``x`` is).
With ``n_v`` the weight (repeat) of ``v``, ``M`` the micro-batches per step::

    (a) sum_k x[v, k] = 1                                   every node v
    (b) w[u, c] >= sum_{k in class c} x[v, k]               every consumer v of u, class c
    (c) sum_k y[u, k, c] = w[u, c],  y[u, k, c] <= x[u, k]  every u, k, c
    (d) sum_{v, k} n_v m[v, k] x[v, k] <= memory budget
    (f) x[v, j] = sum_{k: f_v(k) = j} x[u, k]               every follower v of leader u
    (e) e >= sum_{v, k} n_v (g[v, k] - b[v, k]) x[v, k]     (synchronisation overlapped with
                                                             the last backward, as DDP's buckets)
    minimise  M (sum_{v,k} n_v c[v, k] x[v, k] + sum_{u,k,c} n_u r[u, k, c] y[u, k, c]) + e

``brute_force`` enumerates every assignment of strategies and evaluates the same objective
with ``ShardingProblem.evaluate``; ``tests/test_autoshard.py`` checks they agree.

**Tensor-parallel mode** (``tensor_parallel=True``; ``LayerCosts.from_graph`` solves each
block on a 1 x t mesh per degree t): the devices see the same tokens, so no strategy splits
a loop that runs along the model inputs' dims (``ShardingProblem.token_dims``); every weight
matrix that meets the tokens is split; partial sums are only all-reduced, the residual
stream staying whole, unless ``sequence_parallel`` lets the memory-bound ops split the
sequence (they must then) with all-gathers and reduce-scatters between the regions
(Korthikanti et al. 2022, Sec. 4.2.2). ``tests/test_layercosts.py`` checks it against
brute force and against Megatron-LM's formulas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.comm import Topology
from costmodel.compute import (
    BACKWARD_BYTES,
    attention_kernel,
    flash_attention_time,
    gemm_time,
    memory_time,
)
from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.graph import LayerGraph, OpNode, TensorRef
from costmodel.hardware import Cluster
from costmodel.memory import state_bytes
from costmodel.sharding import PARTIAL, REPLICATE, Loop, describe, reshard_time
from costmodel.units import GIB

__all__ = ["Mesh", "ShardingProblem", "Solution", "Strategy", "brute_force", "solve"]

Layout = tuple[int, ...]
#: Families whose ops follow the layout of their single input node.
_LIGHT = ("elementwise", "norm", "softmax", "reduction", "loss", "index", "pool")


@dataclass(frozen=True)
class Mesh:
    """A 2-D mesh of ``shape[0] x shape[1]`` devices; axis 1 is innermost (consecutive
    ranks, inside a node first), axis 0 strides over it."""

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or any(int(n) != n or n < 1 for n in self.shape):
            raise SpecError(f"Mesh: shape must be two positive integers, got {self.shape}")

    @property
    def strides(self) -> tuple[int, ...]:
        """Rank distance between neighbours along each axis."""
        return (self.shape[1], 1)

    @property
    def size(self) -> int:
        """Devices in the mesh."""
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True)
class Strategy:
    """One sharding of a node: ``axes`` the loop each mesh axis splits (``None``:
    replicated); layouts of the output and of each input (``ins``, in the coordinates of the
    tensor the input comes from) and of each input's gradient (``grads``); seconds of
    compute (forward + backward), of its backward alone and of gradient synchronisation;
    bytes of memory (parameter state and activations in flight) and of the activations
    one micro-batch saves. ``out_grad``: the layout it takes its output's gradient in
    (default: the output's, a partial sum's whole), partial where it hands a partial
    gradient on unreduced (``ShardingProblem._carries``)."""

    axes: tuple[int | None, ...]
    label: str
    out: Layout
    ins: tuple[Layout, ...]
    grads: tuple[Layout, ...]
    compute_s: float
    backward_s: float
    sync_s: float
    memory: float
    activation_bytes: float
    out_grad: Layout | None = None

    @property
    def grad_layout(self) -> Layout:
        """The layout its output's gradient must arrive in."""
        return _rify(self.out) if self.out_grad is None else self.out_grad


@dataclass(frozen=True)
class _Input:
    """A consumer's input traced back through views: ``source`` the real node it comes
    from (-1: a parameter, model input or constant, free to take any layout), ``dims`` the
    source dim of each of the consumer's input dims (a split of that dim splits it),
    ``spans`` the source dims each runs along (``_pieces``: through reshapes factor by
    factor)."""

    source: int
    param: str
    dims: tuple[int | None, ...]
    nbytes: float
    numel: float
    grad: bool
    constant: bool = False
    spans: tuple[frozenset[int], ...] = ()


@dataclass
class _Group:
    """The consumers of one producer's output, or of one part of it (``nbytes``), that are
    charged ``weight`` times."""

    producer: int
    weight: int
    nbytes: float
    grad: bool
    consumers: list[tuple[int, int]] = field(default_factory=list)

    def need(self, st: Strategy, slot: int) -> tuple[Layout, Layout | None]:
        """The class a consumer with strategy ``st`` needs of the tensor at its input
        ``slot``: (layout, gradient layout, ``None`` when no gradient flows)."""
        return st.ins[slot], st.grads[slot] if self.grad else None


def _through_views(node: dict[int, OpNode], constant: set[int], ref: TensorRef,
                   packed: frozenset[int] = frozenset()) -> _Input:
    """Input ``ref`` of an op traced back through the views that produced it to the real
    node (or parameter, model input or constant: source -1), with the dims mapped.
    ``packed``: the matmuls whose output features may be split in any order, an
    ``nn.MultiheadAttention``'s projections of packed weight rows, which its split by heads
    reorders so that each rank holds its heads' query, key and value rows
    (``planner.runtime.attention``): a view's heads are a split of those features."""
    dims: tuple[int | None, ...] = tuple(range(len(ref.shape)))
    src, param, nbytes, numel = ref.source, ref.param, ref.nbytes, ref.numel
    chain: list[OpNode] = []
    fresh = False
    while src >= 0 and src not in constant and node[src].family == "view":
        vm = node[src].view_map or ()
        dims = tuple(vm[d] if d is not None and d < len(vm) else None for d in dims)
        chain.append(node[src])
        if not node[src].inputs:  # a view of nothing (a fresh tensor): a constant
            fresh = True
            break
        up = node[src].inputs[0]
        src, param, nbytes, numel = up.source, up.param or param, up.nbytes, up.numel
    pieces = _pieces(chain, ref.shape)
    spans = tuple(frozenset(p[0] for p in ps) for ps in pieces)
    if src in packed:
        dims = _packed_heads(dims, pieces, len(node[src].shape) - 1)
    if src < 0 and param and not fresh:
        # A parameter takes any layout: a slice of it (a packed projection's query rows) is
        # split along the dim it slices as the parameter is (``view_map`` leaves a sliced
        # dim unmapped: a slice of a split activation is not a split of the slice).
        dims = tuple(next(iter(s)) if d is None and len(s) == 1 and next(iter(s)) not in dims
                     else d for d, s in zip(dims, spans, strict=True))
    if fresh:
        return _Input(-1, param, dims, nbytes, numel, ref.grad, True, spans)
    return _Input(-1 if src in constant else src, param, dims, nbytes, numel, ref.grad,
                  src in constant, spans)


#: A piece of one dim of a tensor: ``(source dim, size, inner)``, ``size`` consecutive
#: factors of that dim of the tensor a chain of views starts from (``inner``: the product of
#: its factors inside the piece); size 0: which of its factors is not known.
_Piece = tuple[int, int, int]


def _pieces(chain: Sequence[OpNode], shape: tuple[int, ...]) -> list[tuple[_Piece, ...]]:
    """The pieces of the dims of the tensor the views ``chain`` (the consumer's side first)
    start from that each dim of their result (of ``shape``) holds, unit pieces left out: a
    reshape's dims are followed factor by factor (``[seq, batch, heads * head_dim]`` viewed
    as ``[seq, batch * heads, head_dim]`` and then as ``[batch, heads, seq, head_dim]``: the
    heads run along the first tensor's last dim only)."""
    base = chain[-1].inputs[0].shape if chain and chain[-1].inputs else shape
    pieces: list[tuple[_Piece, ...]] = [((d, n, 1),) for d, n in enumerate(base)]
    for n in reversed(chain):
        if not n.inputs:
            pieces = [() for _ in n.shape]
            continue
        pieces = _view_pieces(n, pieces, n.inputs[0].shape)
    return [tuple(p for p in ps if p[1] != 1) for ps in pieces]


def _packed_heads(dims: tuple[int | None, ...], pieces: Sequence[tuple[_Piece, ...]],
                  features: int) -> tuple[int | None, ...]:
    """``dims`` with the heads of a packed projection mapped to its output features
    (``_through_views``): of the dims a view left unmapped that hold one piece of the
    features dim, not its innermost (a head's width), the outermost (``[batch, heads, seq,
    head_dim]`` of ``[tokens, 3 * heads * head_dim]``: the heads). Heads merged with the
    sequences (``[batch * heads, seq, head_dim]``, batch > 1) hold two pieces: none."""
    if features in dims:
        return dims
    held = [(ps[0][2], d) for d, ps in enumerate(pieces)
            if dims[d] is None and len(ps) == 1 and ps[0][0] == features and ps[0][1] > 1
            and ps[0][2] > 1]
    if not held:
        return dims
    d = max(held)[1]
    return (*dims[:d], features, *dims[d + 1:])


def _view_pieces(n: OpNode, pieces: list[tuple[_Piece, ...]], x: tuple[int, ...]
                 ) -> list[tuple[_Piece, ...]]:
    """The pieces each output dim of view ``n`` holds, from its input's ``pieces`` (input
    shape ``x``)."""
    out = n.shape
    if n.view_groups is None:  # a permutation, selection, broadcast or slice
        spans = n.view_spans if n.view_spans is not None else tuple(
            () if d is None else (d,) for d in (n.view_map or ()))
        res: list[tuple[_Piece, ...]] = []
        for d in range(len(out)):
            span = spans[d] if d < len(spans) else ()
            got = [p for e in span if e < len(pieces) for p in pieces[e]]
            if len(span) == 1 and span[0] < len(x) and x[span[0]] != out[d]:
                got = [(p[0], 0, 0) for p in got]  # a slice: which factors it keeps is unknown
            res.append(tuple(got))
        return res
    res = [() for _ in out]
    for gi, gj in n.view_groups:
        queue = [p for d in gi if d < len(pieces) for p in pieces[d] if p[1] != 1]
        for d, part in zip(gj, _cut(queue, [out[d] for d in gj]), strict=True):
            res[d] = part
    return res


def _cut(queue: list[_Piece], sizes: list[int]) -> list[tuple[_Piece, ...]]:
    """The pieces ``queue`` (outermost first) cut into dims of ``sizes``, splitting a piece
    where a dim takes part of its factors; where the sizes do not fall on the pieces' factors
    (or those are unknown), every dim holds some of each piece's source dim, unknown which."""
    q = list(queue)
    parts: list[tuple[_Piece, ...]] = []
    known = all(p[1] > 0 for p in q)
    for size in sizes:
        part: list[_Piece] = []
        need = size
        while known and need > 1:
            if not q:
                known = False
                break
            dim, k, inner = q[0]
            if need % k == 0:
                part.append(q.pop(0))
                need //= k
            elif k % need == 0:
                part.append((dim, need, inner * (k // need)))
                q[0] = (dim, k // need, inner)
                need = 1
            else:
                known = False
        parts.append(tuple(part))
    if known:
        return parts
    dims = sorted({p[0] for p in queue})
    return [tuple((d, 0, 0) for d in dims) if size > 1 else () for size in sizes]


def _holds_tokens(inp: _Input, d: int, tokens: dict[int, frozenset[int]]) -> bool:
    """Whether dim ``d`` of a consumer's input ``inp`` runs along a token dim of its source
    (``tokens``, per node); every dim of a model input does (its samples and tokens)."""
    if inp.source < 0:
        return not inp.param and not inp.constant
    return not inp.spans[d].isdisjoint(tokens.get(inp.source, ()))


#: Seconds charged for a conversion ``tensor_parallel`` bars (a cost no layout approaches,
#: so the ILP never picks it while any other layout exists).
_BARRED_S = 1e3
#: Ops linear in one tensor input alone, which a partial sum passes through unreduced: the
#: first input of a gather or a sum; either factor of a product of two tensors computed
#: from the inputs (not a constant's scaling, such as rotary embeddings' sines and cosines,
#: which would let a layer's projections leave their partial sums for later). A sum of
#: partial sums is itself partial: ``add`` with every input partial; rows put into a
#: tensor by index (a MoE layer's expert outputs back in token order) with both partial.
_LINEAR_FIRST = ("index_select", "gather", "index", "sum")
_LINEAR_EITHER = ("mul",)
_LINEAR_ALL = ("add", "sub")
_LINEAR_PUT = ("index_put", "index_put_", "_index_put_impl_")
#: Seconds added to a strategy that carries a partial sum on: where reducing first costs the
#: same, the reduction stays where it was (next to the matmul that made the sum).
_CARRY_S = 1e-9


def _scatters(src: Layout, need: Layout) -> bool:
    """Whether converting ``src`` to ``need`` reduce-scatters a partial sum on some axis:
    tensor parallelism without sequence parallelism only all-reduces them, leaving the
    residual stream whole on every rank (Megatron-LM's ``g`` operator, Shoeybi et al. 2019,
    Fig. 3)."""
    return any(a == PARTIAL and b >= 0 for a, b in zip(src, need, strict=True))


def _taking(src: Layout, dst: Layout) -> Layout:
    """``dst`` with ``src``'s placement on each axis where ``dst`` takes a partial sum: a
    partial sum can be made of anything locally (one rank keeps its part, the others add
    zeros), so nothing is converted there."""
    return tuple(a if b == PARTIAL else b for a, b in zip(src, dst, strict=True))


def _rify(layout: Layout) -> Layout:
    return tuple(REPLICATE if p == PARTIAL else p for p in layout)


def grouped_mm(n: OpNode) -> bool:
    """Whether node ``n`` is a ``torch._grouped_mm`` of rows by the matrices of their groups
    (``[M, K] x [G, K, N]``: a MoE layer's local experts as one kernel)."""
    return n.aten == "_grouped_mm" and len(n.inputs) >= 2 and len(n.inputs[1].shape) == 3


def matmul_operands(n: OpNode) -> tuple[int, int]:
    """Indices, among matmul node ``n``'s inputs, of its two operands: the last two (a bias
    comes first in ``addmm``), or a grouped matmul's first two (its offsets come last)."""
    return (0, 1) if grouped_mm(n) else (-2, -1)


#: View-family ops that move data: dtype casts and copies (a kernel each, reading and
#: writing the tensor; their backward casts or copies the gradient back).
COPY_OPS = ("_to_copy", "clone", "contiguous", "copy_", "copy")


class ShardingProblem:
    """The strategies of every node of ``graph``'s sharding graph on ``mesh`` of
    ``cluster``'s GPUs, for ``job`` (precision, optimizer), with ``micro_batches`` per step
    and ``in_flight`` micro-batches' activations held; ``budget`` bytes of memory for the
    whole graph (default: the mesh's GPUs).

    ``tensor_parallel``: the mesh's devices are one tensor-parallel group: they see the same
    tokens, so no op splits a loop that runs along the model inputs' dims (``token_dims``),
    and every weight of two or more dims is split over each axis of more than one device
    where the op can split it (Megatron-LM's column/row and vocabulary-parallel layers are
    the layouts that remain; Shoeybi et al. 2019, Sec. 3). ``sequence_parallel``: besides,
    the memory-bound ops (norms, elementwise, dropout) may split the tokens, with all-gathers
    and reduce-scatters between the regions (Korthikanti et al. 2022, Sec. 4.2.2)."""

    def __init__(self, graph: LayerGraph, mesh: Mesh, cluster: Cluster, job: Job, *,
                 micro_batches: int = 1, in_flight: int = 1, budget: float | None = None,
                 tensor_parallel: bool = False, sequence_parallel: bool = False) -> None:
        self.graph, self.mesh, self.cluster, self.job = graph, mesh, cluster, job
        self.micro_batches, self.in_flight = int(micro_batches), int(in_flight)
        self.budget = float(cluster.gpu.memory_bytes if budget is None else budget)
        self.topo = Topology.of(cluster)
        self.dtype = "bf16" if job.precision == "fp8" else job.precision
        self.elem = 4.0 if job.precision == "fp32" else 2.0
        self.tensor_parallel = tensor_parallel
        self.sequence_parallel = sequence_parallel
        self.nodes, self.inputs, self.saved, self.saved_copies = self._contract()
        self.token_dims = self._token_dims()
        #: The token dims loops carry from the model's inputs (a routing op's output, whose
        #: every dim may hold tokens in ``token_dims``, has none): where attention scores,
        #: queries by keys, are told apart from a MoE layer's routed tokens [tokens x top-k,
        #: hidden] (``costmodel.blockcosts``).
        self.score_dims = self._token_dims(certain=True)
        self.repeat = {x.name: x.repeat for x in graph.layers}
        self.layer = {v: graph.node(v).layer for v in self.nodes}
        self.weight = {v: self.repeat.get(self.layer[v], 1) for v in self.nodes}
        self.param_state = self._param_state()
        seen: set[str] = set()
        self.charged: dict[int, set[str]] = {}
        for v in self.nodes:
            mine = {i.param for i in self.inputs[v] if i.param and i.param not in seen}
            self.charged[v] = mine
            seen |= mine
        self.routers = self._routers()
        self.routing_topks = self._routing_topks()
        self.routed = self._routed()
        self.strategies = {v: self._strategies(v) for v in self.nodes}
        self.follow = self._followers()
        self.groups = self._groups()
        self._classes = [self._group_classes(g) for g in self.groups]

    # ---- building ----------------------------------------------------------------------

    def _contract(self) -> tuple[list[int], dict[int, list[_Input]],
                                 dict[int, list[tuple[int, float]]], dict[int, list[bool]]]:
        """The real forward nodes, their inputs traced through views, the tensors each
        saves for backward: (the real node that produced it, bytes), and whether each of
        those is a copy of that node's output (a dtype cast: an autocast linear's input)."""
        g = self.graph
        fw = [i for i in sorted(g.graph.nodes) if not g.node(i).backward]
        node = {i: g.node(i) for i in fw}
        constant: set[int] = set()
        for i in fw:
            n = node[i]
            if not any(r.param or r.source < 0 or r.source not in constant for r in n.inputs) \
                    and (n.inputs or n.family == "view") and n.family != "unknown":
                constant.add(i)
        real = [i for i in fw if i not in constant and node[i].family != "view"]

        def origin(i: int) -> int:
            """The real node a tensor produced by node ``i`` comes from (-1: none)."""
            while i >= 0 and i in node and i not in constant and node[i].family == "view":
                i = node[i].inputs[0].source if node[i].inputs else -1
            return i if i in node and i not in constant else -1

        def copied(i: int) -> bool:
            """Whether a tensor produced by node ``i`` is a copy of its real node's."""
            while i >= 0 and i in node and i not in constant and node[i].family == "view":
                if node[i].output_bytes and node[i].aten in COPY_OPS:
                    return True
                i = node[i].inputs[0].source if node[i].inputs else -1
            return False

        saved: dict[int, list[tuple[int, float]]] = {i: [] for i in real}
        copies: dict[int, list[bool]] = {i: [] for i in real}
        for i in fw:  # a view's saved tensors belong to the real node it views
            if i in constant or not node[i].saved_bytes:
                continue
            at = i if i in saved else origin(i)
            if at in saved:
                saved[at] += [(origin(src), nbytes) for src, nbytes in node[i].saved_from]
                copies[at] += [copied(src) for src, _ in node[i].saved_from]
        # An nn.MultiheadAttention's projections of its packed weight (``_through_views``).
        attention = set(g.multihead_attention)
        packed = frozenset(v for v in real if node[v].family == "matmul"
                           and node[v].module in attention
                           and any(r.param for r in node[v].inputs))
        inputs = {v: [_through_views(node, constant, r, packed) for r in node[v].inputs]
                  for v in real}
        if not real:
            raise SpecError(f"{g.name}: the graph has no forward ops to shard")
        return real, inputs, saved, copies

    def _token_dims(self, certain: bool = False) -> dict[int, frozenset[int]]:
        """The dims of each node's output that run along the model inputs' dims (the
        samples and tokens of the micro-batch): a loop carries them from an input to the
        output. ``certain``: only the dims loops carry, none of a routing op's output
        (``score_dims``)."""
        out: dict[int, frozenset[int]] = {}
        for v in self.nodes:
            n = self.graph.node(v)
            if not n.loops and self._meets_tokens(v, out):
                # An op without loops (routing: top-k, index_add, index_select) moves the
                # tokens somewhere in its output: every dim may hold them (a MoE layer's
                # expert slots hold its tokens, which its experts' matmuls then meet).
                out[v] = frozenset() if certain else frozenset(range(len(n.shape)))
                continue
            out[v] = frozenset(lp.out for lp in n.loops
                               if lp.out is not None and self._on_tokens(v, lp, out))
            if n.aten == "cat":
                out[v] |= self._joined_tokens(v, out)
            elif n.family in ("conv", "pool") and self._meets_tokens(v, out):
                # A convolution's or pooling's output positions run along its input's (no
                # loop splits them: ``costmodel.sharding``): an image's pixels, a ViT's
                # patches, are its tokens.
                out[v] |= frozenset(d for d in range(2, len(n.shape)) if n.shape[d] > 1)
        return out

    def _joined_tokens(self, v: int, tokens: dict[int, frozenset[int]]) -> frozenset[int]:
        """The dims of a concatenation's output along which some input holds tokens (a
        concatenation has no loop along the dim it joins: a ViT's class token joined to its
        patches along the sequence leaves a sequence of tokens)."""
        shape = self.graph.node(v).shape
        return frozenset(d for inp in self.inputs[v] if len(inp.spans) == len(shape)
                         for d, span in enumerate(inp.spans)
                         if shape[d] > 1 and span and _holds_tokens(inp, d, tokens))

    def _meets_tokens(self, v: int, tokens: dict[int, frozenset[int]]) -> bool:
        """Whether an input of node ``v`` carries the micro-batch's samples or tokens: a model
        input, or an output with token dims in ``tokens``."""
        return any((i.source >= 0 and bool(tokens.get(i.source)))
                   or (i.source < 0 and not i.param and not i.constant)
                   for i in self.inputs[v])

    def _on_tokens(self, v: int, lp: Loop, tokens: dict[int, frozenset[int]]) -> bool:
        """Whether loop ``lp`` of node ``v`` runs along a token dim of one of its inputs (through
        views, along any dim its input dim runs along: ``[batch * seq]`` viewed as ``[batch,
        seq]`` has tokens on both)."""
        return any(d is not None and d < len(inp.dims) and _holds_tokens(inp, d, tokens)
                   for inp, d in zip(self.inputs[v], lp.ins, strict=False))

    def mixes_tokens(self, v: int) -> bool:
        """Whether node ``v`` reduces or contracts over the samples or tokens of the micro-batch
        outside a fused attention kernel (an unfused attention's softmax and weighted sum,
        a token-mixing MLP, a batch norm): what splitting the sequence over context-parallel
        ranks would need more than ring attention for."""
        n = self.graph.node(v)
        return n.family != "attention" and any(
            lp.out is None and self._on_tokens(v, lp, self.token_dims) for lp in n.loops)

    def _routers(self) -> set[int]:
        """The matmuls whose output only chooses experts: a top-k reads it through memory-
        bound ops (a softmax, a cast). Megatron-LM keeps a router's small weight whole on
        every tensor-parallel rank (``megatron/core/transformer/moe/router.py``), so
        ``tensor_parallel`` need not split it."""
        out: set[int] = set()
        for v in self.nodes:
            if self.graph.node(v).aten != "topk":
                continue
            stack, seen = [v], {v}
            while stack:
                for inp in self.inputs[stack.pop()]:
                    u = inp.source
                    if u < 0 or u in seen:
                        continue
                    seen.add(u)
                    family = self.graph.node(u).family
                    if family == "matmul":
                        out.add(u)
                    elif family in _LIGHT:
                        stack.append(u)
        return out

    def _routing_topks(self) -> dict[int, tuple[int, int]]:
        """The top-k nodes that route tokens to experts, each with (experts each token goes
        to, experts): a ``topk`` over the router's scores keeping fewer than it chooses
        among, its k the last dim of its output, the experts that of its input."""
        out: dict[int, tuple[int, int]] = {}
        for v in self.nodes:
            n = self.graph.node(v)
            if n.aten != "topk" or not n.shape:
                continue
            src = self.inputs[v][0].source if self.inputs[v] else -1
            scores = self.graph.node(src).shape if src >= 0 else ()
            if scores and n.shape[-1] < scores[-1]:
                out[v] = (n.shape[-1], scores[-1])
        return out

    def _routed(self) -> set[int]:
        """The nodes of each MoE layer's expert block: those of the module that runs its
        routing top-k (``routing_topks``), and of that module's children (the router, the
        experts, the shared experts)."""
        blocks = {self.layer[v]: self.graph.node(v).module for v in self.routing_topks}
        out = set()
        for v in self.nodes:
            prefix, module = blocks.get(self.layer[v]), self.graph.node(v).module
            if prefix is not None and (module == prefix or module.startswith(prefix + ".")):
                out.add(v)
        return out

    def _tensor_parallel_ok(self, v: int, loops: list[Loop | None],
                            lays: list[Layout]) -> bool:
        """Under ``tensor_parallel``: no loop on tokens, every weight matrix that meets the
        tokens split on every axis of more than one device, and what does not meet them
        whole (a table looked up by constant positions, as Megatron-LM keeps its position
        embeddings); a convolution, and (without sequence parallelism) an op of the model's
        own forward outside its modules other than a matmul or lookup, whole; no reduction
        split along a loop it sums over, except along the tokens (sequence parallelism); an
        ``nn.MultiheadAttention``'s projections split as its heads style splits them
        (``_attention_role``)."""
        node = self.graph.node(v)
        if not node.module and not self.sequence_parallel \
                and node.family not in ("matmul", "embedding"):
            # An op of the model's own forward, outside its modules (a ViT's class token
            # joined to its patches, positions added): no module boundary to put a style on,
            # so it runs whole on every rank (with sequence parallelism, a split there is
            # refused by name: ``LayerCosts.tp_plan``).
            return all(lp is None for lp in loops)
        if node.family == "conv":
            # A convolution stays whole on every tensor-parallel rank: no TP style of the
            # runtime (``planner.runtime.apply.tp_style``) splits one, and Megatron-LM keeps
            # a ViT's patch embedding whole too (a plain torch.nn.Linear on every rank,
            # megatron/legacy/model/vision/vit_backbone.py).
            return all(lp is None for lp in loops)
        # Sequence parallel: the memory-bound ops may split the tokens, and so may a MoE
        # layer's router, which Megatron-Core runs on the sequence-parallel hidden states
        # before its dispatcher gathers the tokens (megatron/core/transformer/moe/
        # moe_layer.py: the router, then the token dispatcher's all-gather).
        light = self.sequence_parallel and (node.family in _LIGHT or v in self.routers)
        for size, lp in zip(self.mesh.shape, loops, strict=True):
            on_tokens = lp is not None and self._on_tokens(v, lp, self.token_dims)
            if size > 1 and lp is not None and not light and on_tokens:
                return False
            certain = self.score_dims.get(v) or frozenset()
            if size > 1 and light and lp is not None and lp.out in certain \
                    and lp.out != max(certain):
                # Sequence parallelism splits the sequence, the innermost of the dims that
                # loops carry tokens along (torch's SequenceParallel shards dim 1 of [batch,
                # seq, ...]), not the samples of a micro-batch traced with more than one.
                return False
            if size > 1 and lp is not None and lp.out is None and not on_tokens \
                    and node.family == "reduction":
                # A sum over split features, leaving partial sums: no TP style runs one.
                # Between a column- and a row-parallel linear each rank runs the ops on its
                # local shard (the styles hand on local tensors), so such a sum would be
                # that rank's part only; elsewhere the module runs whole (a norm's
                # statistics over the hidden size: Megatron-LM and torchtitan compute them
                # on every rank, or on sequence shards with sequence parallelism).
                return False
            if size > 1 and lp is None and light and v not in self.routed:
                # Sequence parallel: no memory-bound op runs replicated, except in a MoE
                # layer's expert block, which Megatron-LM runs on the gathered tokens (its
                # routing and combine whole on each rank, the experts' partial sums
                # reduce-scattered once after the combine).
                return False
        if not self._meets_tokens(v, self.token_dims):
            return all(lp is None for lp in loops)
        if v in self.routers:
            return True  # whole or split, the ILP's to choose
        want = self._attention_role(v)
        if want is not None and any(size > 1 and (lp is None or lp.role != want)
                                    for size, lp in zip(self.mesh.shape, loops, strict=True)):
            return False
        refs = self.graph.node(v).inputs
        for axis, size in enumerate(self.mesh.shape):
            if size == 1:
                continue
            for inp, ref, lay in zip(self.inputs[v], refs, lays, strict=True):
                if inp.param and len(ref.shape) >= 2 and lay[axis] == REPLICATE:
                    return False
        return True

    def _attention_role(self, v: int) -> str | None:
        """The loop an ``nn.MultiheadAttention``'s projection ``v`` splits over TP, as the one
        style that runs the module split (``HeadParallel``, Megatron-LM's attention) splits
        it: its packed input projection (or the separate query, key and value ones) by output
        features, the heads (``"n"``); its output projection by input features (``"k"``).
        ``None`` for any other op. Another split (a cross-attention's key and value
        projection split by its input features, say) is a layout no style runs, which the
        search would then refuse for the whole degree (``LayerCosts.tp_refusal``)."""
        n = self.graph.node(v)
        if n.family != "matmul" or n.module not in self.graph.multihead_attention:
            return None
        for inp in self.inputs[v]:
            name = inp.param.rsplit(".", 2)
            if name[-1] == "weight" and len(name) > 1 and name[-2] == "out_proj":
                return "k"
            if name[-1] in ("in_proj_weight", "q_proj_weight", "k_proj_weight",
                            "v_proj_weight"):
                return "n"
        return None

    def _followers(self) -> dict[int, tuple[int, list[int]]]:
        """Light ops whose tensor inputs all come from one node follow its layout (Alpa's
        merging of simple operators into their operand, Zheng et al. 2022, Sec. 4.2):
        follower -> (leader, the follower's strategy for each of the leader's strategies:
        of those that take the leader's output as it is, one that keeps its layout (a
        follower splitting a whole tensor for free would leave its consumers a gather to
        pay), else the cheapest; else replicated)."""
        out: dict[int, tuple[int, list[int]]] = {}
        for v in self.nodes:
            n = self.graph.node(v)
            sources = {i.source for i in self.inputs[v] if i.source >= 0}
            if n.family not in _LIGHT or len(sources) != 1 or any(
                    st.label in ("P", "bwd:P") for st in self.strategies[v]):
                continue  # (an op that may carry a partial sum is the ILP's to choose)
            u = sources.pop()
            if self.layer[u] != self.layer[v]:
                continue  # a block's entry: the traced instance's source stands for one only
            slot = next(j for j, i in enumerate(self.inputs[v]) if i.source == u)
            mine = self.strategies[v]
            plain = next((k for k, st in enumerate(mine) if all(a is None for a in st.axes)),
                         0)
            f = []
            for st in self.strategies[u]:
                want = _rify(st.out)
                fits = [k for k, t in enumerate(mine) if t.ins[slot] == want]
                f.append(min(fits, key=lambda k: (mine[k].out != want, mine[k].compute_s, k))
                         if fits else plain)
            out[v] = (u, f)
        return out

    def free_nodes(self) -> list[int]:
        """The nodes whose strategy is chosen (the others follow a leader)."""
        return [v for v in self.nodes if v not in self.follow]

    def complete(self, choice: dict[int, int]) -> dict[int, int]:
        """``choice`` of the free nodes extended to the followers."""
        full = dict(choice)
        for v in self.nodes:
            if v in self.follow:
                u, f = self.follow[v]
                full[v] = f[full[u]]
        return full

    def _param_state(self) -> float:
        """Bytes per parameter of weights, gradients and optimizer state."""

        return float(sum(state_bytes(self.job, self)))

    @property
    def hidden_size(self) -> int:
        """The widest parameter dim: the width Adafactor's factored state is divided by
        (``costmodel.states.Widths``)."""
        return max((max(r.shape) for v in self.nodes for r in self.graph.node(v).inputs
                    if r.param and r.shape), default=1)

    def _assignments(self, loops: tuple[Loop, ...]) -> Iterator[tuple[int | None, ...]]:
        choices = [[None] if n == 1 else [None, *range(len(loops))] for n in self.mesh.shape]
        for axes in itertools.product(*choices):
            ok = True
            for li in {a for a in axes if a is not None}:
                f = math.prod(n for n, a in zip(self.mesh.shape, axes, strict=True) if a == li)
                ok &= loops[li].size % f == 0
            if ok:
                yield axes

    def _strategies(self, v: int, rules: bool = True) -> list[Strategy]:
        """Node ``v``'s strategies; ``rules``: apply ``tensor_parallel``'s rules."""
        n = self.graph.node(v)
        ins = self.inputs[v]
        out: list[Strategy] = []
        for axes in self._assignments(n.loops):
            loops = [None if a is None else n.loops[a] for a in axes]
            o = tuple(REPLICATE if lp is None else PARTIAL if lp.out is None else lp.out
                      for lp in loops)
            lays, grads = [], []
            for i, inp in enumerate(ins):
                lay, grd = [], []
                for lp in loops:
                    d = None if lp is None or i >= len(lp.ins) else lp.ins[i]
                    s = inp.dims[d] if d is not None and d < len(inp.dims) else None
                    lay.append(REPLICATE if s is None else s)
                    partial = lp is not None and lp.out is not None and d is None
                    grd.append(PARTIAL if partial else REPLICATE if s is None else s)
                lays.append(tuple(lay))
                grads.append(tuple(grd))
            if rules and self.tensor_parallel and not self._tensor_parallel_ok(v, loops, lays):
                continue
            compute, backward = self._compute(n, loops)
            compute += self._statistics(loops)
            sync = mem = 0.0
            for inp, layout, grad_layout in zip(ins, lays, grads, strict=True):
                if inp.source < 0 and inp.grad:
                    sync += reshard_time(self.topo, self.mesh.shape, self.mesh.strides,
                                         grad_layout, layout, inp.nbytes)
                if inp.param in self.charged[v]:
                    shards = math.prod(m for m, p in zip(self.mesh.shape, layout, strict=True)
                                       if p >= 0)
                    mem += self.param_state * inp.numel / shards
            act = self._saved_bytes(v, ins, o, lays)
            mem += act * self.in_flight
            label = "|".join("R" if lp is None else lp.role or
                             ("sum" if lp.out is None else f"d{lp.out}") for lp in loops)
            out.append(Strategy(axes, label, o, tuple(lays), tuple(grads), compute, backward,
                                sync, mem, act))
        if not out:  # nothing satisfies tensor_parallel's rules: replicated, as it must be
            out = [st for st in self._strategies(v, rules=False)
                   if all(a is None for a in st.axes)]
        if rules:  # (sequence parallel leaves a memory-bound op no replicated strategy)
            plain = [st for st in out if all(a is None for a in st.axes)] or [
                st for st in self._strategies(v, rules=False) if all(a is None for a in st.axes)]
            out += self._carries(v, plain)
        return out

    def _carries(self, v: int, plain: list[Strategy]) -> list[Strategy]:
        """Strategies of node ``v`` that take a partial sum on one mesh axis and hand it on
        unreduced, where ``v`` is linear in the inputs that take it (``_LINEAR_FIRST``,
        ``_LINEAR_EITHER``, ``_LINEAR_ALL``): a MoE layer's expert outputs, partial over
        tensor parallel, are then gathered back to their tokens, weighted and summed
        before one reduction of the tokens' size, as Megatron-LM's row-parallel experts do
        (not of the top-k times larger routed copies). ``plain``: ``v``'s replicated
        strategies, each of which the new ones copy. The gradient of a factor multiplied by
        a partial sum is partial too. Nothing is carried through an op reading a
        parameter (its gradient would be partial), nor through one reading a tensor from
        outside its layer."""
        name = self.graph.node(v).aten
        ins = self.inputs[v]
        tensors = [i for i, inp in enumerate(ins) if not inp.constant]
        if any(ins[i].source < 0 or self.layer.get(ins[i].source) != self.layer[v]
               for i in tensors):
            # A partial sum stays inside its layer: blocks are costed one by one
            # (``costmodel.blockcosts``), each taking and handing on whole tensors.
            return []
        if any(inp.param for inp in ins) or not tensors or not plain:
            return []
        sets: list[tuple[int, ...]]
        if name in _LINEAR_FIRST:
            sets = [(0,)] if 0 in tensors else []
        elif name in _LINEAR_EITHER and len(tensors) > 1:
            sets = [(i,) for i in tensors]
        elif name in _LINEAR_ALL and len(tensors) > 1:
            sets = [tuple(tensors)]
        elif name in _LINEAR_PUT and len(tensors) > 1:
            sets = [(tensors[0], tensors[-1])]  # the tensor put into, the rows put
        else:
            return []
        out = []
        for st in plain:
            for a, size in enumerate(self.mesh.shape):
                if size == 1:
                    continue

                def put(lay: Layout, a: int = a) -> Layout:
                    return tuple(PARTIAL if b == a else x for b, x in enumerate(lay))

                cost = st.compute_s + _CARRY_S
                for carried in sets:
                    # Forward: the carried inputs are partial, so is the output; the gradient
                    # of any other factor (a product's weights) is partial as well.
                    lays = tuple(put(lay) if i in carried else lay
                                 for i, lay in enumerate(st.ins))
                    grads = tuple(put(g) if i not in carried and ins[i].grad and i in tensors
                                  else g for i, g in enumerate(st.grads))
                    out.append(Strategy(st.axes, "P", put(st.out), lays, grads, cost,
                                        st.backward_s, st.sync_s, st.memory,
                                        st.activation_bytes))
                # Backward: a partial gradient of the output gives partial gradients of
                # every input (the backward of a linear op is linear in that gradient).
                grads = tuple(put(g) if ins[i].grad and i in tensors else g
                              for i, g in enumerate(st.grads))
                out.append(Strategy(st.axes, "bwd:P", st.out, st.ins, grads, cost,
                                    st.backward_s, st.sync_s, st.memory, st.activation_bytes,
                                    out_grad=put(st.grad_layout)))
        return out

    def _statistics(self, loops: list[Loop | None]) -> float:
        """Seconds of the all-reduces of statistics an op needs over the loops it splits
        (``Loop.all_reduce_bytes``, e.g. a vocabulary-parallel softmax)."""
        t = 0.0
        for a, lp in enumerate(loops):
            if lp is not None and lp.all_reduce_bytes and self.mesh.shape[a] > 1:
                t += float(self.topo.all_reduce(lp.all_reduce_bytes, self.mesh.shape[a],
                                                self.mesh.strides[a]))
        return t

    def _saved_bytes(self, v: int, ins: list[_Input], out: Layout, lays: list[Layout]
                     ) -> float:
        """Bytes node ``v`` saves for backward on one device: each saved tensor in the
        layout ``v`` holds it in (an input's as ``v`` reads it, else the output's)."""
        def share(layout: Layout) -> int:
            return math.prod(m for m, p in zip(self.mesh.shape, layout, strict=True) if p >= 0)

        total = 0.0
        for src, nbytes in self.saved[v]:
            slot = next((i for i, inp in enumerate(ins) if src >= 0 and inp.source == src
                         and src != v), None)
            total += nbytes / share(out if slot is None else lays[slot])
        return total

    def _compute(self, n: OpNode, loops: list[Loop | None]) -> tuple[float, float]:
        """(forward + backward, backward) seconds of ``n`` on its shard."""
        gpu = self.cluster.gpu
        split: dict[int, int] = {}
        for size, lp in zip(self.mesh.shape, loops, strict=True):
            if lp is not None:
                split[id(lp)] = split.get(id(lp), 1) * size
        shards = math.prod(split.values())
        roles = {lp.role: lp.size / split.get(id(lp), 1) for lp in n.loops if lp.role}
        if n.family == "matmul" and {"m", "n", "k"} <= set(roles):
            m, nn, k, b = roles["m"], roles["n"], roles["k"], roles.get("b", 1.0)
            e = self.elem
            fwd = float(gemm_time(gpu, self.dtype, m, nn, k, b, e))
            needs = [r.grad for r in n.inputs]
            ia, ib = matmul_operands(n)
            a_grad = needs[ia] if len(needs) >= 2 else False
            b_grad = needs[ib] if needs else False
            bwd = (float(gemm_time(gpu, self.dtype, m, k, nn, b, e)) if a_grad else 0.0) \
                + (float(gemm_time(gpu, self.dtype, k, nn, m, b, e)) if b_grad else 0.0)
            return fwd + bwd, bwd
        if n.family == "attention" and n.model_flops:
            attn_fwd, attn_bwd = flash_attention_time(gpu, self.dtype, n.model_flops / shards,
                                                      n.attention_keys,
                                                      attention_kernel(self.job, gpu))
            bwd_s = float(attn_bwd) if n.grad else 0.0
            return float(attn_fwd) + bwd_s, bwd_s
        moved = (sum(r.nbytes for r in n.inputs) + n.output_bytes) / shards
        if n.model_flops:  # convolution and other FLOP-heavy ops: roofline
            eff = gpu.efficiency
            t = max(n.model_flops / shards / (gpu.peak_flops(self.dtype) * eff.gemm_for(
                self.dtype)), moved / (gpu.memory_bandwidth_bytes_per_s * eff.memory)) \
                + eff.kernel_overhead_s
            bwd = 2.0 * t if n.grad else 0.0
            return t + bwd, bwd
        fwd = float(memory_time(gpu, moved, 1.0))
        bwd = BACKWARD_BYTES * fwd if n.grad else 0.0
        return fwd + bwd, bwd

    def _moved(self, v: int, slot: int, inp: _Input) -> float:
        """Bytes a conversion of the tensor that node ``v`` reads at ``slot`` moves: the
        tensor its producer made (``inp``, traced back through views), or where ``v`` reads
        a select of it (fewer dims, fewer elements: ``x[:, 0]``), that part. A ViT's class
        token, picked from the last block's output, is gathered alone, and in backward its
        gradient is gathered before the select's backward scatters it into zeros on each
        rank (``torch.select_backward``). A slice keeps the producer's bytes: the slices of
        an ``nn.MultiheadAttention``'s packed projection are split by heads with it (a
        layout of part of it alone is one no TP style runs)."""
        ref = self.graph.node(v).inputs[slot]
        source = self.graph.node(inp.source).shape if inp.source >= 0 else ref.shape
        if len(ref.shape) < len(source) and ref.nbytes < inp.nbytes:
            return float(ref.nbytes)
        return inp.nbytes

    def _groups(self) -> list[_Group]:
        groups: dict[tuple[int, int, float], _Group] = {}
        for v in self.nodes:
            for slot, inp in enumerate(self.inputs[v]):
                u = inp.source
                if u < 0:
                    continue
                same = self.layer[u] == self.layer[v]
                w = self.weight[v] if same else 1
                nbytes = self._moved(v, slot, inp)
                key = (u, w, nbytes)
                if key not in groups:
                    groups[key] = _Group(u, w, nbytes, inp.grad)
                groups[key].consumers.append((v, slot))
        # The block after a repeated block reads its input from that block's output: one
        # pseudo-edge per entry into the block, charged repeat - 1 times.
        for lname, r in self.repeat.items():
            if r < 2:
                continue
            inside = [v for v in self.nodes if self.layer[v] == lname]
            leaving = [u for u in inside if any(
                i.source == u for v in self.nodes if self.layer[v] != lname
                for i in self.inputs[v])]
            for v in inside:
                for slot, inp in enumerate(self.inputs[v]):
                    if inp.source < 0 or self.layer[inp.source] == lname:
                        continue
                    shape = self.graph.node(inp.source).shape
                    for u in leaving:
                        if self.graph.node(u).shape == shape:
                            nbytes = self._moved(v, slot, inp)
                            key = (u, -(r - 1), nbytes)
                            if key not in groups:
                                groups[key] = _Group(u, r - 1, nbytes, inp.grad)
                            groups[key].consumers.append((v, slot))
                            break
        return list(groups.values())

    def _convert(self, src: Strategy, need: Layout, grad: Layout | None, nbytes: float
                 ) -> float:
        """Seconds to convert producer strategy ``src``'s output into the layout ``need``
        and, backward, the gradient from ``grad`` into the one ``src`` takes. A partial
        gradient may be taken from any layout at no cost (one rank keeps its part, the
        others add zeros); a partial forward input only from a partial output."""
        out = src.out
        if any(b == PARTIAL and a != PARTIAL for a, b in zip(out, need, strict=True)):
            return _BARRED_S
        back = None if grad is None else _taking(grad, src.grad_layout)
        if self.tensor_parallel and not self.sequence_parallel and (_scatters(out, need) or (
                grad is not None and back is not None and _scatters(grad, back))):
            # (tensor parallel without SP only all-reduces partial sums)
            return _BARRED_S
        m, s = self.mesh.shape, self.mesh.strides
        t = reshard_time(self.topo, m, s, out, need, nbytes)
        if grad is not None and back is not None:
            t += reshard_time(self.topo, m, s, grad, back, nbytes)
        return t

    def _group_classes(self, g: _Group) -> tuple[dict[tuple[Layout, Layout | None], int],
                                                 np.ndarray]:
        """The classes the consumers of ``g`` may need (class -> column) and the cost of
        converting each producer strategy's output (rows) into each."""
        classes: dict[tuple[Layout, Layout | None], int] = {}
        for v, slot in g.consumers:
            for st in self.strategies[v]:
                classes.setdefault(g.need(st, slot), len(classes))
        cost = np.array([[self._convert(st, need, grad, g.nbytes) for need, grad in classes]
                         for st in self.strategies[g.producer]])
        return classes, cost

    def conversions(self, choice: dict[int, int]
                    ) -> Iterator[tuple[_Group, int, int, float]]:
        """Under ``choice``: every conversion of a producer's output, as (group, the first
        consumer needing that class and its input slot, seconds per micro-batch, charged
        ``group.weight`` times); consumers needing the same class share it."""
        for g, (classes, cost) in zip(self.groups, self._classes, strict=True):
            seen: set[int] = set()
            for v, slot in g.consumers:
                c = classes[g.need(self.strategies[v][choice[v]], slot)]
                if c not in seen:
                    seen.add(c)
                    yield g, v, slot, float(cost[choice[g.producer], c])

    # ---- evaluating --------------------------------------------------------------------

    def evaluate(self, choice: dict[int, int]) -> tuple[float, float]:
        """(objective seconds per step, memory bytes) of strategy ``choice[v]`` per node."""
        m = self.micro_batches
        compute = sync = backward = mem = 0.0
        for v in self.nodes:
            st = self.strategies[v][choice[v]]
            w = self.weight[v]
            compute += w * st.compute_s
            sync += w * st.sync_s
            backward += w * st.backward_s
            mem += w * st.memory
        comm = sum(g.weight * t for g, _v, _slot, t in self.conversions(choice))
        return m * (compute + comm) + max(0.0, sync - backward), mem

    def size(self) -> int:
        """Number of assignments of the free nodes (what brute force enumerates)."""
        return math.prod(len(self.strategies[v]) for v in self.free_nodes())


@dataclass(frozen=True)
class Solution:
    """The chosen strategy index per node, the objective (seconds per step, as the ILP
    minimises it) and the memory (bytes) of the whole graph on one mesh; ``optimal``: the
    solver proved it optimal (else it is the best found within the time limit)."""

    problem: ShardingProblem
    choice: dict[int, int]
    objective_s: float
    memory_bytes: float
    solve_s: float = 0.0
    optimal: bool = True

    def strategy(self, v: int) -> Strategy:
        """The strategy of node ``v``."""
        return self.problem.strategies[v][self.choice[v]]

    def layouts(self) -> list[tuple[int, str, str, str]]:
        """(node, op, strategy label, output layout) of every node."""
        out = []
        for v in self.problem.nodes:
            st = self.strategy(v)
            out.append((v, self.problem.graph.node(v).op, st.label,
                        ",".join(describe(p) for p in st.out)))
        return out

    def collectives(self) -> list[tuple[int, int, str, float]]:
        """(producer, consumer, collectives, seconds per micro-batch) of every conversion
        the layouts insert (propagation: where a consumer needs another layout)."""
        out = []
        for g, v, slot, t in self.problem.conversions(self.choice):
            if t > 0:
                need, grad = g.need(self.strategy(v), slot)
                out.append((g.producer, v, _collective_names(self.strategy(g.producer),
                                                             need, grad), t))
        return out


def _collective_names(src: Strategy, need: Layout, grad: Layout | None) -> str:
    """The collectives converting producer strategy ``src``'s output into ``need`` and,
    backward, the gradient ``grad`` into the layout ``src`` takes it in."""
    def one(a: Layout, b: Layout) -> list[str]:
        names = []
        for axis, (s, d) in enumerate(zip(a, b, strict=True)):
            if s in (d, REPLICATE):
                continue
            kind = ("all-reduce" if d == REPLICATE else "reduce-scatter") if s == PARTIAL \
                else "all-gather" if d == REPLICATE else "all-to-all"
            names.append(f"{kind}@{axis}")
        return names

    fwd = one(src.out, need)
    bwd = one(grad, _taking(grad, src.grad_layout)) if grad is not None else []
    return " ".join(fwd + [f"bwd:{x}" for x in bwd])


def _chosen(options: list[Any]) -> int:
    """The index of the strategy a solved MIP picked among a node's ``options`` (its
    variables): the largest solution value, the first among equals."""
    return max(range(len(options)), key=lambda k: options[k].solution_value())


def solve(problem: ShardingProblem, *, time_limit_s: float = 30.0) -> Solution:
    """The ILP of the module docstring on ``problem`` (OR-Tools' MIP interface with SCIP:
    only ``x`` is integral; ``w`` and ``y`` take 0/1 values at the optimum). Raises
    ``SpecError`` when no assignment fits the memory budget."""
    import time

    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter()
    p = problem
    us = 1e6  # the solver works in microseconds and MiB
    solver = pywraplp.Solver.CreateSolver("SCIP")
    solver.SetNumThreads(1)
    solver.SetTimeLimit(int(time_limit_s * 1000))
    inf = solver.infinity()
    x: dict[int, list[Any]] = {}
    for v in p.nodes:
        if v in p.follow:  # (f) a follower's strategy is a function of its leader's
            u, f = p.follow[v]
            x[v] = [solver.Sum([x[u][k] for k in range(len(f)) if f[k] == j])
                    for j in range(len(p.strategies[v]))]
        else:
            x[v] = [solver.BoolVar(f"x{v}_{k}") for k in range(len(p.strategies[v]))]
            solver.Add(solver.Sum(x[v]) == 1)  # (a)
    objective = []
    m = p.micro_batches
    for gi, (g, (classes, cost)) in enumerate(zip(p.groups, p._classes, strict=True)):
        for cls, c in classes.items():
            if not cost[:, c].any():
                continue
            w = solver.NumVar(0.0, 1.0, f"w{gi}_{c}")
            for v, slot in g.consumers:  # (b)
                members = [x[v][k] for k, st in enumerate(p.strategies[v])
                           if g.need(st, slot) == cls]
                if members:
                    solver.Add(w >= solver.Sum(members))
            # (c) as y[k] = x[u, k] AND w[u, c] (exactly one producer strategy carries the
            # class): sum_k y[k] = w, y[k] <= x[u, k]; z = sum_k r[u, k, c] y[k].
            y = [solver.NumVar(0.0, 1.0, f"y{gi}_{c}_{k}")
                 for k in range(len(p.strategies[g.producer]))]
            solver.Add(solver.Sum(y) == w)
            for k, yk in enumerate(y):
                solver.Add(yk <= x[g.producer][k])
                if cost[k, c]:
                    objective.append(m * g.weight * float(cost[k, c]) * us * yk)
    mib = 2.0**20
    solver.Add(solver.Sum([p.weight[v] * st.memory / mib * x[v][k]  # (d)
                           for v in p.nodes for k, st in enumerate(p.strategies[v])])
               <= p.budget / mib)
    e = solver.NumVar(0.0, inf, "e")
    solver.Add(e >= solver.Sum([p.weight[v] * (st.sync_s - st.backward_s) * us * x[v][k]  # (e)
                                for v in p.nodes for k, st in enumerate(p.strategies[v])]))
    objective.append(e)
    objective += [m * p.weight[v] * st.compute_s * us * x[v][k]
                  for v in p.nodes for k, st in enumerate(p.strategies[v])]
    solver.Minimize(solver.Sum(objective))
    status = solver.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        raise SpecError(f"{p.graph.name} on a {p.mesh.shape[0]}x{p.mesh.shape[1]} mesh: no "
                        f"sharding fits {p.budget / GIB:.1f} GiB; use more GPUs or a "
                        f"smaller batch")
    choice = p.complete({v: _chosen(x[v]) for v in p.free_nodes()})
    obj, mem = p.evaluate(choice)
    return Solution(p, choice, obj, mem, time.perf_counter() - t0,
                    status == pywraplp.Solver.OPTIMAL)


def brute_force(problem: ShardingProblem, *, limit: int = 2_000_000) -> Solution:
    """The best assignment by enumerating all of them (at most ``limit``)."""
    p = problem
    if p.size() > limit:
        raise SpecError(f"{p.size():,} assignments is more than brute force's limit {limit:,}")
    free = p.free_nodes()
    best: tuple[float, float, dict[int, int]] | None = None
    for combo in itertools.product(*(range(len(p.strategies[v])) for v in free)):
        choice = p.complete(dict(zip(free, combo, strict=True)))
        obj, mem = p.evaluate(choice)
        if mem <= p.budget and (best is None or obj < best[0] - 1e-15):
            best = (obj, mem, choice)
    if best is None:
        raise SpecError("no assignment fits the memory budget")
    return Solution(p, best[2], best[0], best[1])
