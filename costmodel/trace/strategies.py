"""The strategies of one node of the sharding problem and what each costs: every way to place
its loops on the mesh axes (``costmodel.trace.sharding.op_loops``), the partial sums it may carry
on unreduced, and per strategy the compute (roofline on the local shard), gradient
synchronisation, memory and the bytes its inputs move (the ``c``, ``g``, ``b`` and ``m`` of the
ILP in ``costmodel.trace.autoshard``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from costmodel.config import Job
from costmodel.formulas.comm import Topology
from costmodel.formulas.roofline import (
    BACKWARD_BYTES,
    attention_kernel,
    flash_attention_time,
    gemm_time,
    memory_time,
)
from costmodel.hardware import Cluster
from costmodel.trace.layouts import (
    Layout,
    Strategy,
    _Input,
    matmul_operands,
)
from costmodel.trace.nodes import OpNode
from costmodel.trace.sharding import PARTIAL, REPLICATE, Loop, reshard_time
from costmodel.trace.tokens import GraphFacts


class StrategyCosts(GraphFacts):
    """Each node's strategies and their costs (``ShardingProblem`` is built from them), read
    from the fields declared here and in ``GraphFacts``."""

    cluster: Cluster
    job: Job
    topo: Topology
    dtype: str
    elem: float
    in_flight: int
    tensor_parallel: bool
    param_state: float
    charged: dict[int, set[str]]
    saved: dict[int, list[tuple[int, float]]]

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
            # (``costmodel.trace.blockcosts``), each taking and handing on whole tensors.
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
                                                      attention_kernel(self.job, gpu),
                                                      n.attention_head_dim)
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
