"""``LayerCosts`` of a traced ``LayerGraph`` (``LayerCosts.from_graph``): for each TP degree
the sharding ILP (``costmodel.autoshard``, ``tensor_parallel=True``) places every op of the
graph on a 1 x t mesh, the ranks seeing the same tokens and every weight matrix split; the
figures of each layer are then read off the chosen layouts, op by op.

Blocks: each run of identical layers is one block (traced once, ``repeat`` instances); the
layers before the first run are the ``embedding`` block, those after the last the ``head``
block, those between runs ``other`` blocks. A graph without runs has one ``layer`` block per
top-level layer (the units a pipeline can split), the loss joining the last.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from costmodel.arrays import divisors
from costmodel.autoshard import Mesh, ShardingProblem, Solution, _collective_names, solve
from costmodel.compute import BACKWARD_BYTES, aligned
from costmodel.config import Job
from costmodel.graph import LOSS, Layer, LayerGraph
from costmodel.hardware import Cluster
from costmodel.kernels import Gemm, Kernels
from costmodel.layercosts import RECOMPUTE_MODES, BlockCosts, LayerCosts, ShardCosts
from costmodel.units import compute_bytes

__all__ = ["block_costs", "first_stage_layers", "graph_blocks"]


@dataclass
class _Tally:
    """One layer instance's figures on one rank, summed op by op."""

    params: float = 0.0
    forward_flops: float = 0.0
    kv_bytes: float = 0.0
    saved: float = 0.0
    scores: float = 0.0
    input_bytes: float = 0.0
    widest: float = 0.0
    shared: float = 0.0
    kernels: Kernels = field(default_factory=Kernels)
    recomputed: Kernels = field(default_factory=Kernels)
    collectives: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    expert_params: float = 0.0

    def add(self, kind: str, nbytes: float, calls: float) -> None:
        """Count ``calls`` collectives of ``kind`` moving ``nbytes`` in all."""
        self.collectives[kind] = self.collectives.get(kind, 0.0) + nbytes
        self.calls[kind] = self.calls.get(kind, 0.0) + calls


def block_costs(graph: LayerGraph, cluster: Cluster, job: Job, *,
                tp_degrees: Sequence[int] | None = None, sequence_parallel: bool = False,
                time_limit_s: float = 10.0) -> LayerCosts:
    """``LayerCosts`` of ``graph`` (traced on one micro-batch) at each of ``tp_degrees``
    (default: every divisor of a node's GPUs); ``sequence_parallel``: the norm and
    elementwise regions may split the sequence (``ShardingProblem``)."""
    degrees = tuple(tp_degrees) if tp_degrees else tuple(divisors(cluster.gpus_per_node))
    tallies: dict[int, dict[str, _Tally]] = {}
    layouts: dict[int, tuple[tuple[int, str, str, str, str], ...]] = {}
    mixers: set[str] = set()
    routing: dict[str, tuple[int, int]] = {}
    for t in degrees:
        prob = ShardingProblem(graph, Mesh((1, t)), cluster, job, budget=math.inf,
                               tensor_parallel=True, sequence_parallel=sequence_parallel)
        if t == degrees[0]:  # which layers mix tokens or route does not depend on the degree
            mixers = {prob.layer[v] for v in prob.nodes if prob.mixes_tokens(v)}
            routing = _routing(prob)
        sol = solve(prob, time_limit_s=time_limit_s)
        tallies[t] = _tally(sol, routing)
        layouts[t] = tuple((v, graph.node(v).module, op, label, out) for v, op, label, out
                           in sol.layouts())
    blocks = []
    for name, kind, members in graph_blocks(graph):
        by_tp = {t: _shard(members, tallies[t], kind == "layer") for t in degrees}
        blocks.append(BlockCosts(name, kind, members[0].repeat, members[-1].output_bytes, by_tp,
                                 tuple(x.name for x in members),
                                 mixes_tokens=any(x.name in mixers for x in members)))
    # One micro-batch is the traced batch of the job's sequences (tokens, or samples when
    # the job's seq_len is 1).
    shape = graph.inputs[0] if graph.inputs else ()
    top_k, experts = max(routing.values(), default=(0, 0))
    return LayerCosts(graph.name, "graph", shape[0] if shape else 1, job.seq_len,
                      sequence_parallel, tuple(blocks), layouts,
                      element_bytes=compute_bytes(job.precision),
                      first_stage_layers=first_stage_layers(graph), top_k=top_k,
                      num_experts=experts, multihead_attention=graph.multihead_attention)


