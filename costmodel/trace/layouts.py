"""The layouts the sharding ILP chooses between: the device mesh, a node's strategy (the layout of
its output and of each input on every mesh axis, with its costs), the groups of consumers
that share one conversion, and how a view's dims map onto its source's (so a view only
renames dims). Read by ``costmodel.trace.autoshard``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from costmodel.errors import SpecError
from costmodel.trace.nodes import OpNode, TensorRef
from costmodel.trace.sharding import PARTIAL, REPLICATE

Layout = tuple[int, ...]


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
