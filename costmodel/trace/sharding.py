"""Splitting rules per operator, tensor layouts on a device mesh, and what changing a layout
costs.

**Splitting rules.** Every op of a traced ``LayerGraph`` is described by its *loops*: the
independent dimensions of its iteration space, each saying which dim of every tensor input
it runs along (``None``: the input does not vary along it, it is broadcast) and which dim of
the output (``None``: the loop is summed over, so a split of it leaves each device a partial
sum). This is the einsum view of an op that Alpa (Zheng et al. 2022, Sec. 4.1), GSPMD (Xu et
al. 2021) and PyTorch's DTensor use for their sharding strategies. Sharding a mesh axis over
one loop gives one legal sharding of the op on that axis:

- matmul ``A[M, K] @ B[K, N]`` (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``):
  loops batch, ``M`` (rows: data / sequence parallel, ``B`` replicated), ``N`` (columns:
  Megatron's column-parallel linear, ``A`` replicated) and ``K`` (Megatron's row-parallel
  linear: output partial, an all-reduce or reduce-scatter follows);
- fused attention ``(q, k, v)``: batch, heads (``k``/``v`` heads for grouped-query
  attention) and query sequence (``k``, ``v`` replicated, as context parallel gathers them);
- embedding ``(weight[V, H], ids)``: every id dim, ``H`` (column split), ``V`` (Megatron's
  vocab-parallel embedding: output partial);
- layer / RMS norm, softmax: every dim but the normalized ones (Megatron's sequence parallel
  splits norms along the sequence); batch norm: batch and channels;
- elementwise ops: every output dim, inputs that broadcast along it replicated;
- reductions: kept dims; a summed dim gives a partial output (``sum``, ``mean``);
- losses: the sample dims, output partial when reduced;
- convolution: batch, output channels, input channels (partial output); pooling: batch and
  channels;
- concatenation and other indexing: the dims every input shares with the output;
- routing (top-k, scatter, sort) and unknown ops: no loops, replicated only
  (conservative).

Views (``view``, ``transpose``, ``permute``, ``expand``, ...) have no loops: ``view_map``
says which input dim each output dim comes from, so a layout passes through them
unchanged and they are contracted away when the graph is sharded.

**Layouts.** On a mesh with axes of ``n_a`` devices, a tensor's layout is one placement per
axis: ``REPLICATE`` (every device holds all of it), ``PARTIAL`` (each holds a partial sum) or a
dim ``d >= 0`` (each holds ``1/n_a`` of dim ``d``).

**Resharding** (``reshard_time``), per axis, with ``S`` the bytes along that axis
(alpha-beta costs of ``costmodel.formulas.comm.Topology``): shard -> replicate all-gather; partial
->
replicate all-reduce; partial -> shard reduce-scatter; shard -> another dim all-to-all;
replicate -> shard a local slice (free). A replicated input of an op whose output is split
along a loop the input does not follow receives a *partial* gradient in backward: for a
weight that is the data-parallel gradient all-reduce, for an activation Megatron's ``f``
operator (Shoeybi et al. 2019, Fig. 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PARTIAL", "REPLICATE", "Loop", "describe", "op_loops", "reshard_time", "view_groups",
           "view_map", "view_spans"]

#: Placement of a tensor on one mesh axis: every device holds all of it.
REPLICATE = -1
#: Placement on one mesh axis: every device holds a partial sum of it.
PARTIAL = -2


@dataclass(frozen=True)
class Loop:
    """One independent dimension of an op's iteration space.

    ``ins``: for each tensor input (in argument order), the dim it runs along, or ``None``
    where the input is the same all along it; ``out``: the output dim, or ``None`` when the
    loop is summed over (splitting it leaves partial sums); ``size``: its extent; ``role``:
    ``b``/``m``/``n``/``k`` for a matmul's batch, rows, columns and contraction, else ``""``;
    ``all_reduce_bytes``: bytes the op all-reduces among the devices that split this loop
    (forward and backward together), where it needs statistics over the whole loop.
    """

    ins: tuple[int | None, ...]
    out: int | None
    size: int
    role: str = ""
    all_reduce_bytes: float = 0.0


def describe(placement: int) -> str:
    """``R``, ``P`` or ``S(d)``."""
    return "R" if placement == REPLICATE else "P" if placement == PARTIAL else f"S({placement})"


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _aligned(shapes: Sequence[tuple[int, ...]], out: tuple[int, ...], d: int) -> tuple[
        int | None, ...]:
    """The dim of each input that output dim ``d`` broadcasts from (``None``: broadcast)."""
    n = len(out)
    dims: list[int | None] = []
    for s in shapes:
        k = d - (n - len(s))
        dims.append(k if k >= 0 and s[k] == out[d] else None)
    return tuple(dims)


def _broadcast(shapes: Sequence[tuple[int, ...]], out: tuple[int, ...],
               skip: Sequence[int] = ()) -> tuple[Loop, ...]:
    """Elementwise rule: one loop per output dim of size > 1 (``skip`` excluded)."""
    return tuple(Loop(_aligned(shapes, out, d), d, out[d]) for d in range(len(out))
                 if out[d] > 1 and d not in skip)


def _matmul(name: str, shapes: Sequence[tuple[int, ...]], out: tuple[int, ...]
            ) -> tuple[Loop, ...]:
    """``A[..., M, K] @ B[..., K, N]``; extra inputs (bias, scales) broadcast to the output.
    ``torch._grouped_mm(A[M, K], B[G, K, N], offs)``: each row of A times the matrix of its
    group, rows grouped by the offsets (a MoE layer's experts): its rows, columns and
    contraction split as a matmul's; the groups are not a loop of A, so they stay whole."""
    extra: tuple[int, ...]
    if name == "_grouped_mm":
        if len(shapes) < 2 or len(shapes[0]) != 2 or len(shapes[1]) != 3:
            return ()
        rest = (None,) * (len(shapes) - 2)
        rows, cols, inner = shapes[0][0], shapes[1][2], shapes[0][1]
        grouped = (Loop((0, None, *rest), 0, rows, "m"), Loop((None, 2, *rest), 1, cols, "n"),
                   Loop((1, 1, *rest), None, inner, "k"))
        return tuple(x for x in grouped if x.size > 1)
    if name in ("addmm", "baddbmm", "addbmm"):
        ia, ib, extra = 1, 2, (0,)
    elif name in ("mm", "bmm", "_scaled_mm"):
        ia, ib, extra = 0, 1, tuple(range(2, len(shapes)))
    else:
        return ()  # matmul / linear / dot / mv: decomposed by aten before they reach us
    a, b = shapes[ia], shapes[ib]
    if len(a) != len(b) or len(a) not in (2, 3) or name == "addbmm":
        return ()
    n_in = len(shapes)

    def loop(da: int | None, db: int | None, dout: int | None, size: int, role: str) -> Loop:
        ins: list[int | None] = [None] * n_in
        ins[ia], ins[ib] = da, db
        for e in extra:
            if dout is not None:
                ins[e] = _aligned([shapes[e]], out, dout)[0]
        return Loop(tuple(ins), dout, size, role)

    r = len(a)
    loops = [loop(r - 2, None, r - 2, a[-2], "m"), loop(None, r - 1, r - 1, b[-1], "n"),
             loop(r - 1, r - 2, None, a[-1], "k")]
    if r == 3:
        loops.insert(0, loop(0, 0, 0, a[0], "b"))
    return tuple(x for x in loops if x.size > 1)


def _attention(shapes: Sequence[tuple[int, ...]], out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Fused attention ``(q[b, h, s, d], k[b, hk, sk, d], v[b, hk, sk, dv], mask?)``."""
    q, k = shapes[0], shapes[1]

    def ins(dq: int | None, dkv: int | None, dout: int) -> tuple[int | None, ...]:
        return (dq, dkv, dkv, *tuple(_aligned([s], out, dout)[0] for s in shapes[3:]))

    loops = [Loop(ins(0, 0, 0), 0, q[0], "b")]
    if q[1] % k[1] == 0:
        loops.append(Loop(ins(1, 1, 1), 1, k[1], "h"))  # shards q heads in groups of hq/hk
    loops.append(Loop(ins(2, None, 2), 2, q[2], "s"))
    return tuple(x for x in loops if x.size > 1)


def _ints(args: Sequence[Any]) -> list[int]:
    out: list[int] = []
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, int):
            out.append(a)
        elif isinstance(a, list | tuple) and all(isinstance(x, int) for x in a):
            out.extend(a)
    return out


def op_loops(name: str, family: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
             out: tuple[int, ...]) -> tuple[Loop, ...]:
    """The loops of aten op ``name`` (overload packet name) of ``family``, given its
    positional arguments that hold no tensor (``args``, in order), the shapes of its tensor inputs
    in order and the shape of its (first) output. Empty: the op can only be replicated."""
    if not shapes:
        return tuple(Loop((), d, out[d]) for d in range(len(out)) if out[d] > 1)  # a source
    rule = _FAMILY_LOOPS.get(family)
    # routing, view (see view_map), backward ops and unknown ops have no loops
    return rule(name, args, shapes, out) if rule is not None else ()


def _attention_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                     out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Fused attention forward on [batch, heads, seq, dim] inputs."""
    if len(shapes[0]) == 4 and len(shapes) >= 3 and not name.endswith("backward"):
        return _attention(shapes, out)
    return ()


def _embedding_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                     out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Embedding lookup: the ids' dims, the table's width, and its rows (a reduction)."""
    if name != "embedding" or len(shapes) != 2:
        return ()
    w, ids = shapes
    loops = [Loop((None, i), i, ids[i]) for i in range(len(ids)) if ids[i] > 1]
    loops.append(Loop((1, None), len(out) - 1, w[1]))
    loops.append(Loop((0, None), None, w[0]))
    return tuple(loops)


def _norm_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Layer/RMS norm: the dims before the normalized ones; batch norm: batch (local
    statistics) and channels."""
    x = shapes[0]
    if name in ("native_layer_norm", "rms_norm", "_fused_rms_norm"):
        normalized = len(args[0]) if args and isinstance(args[0], list | tuple) else 1
        keep = len(x) - normalized
        return tuple(Loop((d,) + (None,) * (len(shapes) - 1), d, x[d]) for d in range(keep)
                     if x[d] > 1)
    if "batch_norm" in name and len(x) >= 2:
        return (Loop((0,) + (None,) * (len(shapes) - 1), 0, x[0]),
                Loop((1, *tuple(0 if len(s) == 1 else None for s in shapes[1:])), 1, x[1]))
    return ()


def _softmax_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                   out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Every dim but the softmax axis; the softmax axis too, as a vocabulary-parallel
    softmax: the running max and the sum of exponentials all-reduced forward, the sum of
    the gradient times the output backward, one fp32 value per row each (Megatron-LM's
    vocabulary-parallel cross entropy, Shoeybi et al. 2019, Sec. 3)."""
    x = shapes[0]
    ints = _ints(args[:1])
    axis = _dim(ints[0], len(x)) if ints else len(x) - 1
    loops = _broadcast(shapes[:1], out, skip=(axis,))
    if name.endswith("backward") or x[axis] <= 1:
        return loops
    rows = math.prod(x) / x[axis]
    return (*loops, Loop((axis,), axis, x[axis], all_reduce_bytes=3 * 4.0 * rows))


def _loss_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                out: tuple[int, ...]) -> tuple[Loop, ...]:
    """NLL loss: the batch (a reduction unless reduction='none'); other losses: the dims
    every same-rank input shares."""
    x = shapes[0]
    if name.startswith("nll_loss") and len(shapes) >= 2 and not name.endswith("backward"):
        ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        reduction = ints[0] if ints else 1
        ins = (0, 0) + (None,) * (len(shapes) - 2)
        if len(x) < 2:
            return ()
        # The classes too: each device picks the targets in its slice of them, a partial
        # sum (the vocabulary-parallel loss's target logits, Shoeybi et al. 2019, Sec. 3).
        classes = Loop((1,) + (None,) * (len(shapes) - 1), None, x[1])
        return tuple(lp for lp in (Loop(ins, None if reduction else 0, x[0]), classes)
                     if lp.size > 1)
    same = [s for s in shapes if len(s) == len(x)]
    dims = [d for d in range(len(x)) if x[d] > 1 and all(s[d] == x[d] for s in same)]
    return tuple(Loop(tuple(d if len(s) == len(x) else None for s in shapes),
                      d if len(out) == len(x) else None, x[d]) for d in dims)


def _conv_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Convolution forward: batch; without groups also output and input channels."""
    x = shapes[0]
    groups = args[-1] if args and isinstance(args[-1], int) else 1
    if len(shapes) < 2 or name.endswith("backward"):
        return ()
    bias = (None,) * (len(shapes) - 2)
    loops = [Loop((0, None, *bias), 0, x[0])]
    if groups == 1:
        loops += [Loop((None, 0) + (0,) * (len(shapes) - 2), 1, shapes[1][0]),
                  Loop((1, 1, *bias), None, x[1])]
    return tuple(lp for lp in loops if lp.size > 1)


def _pool_loops(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Pooling forward: batch and channels."""
    if name.endswith("backward"):
        return ()
    x = shapes[0]
    return tuple(Loop((d,), d, x[d]) for d in range(min(2, len(out))) if out[d] > 1)


def _reduction(name: str, args: Sequence[Any], x: tuple[int, ...], out: tuple[int, ...]
               ) -> tuple[Loop, ...]:
    ints = _ints(args[:1]) if args and not isinstance(args[0], bool) else []
    reduced = sorted({_dim(d, len(x)) for d in ints}) if ints else list(range(len(x)))
    if name in ("cumsum", "logsumexp", "argmax", "argmin") and not ints:
        return ()
    keepdim = len(out) == len(x)
    loops: list[Loop] = []
    j = 0
    for d in range(len(x)):
        if d in reduced:
            if keepdim:
                j += 1
            if name in ("sum", "mean") and x[d] > 1:
                loops.append(Loop((d,), None, x[d]))
            continue
        if x[d] > 1:
            loops.append(Loop((d,), j, x[d]))
        j += 1
    return tuple(loops)


def _index(name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
           out: tuple[int, ...]) -> tuple[Loop, ...]:
    """Dims every same-rank input shares with the output, except the dims the op works on."""
    if name in ("gather", "index", "index_select", "masked_select", "unfold", "diagonal") \
            or name.endswith("backward"):
        return ()
    if name == "stack":
        return ()
    named = args[1:2] if name == "roll" else args[:1] if name == "flip" else []
    skip = {_dim(d, len(out)) for d in _ints(named)}
    same = [s for s in shapes if len(s) == len(out)]
    if not same:
        return ()
    return tuple(Loop(tuple(d if len(s) == len(out) else None for s in shapes), d, out[d])
                 for d in range(len(out))
                 if out[d] > 1 and d not in skip and all(s[d] == out[d] for s in same))


#: View-like ops that keep the rank and take part of (or all of) each dim.
_SLICING = ("slice", "narrow", "split", "split_with_sizes", "chunk", "as_strided", "_to_copy",
            "clone", "contiguous")


def view_map(name: str, args: Sequence[Any], x: tuple[int, ...], out: tuple[int, ...]
             ) -> tuple[int | None, ...]:
    """For a view-like op from shape ``x`` to ``out``: the input dim each output dim comes
    from, ``None`` where a split of the output dim is not a split of one input dim (a
    trailing factor of a reshape, a new or broadcast dim)."""
    return _view(name, args, x, out)[0]


def _view(name: str, args: Sequence[Any], x: tuple[int, ...], out: tuple[int, ...]
          ) -> tuple[tuple[int | None, ...], list[tuple[list[int], list[int]]] | None]:
    """(``view_map``, the reshape's dim groups (``_reshape_groups``) where the op is taken
    for a reshape, else ``None``)."""
    n = len(out)
    if name == "permute" and args:
        return tuple(_dim(d, len(x)) for d in args[0]), None
    if name in ("transpose", "t", "swapaxes"):
        if name == "t":
            return tuple(reversed(range(len(x)))), None
        a, b = _dim(args[0], len(x)), _dim(args[1], len(x))
        perm = list(range(len(x)))
        perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm), None
    if name in ("select", "unbind") and len(x) == n + 1:
        d = _dim(args[0], len(x)) if args and isinstance(args[0], int) else 0
        return tuple(i if i < d else i + 1 for i in range(n)), None
    if name == "view_as_complex" and len(x) == n + 1:
        return tuple(range(n)), None  # the trailing (real, imaginary) pair becomes one element
    if name == "view_as_real" and len(x) == n - 1:
        return (*range(n - 1), None), None
    if name in ("expand", "expand_as", "broadcast_to"):
        return tuple(_aligned([x], out, d)[0] for d in range(n)), None
    if len(x) == n and all(a == b for a, b in zip(x, out, strict=True)):
        return tuple(range(n)), None
    if len(x) == n and name in _SLICING:
        return tuple(d if x[d] == out[d] else None for d in range(n)), None
    groups = _reshape_groups(x, out)
    return _reshape_map(x, out, groups), groups


def _reshape_groups(x: tuple[int, ...], out: tuple[int, ...]
                    ) -> list[tuple[list[int], list[int]]] | None:
    """Reshape: the input and output dims grouped by equal products, in order, as
    (input dims, output dims) pairs; ``None`` for a shape change that is not a reshape."""
    groups = []
    i = j = 0
    while i < len(x) or j < len(out):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi <= pj and i < len(x):
                pi *= x[i]
                gi.append(i)
                i += 1
            elif j < len(out):
                pj *= out[j]
                gj.append(j)
                j += 1
            else:
                break
            if pi == pj and (i == len(x) or x[i] != 1 or j == len(out)) and gj:
                break
        if pi != pj:
            return None
        groups.append((gi, gj))
    return groups


def _reshape_map(x: tuple[int, ...], out: tuple[int, ...],
                 groups: list[tuple[list[int], list[int]]] | None
                 ) -> tuple[int | None, ...]:
    """Reshape: the leading non-unit dim of an output group (``_reshape_groups``) comes from
    the leading non-unit dim of its input group; nothing of a reshape not understood."""
    m: list[int | None] = [None] * len(out)
    for gi, gj in groups or ():
        lead_in = next((d for d in gi if x[d] > 1), None)
        lead_out = next((d for d in gj if out[d] > 1), None)
        if lead_in is not None and lead_out is not None:
            m[lead_out] = lead_in
    return tuple(m)


def view_groups(name: str, args: Sequence[Any], x: tuple[int, ...], out: tuple[int, ...]
                ) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] | None:
    """For a view-like op taken for a reshape (``view_map``'s last case): its input and
    output dims grouped by equal products, as (input dims, output dims) pairs; ``None`` for
    any other view, or a reshape not understood."""
    groups = _view(name, args, x, out)[1]
    return None if groups is None else tuple((tuple(a), tuple(b)) for a, b in groups)


def view_spans(name: str, args: Sequence[Any], x: tuple[int, ...], out: tuple[int, ...]
               ) -> tuple[tuple[int, ...], ...]:
    """For a view-like op from shape ``x`` to ``out``: the input dims each output dim runs
    along (its elements lie at different positions of them), where ``view_map`` gives the
    one input dim that a split of the output dim splits. A reshape's output dim runs along
    every non-unit input dim of its group (``[batch * seq]`` viewed as ``[batch, seq]``:
    both run along the merged dim); a slice along the dim it slices; a new or broadcast
    dim along none."""
    m, groups = _view(name, args, x, out)
    if len(x) == len(out) and name in _SLICING:
        return tuple((d,) for d in range(len(out)))
    if groups is None:
        return tuple(() if d is None else (d,) for d in m)
    spans: list[tuple[int, ...]] = [()] * len(out)
    for gi, gj in groups:
        ins = tuple(d for d in gi if x[d] > 1)
        for d in gj:
            if out[d] > 1:
                spans[d] = ins
    return tuple(spans)


def reshard_time(topo: Any, mesh: tuple[int, ...], strides: tuple[int, ...],
                 src: tuple[int, ...], dst: tuple[int, ...], nbytes: float) -> float:
    """Seconds to turn a tensor of ``nbytes`` (whole, unsharded) from layout ``src`` into
    ``dst`` on a mesh of axes ``mesh`` whose ranks are ``strides`` apart, one axis after the
    other (``costmodel.formulas.comm.Topology`` costs). ``dst`` may not be partial."""
    t = 0.0
    for a, (s, d) in enumerate(zip(src, dst, strict=True)):
        if d == PARTIAL and s != PARTIAL:
            raise ValueError("a layout cannot be converted into a partial sum")
        if s in (d, REPLICATE):
            continue  # nothing to do, or a local slice
        # The bytes this axis works on: the tensor divided by the other axes' shards.
        other = float(np.prod([mesh[b] for b in range(len(mesh))
                               if b != a and src[b] >= 0]))
        size = nbytes / other
        n, stride = mesh[a], strides[a]
        if s == PARTIAL:
            f = topo.all_reduce if d == REPLICATE else topo.reduce_scatter
            t += float(f(size, n, stride))
        elif d == REPLICATE:
            t += float(topo.all_gather(size, n, stride))
        else:
            t += float(topo.all_to_all(size / n, n, stride))
    return t


_LoopRule = Callable[[str, Sequence[Any], Sequence[tuple[int, ...]], tuple[int, ...]],
                     tuple[Loop, ...]]
#: Each op family's loops (``op_loops``).
_FAMILY_LOOPS: dict[str, _LoopRule] = {
    "elementwise": lambda name, args, shapes, out: _broadcast(shapes, out),
    "matmul": lambda name, args, shapes, out: _matmul(name, shapes, out),
    "attention": _attention_loops,
    "embedding": _embedding_loops,
    "norm": _norm_loops,
    "softmax": _softmax_loops,
    "reduction": lambda name, args, shapes, out: _reduction(name, args, shapes[0], out),
    "loss": _loss_loops,
    "conv": _conv_loops,
    "pool": _pool_loops,
    "index": _index,
}