def _routing(p: ShardingProblem) -> dict[str, tuple[int, int]]:
    """Per layer that routes tokens to experts, (experts each token goes to, experts): a
    ``topk`` over the router's scores, its k the last dim of its output, the experts that of
    its input. Its batched matmuls with a weight operand are the routed experts'
    (``_expert``)."""
    out: dict[str, tuple[int, int]] = {}
    for v in p.nodes:
        n = p.graph.node(v)
        if n.backward or n.op.removeprefix("aten.").split(".")[0] != "topk" or not n.shape:
            continue
        src = p.inputs[v][0].source if p.inputs[v] else -1
        scores = p.graph.node(src).shape if src >= 0 else ()
        if scores and n.shape[-1] < scores[-1]:
            out[p.layer[v]] = max(out.get(p.layer[v], (0, 0)), (n.shape[-1], scores[-1]))
    return out


def _expert(p: ShardingProblem, v: int, routing: dict[str, tuple[int, int]]) -> bool:
    """Whether node ``v`` is a routed experts' matmul: in a layer that routes, a matmul
    batched over as many experts as the router chooses from, reading a weight (an
    ``experts x in x out`` parameter, ``torch.bmm``; or torch._grouped_mm's)."""
    n = p.graph.node(v)
    experts = routing.get(p.layer[v], (0, 0))[1]
    return n.family == "matmul" and experts > 1 \
        and any(lp.role == "b" and lp.size == experts for lp in n.loops) \
        and any(inp.param for inp in p.inputs[v])


def first_stage_layers(graph: LayerGraph) -> int:
    """The layers (pipeline units, ``LayerCosts.layer_kinds``) that run before the last
    forward op reading one of the model's own inputs, or that contain it: a pipeline's first
    stage must hold them, since torch.distributed.pipelining hands a later stage only the
    previous stage's outputs (an encoder-decoder that embeds its decoder tokens after the
    encoder: the encoder). A run of identical layers counts whole: its later instances, not
    traced, run before anything traced after the first."""
    readers = [v for v in graph.graph.nodes
               if graph.node(v).reads_input and not graph.node(v).backward]
    if not readers:
        return 0
    units = []  # (first forward op id, layers) of each unit block, in order
    for _, kind, members in graph_blocks(graph):
        ids = [v for x in members for v in x.nodes if not graph.node(v).backward]
        if kind not in ("embedding", "head") and ids:
            units.append((min(ids), members[0].repeat))
    return max(sum(n for first, n in units if first <= v) for v in readers)


def graph_blocks(graph: LayerGraph) -> list[tuple[str, str, list[Layer]]]:
    """(name, kind, layers) of each block of ``graph``, in execution order (module
    docstring)."""
    ops = [x for x in graph.layers if x.nodes or x.params]
    runs = [i for i, x in enumerate(ops) if x.repeat > 1]
    if not runs:
        out: list[tuple[str, str, list[Layer]]] = []
        for x in ops:
            if x.name == LOSS and out:
                out[-1][2].append(x)
            else:
                out.append((x.name, "layer", [x]))
        return out
    out = []
    start = 0
    for i in runs:
        # Layers of the run's own list that are not part of the run (DeepSeekMoE's leading
        # dense layer before its MoE layers) are layers of their own, one block each.
        j = i
        while j > start and _siblings(ops[j - 1].name, ops[i].name):
            j -= 1
        if j > start:
            kind = "embedding" if start == 0 else "other"
            out.append((ops[start].name, kind, ops[start:j]))
        out += [(x.name, "layer", [x]) for x in ops[j:i + 1]]
        start = i + 1
    if start < len(ops):
        out.append((ops[start].name, "head", ops[start:]))
    return out


def _siblings(a: str, b: str) -> bool:
    """Whether module paths ``a`` and ``b`` are items of the same module list
    (``layers.0``, ``layers.1``)."""
    pa, _, ia = a.rpartition(".")
    pb, _, ib = b.rpartition(".")
    return bool(pa) and pa == pb and ia.isdigit() and ib.isdigit()


def _shard(members: list[Layer], tally: dict[str, _Tally], is_layer: bool) -> ShardCosts:
    """The ``ShardCosts`` of a block made of ``members`` (one instance of each);
    ``is_layer``: recompute applies to it (to the layers, not to the embedding and head, as
    trainers checkpoint the layers)."""
    params = forward = backward = saved = scores = inp = widest = shared = kv = experts = 0.0
    kernels, recomputed = Kernels(), Kernels()
    coll: dict[str, float] = {}
    calls: dict[str, float] = {}
    for x in members:
        t = tally.get(x.name, _Tally())
        params += t.params
        experts += t.expert_params
        forward += t.forward_flops
        kv += t.kv_bytes
        if x.forward_flops:  # backward ops are split like the forward ops they mirror
            backward += x.backward_flops * t.forward_flops / x.forward_flops
        saved += t.saved
        scores += t.scores
        inp += t.input_bytes if x is members[0] else 0.0
        widest = max(widest, t.widest)
        shared += t.shared
        kernels, recomputed = kernels.merged(t.kernels), recomputed.merged(t.recomputed)
        for k, b in t.collectives.items():
            coll[k] = coll.get(k, 0.0) + b
            calls[k] = calls.get(k, 0.0) + t.calls[k]
    # Selective recompute drops the attention scores (Korthikanti et al. 2022, Sec. 4.2.3);
    # full recompute keeps the block's input.
    acts = dict(zip(RECOMPUTE_MODES, (saved, saved - scores, inp), strict=True)) \
        if is_layer else dict.fromkeys(RECOMPUTE_MODES, saved)
    return ShardCosts(params=params, forward_flops=forward, backward_flops=backward,
                      activation_bytes=acts, input_bytes=inp, collectives=coll,
                      collective_calls=calls, widest_elements=widest, shared_params=shared,
                      kernels=_merge_gemms(kernels), recomputed=_merge_gemms(recomputed),
                      kv_bytes=kv, expert_params=experts)


def _scores(sol: Solution, src: int) -> bool:
    """Whether node ``src`` makes an attention-score tensor: its last two dims both run
    along the tokens (queries by keys: the scores, their softmax and dropout of an unfused
    attention), as loops carry them (``ShardingProblem.score_dims``: not a MoE layer's
    routed tokens)."""
    rank = len(sol.problem.graph.node(src).shape)
    return rank >= 2 and {rank - 1, rank - 2} <= sol.problem.score_dims.get(src, frozenset())


def _kernel(sol: Solution, v: int, shards: int, expert: bool = False) -> Kernels:
    """Node ``v``'s forward kernel on one rank as the ILP placed it (``costmodel.kernels``;
    the same costs as ``ShardingProblem``'s compute terms); ``expert``: a routed experts'
    matmul (``Gemm.expert``)."""
    p = sol.problem
    n = p.graph.node(v)
    st = sol.strategy(v)
    if n.family == "matmul":
        split: dict[int, int] = {}
        for size, a in zip(p.mesh.shape, st.axes, strict=True):
            if a is not None:
                split[a] = split.get(a, 1) * size
        roles = {lp.role: lp.size / split.get(i, 1) for i, lp in enumerate(n.loops) if lp.role}
        if {"m", "n", "k"} <= set(roles):
            m, nn, k, b = roles["m"], roles["n"], roles["k"], roles.get("b", 1.0)
            e = p.elem
            ins = p.inputs[v]
            a_w, b_w = (bool(ins[-2].param), bool(ins[-1].param)) if len(ins) >= 2 \
                else (False, False)
            w = e * b * (m * k * a_w + k * nn * b_w)
            act = e * b * (m * k + k * nn + m * nn) - w
            needs = [r.grad for r in n.inputs]
            back = int(len(needs) >= 2 and needs[-2]) + int(bool(needs and needs[-1]))
            return Kernels(gemms=(Gemm(2 * m * nn * k * b, act, w,
                                       bool(aligned(nn, k, e)), back, expert=expert),))
    moved = (sum(r.nbytes for r in n.inputs) + n.output_bytes) / shards
    if n.family == "embedding":
        # A lookup reads the rows it gathers, not the table: the indices, then a row read
        # and written per token; its backward adds each token's gradient row into the
        # table's gradient, as many bytes (the dense gradient's zeroed table is left out,
        # as the formulas leave it out: costmodel.compute.lm_head_compute).
        rows = (sum(r.nbytes for r in n.inputs if not r.param) + 2 * n.output_bytes) / shards
        return Kernels(memory_bytes=rows, memory_kernels=1,
                       memory_backward_bytes=rows if n.grad else 0.0,
                       memory_backward_kernels=1 if n.grad else 0)
    if n.family == "attention" and n.model_flops:
        flops = n.model_flops / shards * (0.5 if n.causal else 1.0)
        return Kernels(attention_flops=flops, attention_kernels=1, attention_backward=n.grad)
    if n.model_flops:  # a convolution: a roofline like a matmul's, its weights fixed
        w = sum(r.nbytes for r in n.inputs if r.param) / shards
        return Kernels(gemms=(Gemm(n.model_flops / shards, moved - w, w, True,
                                   2 if n.grad else 0),))
    back = n.grad or n.fused_grad  # a fused kernel's decomposition: its backward's bytes
    return Kernels(memory_bytes=moved, memory_kernels=1,
                   memory_backward_bytes=BACKWARD_BYTES * moved if back else 0.0,
                   memory_backward_kernels=1 if back else 0)


#: View-family ops that move data: dtype casts and copies (a kernel each, reading and
#: writing the tensor; their backward casts or copies the gradient back).
_COPIES = ("_to_copy", "clone", "contiguous", "copy_", "copy")


def _copies(sol: Solution) -> list[tuple[str, Kernels]]:
    """(layer, kernel) of every forward cast or copy: the sharding graph contracts
    them as views, but each is a memory-bound kernel on the layout of the tensor it copies."""
    p = sol.problem
    graph = p.graph
    out = []
    for i in graph.graph.nodes:
        n = graph.node(i)
        if n.backward or n.family != "view" or not n.output_bytes \
                or n.op.removeprefix("aten.").split(".")[0] not in _COPIES:
            continue
        src = n.inputs[0].source if n.inputs else -1
        while src >= 0 and src not in p.layer and graph.node(src).family == "view" \
                and graph.node(src).inputs:
            src = graph.node(src).inputs[0].source
        share = _share(sol, sol.strategy(src).out) if src in p.layer else 1
        moved = (sum(r.nbytes for r in n.inputs) + n.output_bytes) / share
        out.append((n.layer, Kernels(memory_bytes=moved, memory_kernels=1,
                                     memory_backward_bytes=moved if n.grad or n.fused_grad
                                     else 0.0,
                                     memory_backward_kernels=1 if n.grad or n.fused_grad
                                     else 0)))
    return out


def _merge_gemms(k: Kernels) -> Kernels:
    """``k`` with identical matmuls counted once each, with their count."""
    counts: dict[tuple[float, float, float, bool, int, bool], int] = {}
    for g in k.gemms:
        key = (g.flops, g.activation_bytes, g.weight_bytes, g.aligned, g.backward, g.expert)
        counts[key] = counts.get(key, 0) + g.count
    return dataclasses.replace(k, gemms=tuple(Gemm(*key[:5], count=c, expert=key[5])
                                              for key, c in counts.items()))


def _share(sol: Solution, layout: tuple[int, ...]) -> int:
    """Devices one copy of a tensor in ``layout`` is split over."""
    return math.prod(m for m, q in zip(sol.problem.mesh.shape, layout, strict=True) if q >= 0)


def _holders(sol: Solution, v: int, src: int) -> int:
    """How many ways a tensor made by ``src`` and saved by node ``v``'s layer is split on
    the rank: as its producer lays it out, or, for the layer's input, as whole as any op
    of the layer reads it (the copy that op saves), except that under sequence parallelism
    a matmul keeps its input as produced, split along the sequence, and gathers it again
    in backward (Korthikanti et al. 2022, Sec. 4.2.2)."""
    p = sol.problem
    if src not in p.layer:
        return _share(sol, sol.strategy(v).out)
    made = _share(sol, sol.strategy(src).out)
    if p.layer[src] == p.layer[v]:
        return made
    reads = [made if p.sequence_parallel and p.graph.node(u).family == "matmul"
             else _share(sol, sol.strategy(u).ins[k])
             for u in p.nodes if p.layer[u] == p.layer[v]
             for k, inp in enumerate(p.inputs[u]) if inp.source == src]
    return min(reads, default=made)


def _tally(sol: Solution, routing: dict[str, tuple[int, int]]) -> dict[str, _Tally]:
    """Per layer instance, the figures of one rank under ``sol``'s layouts (``routing``:
    the layers that route tokens to experts, ``_routing``)."""
    p = sol.problem
    out: dict[str, _Tally] = {}
    owner = {name: p.layer[v] for v in p.nodes for name in p.charged[v]}
    shared: set[tuple[str, str]] = set()
    held: dict[tuple[str, int], float] = {}  # (layer, outside source) -> bytes on one rank
    for v in p.nodes:
        st = sol.strategy(v)
        n = p.graph.node(v)
        t = out.setdefault(p.layer[v], _Tally())
        shards = math.prod(m for m, a in zip(p.mesh.shape, st.axes, strict=True)
                           if a is not None)
        # Each rank's share of the model FLOPs: an op left whole (a MoE router, which
        # Megatron-LM runs whole on every rank) is the group's once, shared evenly.
        t.forward_flops += n.model_flops / p.mesh.size
        if n.family == "attention" and n.model_flops and len(n.inputs) >= 3:
            t.kv_bytes += (n.inputs[1].nbytes + n.inputs[2].nbytes) / shards  # K and V
        expert = _expert(p, v, routing)
        kernel = _kernel(sol, v, shards, expert)
        t.kernels = t.kernels.merged(kernel)
        if _scores(sol, v):
            t.recomputed = t.recomputed.merged(kernel)
        out_shards = _share(sol, st.out)
        t.widest = max(t.widest, math.prod(n.shape) / out_shards)
        for a in st.axes:  # statistics all-reduced over a split loop (a softmax's max, sum)
            if a is not None and n.loops[a].all_reduce_bytes:
                t.add("all-reduce", n.loops[a].all_reduce_bytes, 3.0)  # max, sum; backward
        for src, nbytes in p.saved[v]:
            kept = nbytes / _holders(sol, v, src)
            t.saved += kept
            if src >= 0 and _scores(sol, src):
                t.scores += kept
        for inp, lay in zip(p.inputs[v], st.ins, strict=True):
            if inp.param in p.charged[v]:
                on_rank = inp.numel / _share(sol, lay)
                t.params += on_rank
                t.expert_params += on_rank * expert  # a routed experts' weight
            elif inp.param and owner.get(inp.param) != p.layer[v] \
                    and (p.layer[v], inp.param) not in shared:
                shared.add((p.layer[v], inp.param))  # a tied weight another layer holds
                t.shared += inp.numel / _share(sol, lay)
            outside = inp.source >= 0 and p.layer[inp.source] != p.layer[v]
            model_input = inp.source < 0 and not inp.param and not inp.constant
            if outside or model_input:
                # The block keeps an input whole where any of its ops reads it whole.
                key = (p.layer[v], inp.source)
                held[key] = max(held.get(key, 0.0), inp.nbytes / math.prod(
                    m for m, q in zip(p.mesh.shape, lay, strict=True) if q >= 0))
    for (layer, _src), nbytes in held.items():
        out[layer].input_bytes += nbytes
    for layer, kernel in _copies(sol):
        if layer in out:
            out[layer].kernels = out[layer].kernels.merged(kernel)
    _add_conversions(sol, out)
    return out


def _add_conversions(sol: Solution, out: dict[str, _Tally]) -> None:
    """The collectives of every layout conversion, to the layer whose output it converts."""
    p = sol.problem
    for g, v, _slot, seconds in p.conversions(sol.choice):
        if seconds <= 0:
            continue
        layer = p.layer[g.producer]  # a conversion belongs to the block whose output it is
        need, grad = g.need(sol.strategy(v), _slot)
        per_instance = g.weight / p.repeat.get(layer, 1)
        names = _collective_names(sol.strategy(g.producer), need, grad).split()
        for name in names:
            kind = name.removeprefix("bwd:").split("@")[0]
            out.setdefault(layer, _Tally()).add(kind, per_instance * g.nbytes, per_instance)
