"""``LayerCosts`` of a traced ``LayerGraph`` (``costs_from_graph``): for each TP degree
the sharding ILP (``costmodel.trace.autoshard``, ``tensor_parallel=True``) places every op of the
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
from typing import Literal

from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.formulas.arrays import divisors
from costmodel.formulas.kernels import Kernels
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.shardcosts import (
    NONE_COMPILED,
    OP_SELECTIVE,
    OP_SELECTIVE_COMPILED,
    RECOMPUTE_MODES,
    BlockCosts,
    ShardCosts,
)
from costmodel.hardware import Cluster
from costmodel.trace.autoshard import ShardingProblem, Solution, solve
from costmodel.trace.fusion import (
    _add_conversions,
    _add_memory_bound,
    _by_layer,
    _consumers,
    _fusable,
    _holders,
    _kernel,
    _merge_gemms,
    _op_checkpoint,
    _scores,
    _share,
    _split,
    _Tally,
)
from costmodel.trace.graph import LayerGraph
from costmodel.trace.layouts import Mesh, grouped_mm
from costmodel.trace.nodes import LOSS, Layer
from costmodel.units import compute_bytes

__all__ = ["block_costs", "first_stage_layers", "graph_blocks"]


def traced_degrees(cluster: Cluster) -> tuple[int, ...]:
    """The tensor-parallel degrees a traced graph is sharded at by default: every divisor of
    a node's GPUs; on a scale-up domain of several nodes (an NVL72 rack), those dividing
    both the domain and 8 (a traced graph is sharded once per degree, and wider tensor
    parallelism splits a layer's matmuls too thin to pay)."""
    if cluster.scale_up <= cluster.gpus_per_node:
        return tuple(divisors(cluster.gpus_per_node))
    return tuple(divisors(math.gcd(cluster.scale_up, 8)))


def block_costs(graph: LayerGraph, cluster: Cluster, job: Job, *,
                tp_degrees: Sequence[int] | None = None, sequence_parallel: bool = False,
                time_limit_s: float = 10.0) -> LayerCosts:
    """``LayerCosts`` of ``graph`` (traced on one micro-batch) at each of ``tp_degrees``
    (default: ``traced_degrees``); ``sequence_parallel``: the norm and elementwise regions
    may split the sequence (``ShardingProblem``)."""
    degrees = tuple(tp_degrees) if tp_degrees else traced_degrees(cluster)
    tallies: dict[int, dict[str, _Tally]] = {}
    layouts: dict[int, tuple[tuple[int, str, str, str, str], ...]] = {}
    mixers: set[str] = set()
    routing: dict[str, tuple[int, int]] = {}
    fusable = _fusable(job)
    for t in degrees:
        prob = ShardingProblem(graph, Mesh((1, t)), cluster, job, budget=math.inf,
                               tensor_parallel=True, sequence_parallel=sequence_parallel)
        if t == degrees[0]:  # which layers mix tokens or route does not depend on the degree
            mixers = {prob.layer[v] for v in prob.nodes if prob.mixes_tokens(v)}
            routing = _routing(prob)
        sol = solve(prob, time_limit_s=time_limit_s)
        tallies[t] = _tally(sol, routing, fusable)
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
    """Per layer that routes tokens to experts, (experts each token goes to, experts), from
    its top-k over the router's scores (``ShardingProblem.routing_topks``). Its batched
    matmuls with a weight operand are the routed experts' (``_expert``)."""
    out: dict[str, tuple[int, int]] = {}
    for v, routing in p.routing_topks.items():
        out[p.layer[v]] = max(out.get(p.layer[v], (0, 0)), routing)
    return out


def _expert(p: ShardingProblem, v: int, routing: dict[str, tuple[int, int]]) -> bool:
    """Whether node ``v`` is a routed experts' matmul: in a layer that routes, a matmul
    batched over as many experts as the router chooses from, reading a weight (an
    ``experts x in x out`` parameter, ``torch.bmm``; or torch._grouped_mm's)."""
    n = p.graph.node(v)
    experts = routing.get(p.layer[v], (0, 0))[1]
    batched = any(lp.role == "b" and lp.size == experts for lp in n.loops) \
        or (grouped_mm(n) and n.inputs[1].shape[0] == experts)
    return n.family == "matmul" and experts > 1 and batched \
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
    kernels, compiled, recomputed, op_recomputed = Kernels(), Kernels(), Kernels(), Kernels()
    op_saved = op_compiled = saved_compiled = regather = regather_calls = 0.0
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
        compiled = compiled.merged(t.compiled)
        op_recomputed = op_recomputed.merged(t.op_recomputed)
        saved_compiled += t.saved_compiled
        regather, regather_calls = regather + t.op_regather, regather_calls + t.op_regather_calls
        op_saved += t.op_saved + (t.input_bytes if x is members[0] else 0.0)
        op_compiled += t.op_saved_compiled + (t.input_bytes if x is members[0] else 0.0)
        for k, b in t.collectives.items():
            coll[k] = coll.get(k, 0.0) + b
            calls[k] = calls.get(k, 0.0) + t.calls[k]
    # Selective recompute drops the attention scores (Korthikanti et al. 2022, Sec. 4.2.3);
    # full recompute keeps the block's input.
    acts = dict(zip(RECOMPUTE_MODES, (saved, saved - scores, inp), strict=True)) \
        if is_layer else dict.fromkeys(RECOMPUTE_MODES, saved)
    acts[NONE_COMPILED] = saved_compiled
    if is_layer:  # torchtitan's per-op selective AC, eager and compiled (_op_checkpoint)
        acts.update({OP_SELECTIVE: min(op_saved, saved), OP_SELECTIVE_COMPILED:
                     min(op_compiled, saved)})
    return ShardCosts(params=params, forward_flops=forward, backward_flops=backward,
                      activation_bytes=acts, input_bytes=inp, collectives=coll,
                      collective_calls=calls, widest_elements=widest, shared_params=shared,
                      kernels=_merge_gemms(kernels), recomputed=_merge_gemms(recomputed),
                      compiled=_merge_gemms(compiled),
                      op_recomputed=_merge_gemms(op_recomputed) if is_layer else None,
                      op_regather=regather if is_layer else 0.0,
                      op_regather_calls=regather_calls if is_layer else 0.0,
                      kv_bytes=kv, expert_params=experts)


def _tally(sol: Solution, routing: dict[str, tuple[int, int]], fusable: frozenset[str]
           ) -> dict[str, _Tally]:
    """Per layer instance, the figures of one rank under ``sol``'s layouts (``routing``:
    the layers that route tokens to experts, ``_routing``; ``fusable``: the op families
    ``torch.compile`` fuses, ``_fusable``)."""
    p = sol.problem
    fused: set[int] = set()  # the nodes of the compiled kernels' fused regions
    out: dict[str, _Tally] = {}
    owner = {name: p.layer[v] for v in p.nodes for name in p.charged[v]}
    shared: set[tuple[str, str]] = set()
    held: dict[tuple[str, int], float] = {}  # (layer, outside source) -> bytes on one rank
    experts: set[int] = set()  # the routed experts' matmuls
    for v in p.nodes:
        st = sol.strategy(v)
        n = p.graph.node(v)
        t = out.setdefault(p.layer[v], _Tally())
        shards = _split(sol, v)
        # Each rank's share of the model FLOPs: an op left whole (a MoE router, which
        # Megatron-LM runs whole on every rank) is the group's once, shared evenly.
        t.forward_flops += n.model_flops / p.mesh.size
        if n.family == "attention" and n.model_flops and len(n.inputs) >= 3:
            t.kv_bytes += (n.inputs[1].nbytes + n.inputs[2].nbytes) / shards  # K and V
        expert = _expert(p, v, routing)
        if expert:
            experts.add(v)
        kernel = _kernel(sol, v, shards, expert)
        if n.family in fusable and not n.model_flops:
            fused.add(v)
        t.run(kernel, compiled=v not in fused)
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
    routed = p.routed  # the routing layers' expert blocks
    layers, readers = _by_layer(p), _consumers(p)
    compiled = _add_memory_bound(sol, out, fused, layers, readers)
    _op_checkpoint(sol, out, routed, compiled, layers, readers, experts)
    _add_conversions(sol, out, routed)
    return out


def costs_from_graph(graph: LayerGraph, cluster: Cluster, job: Job, *,
                     tp_degrees: Sequence[int] | None = None,
                     sequence_parallel: bool | Literal["both"] = False,
                     time_limit_s: float = 10.0,
                     autocast_graph: LayerGraph | None = None) -> LayerCosts:
    """The costs of a traced graph (one micro-batch: the batch it was traced with) at
    each TP degree (default: the divisors of a node's GPUs), each degree's layouts
    chosen by the sharding ILP (``costmodel.trace.blockcosts.block_costs``), with or without
    sequence parallelism, or ``"both"``: the costs without, carrying those with as
    ``sp_costs`` (at the degrees above 1, the only ones it splits).
    ``autocast_graph``: the same module traced under ``torch.autocast``
    (``LayerGraph.from_module(..., dtype=torch.float32, autocast=torch.bfloat16)``),
    whose blocks' costs on one GPU the rows trained so read (``BlockCosts.autocast``;
    without it they read the graph's own).
    """
    costs = _from_graph(graph, cluster, job, tp_degrees, sequence_parallel, time_limit_s)
    if autocast_graph is None:
        return costs
    return with_autocast(costs, autocast_graph, cluster, job, time_limit_s=time_limit_s)


def with_autocast(costs: LayerCosts, autocast_graph: LayerGraph, cluster: Cluster, job: Job, *,
                  time_limit_s: float = 10.0) -> LayerCosts:
    """These costs of a traced graph with each block's one-GPU costs under
    ``torch.autocast`` from ``autocast_graph``, the same module traced so
    (``BlockCosts.autocast``); ``SpecError`` when its blocks are not these."""
    if costs.spec is not None:
        raise SpecError(f"{costs.name}: a preset's formulas cost autocast themselves; "
                        "with_autocast takes a traced graph's costs")
    under = block_costs(autocast_graph, cluster, job, tp_degrees=(1,),
                        sequence_parallel=False, time_limit_s=time_limit_s)
    shape = [(b.name, b.kind, b.repeat) for b in costs.blocks]
    if [(b.name, b.kind, b.repeat) for b in under.blocks] != shape:
        raise SpecError(f"{costs.name}: traced under autocast its blocks differ from the "
                        "graph's; trace the same module and inputs for both")
    return dataclasses.replace(costs, blocks=tuple(
        dataclasses.replace(b, autocast=u.at(1))
        for b, u in zip(costs.blocks, under.blocks, strict=True)))


def _from_graph(graph: LayerGraph, cluster: Cluster, job: Job,
                tp_degrees: Sequence[int] | None,
                sequence_parallel: bool | Literal["both"], time_limit_s: float
                ) -> LayerCosts:
    if sequence_parallel == "both":
        plain = block_costs(graph, cluster, job, tp_degrees=tp_degrees,
                            sequence_parallel=False, time_limit_s=time_limit_s)
        split = tuple(t for t in plain.tp_degrees if t > 1)
        if not split:
            return plain
        return dataclasses.replace(plain, sp_costs=block_costs(
            graph, cluster, job, tp_degrees=split, sequence_parallel=True,
            time_limit_s=time_limit_s))
    if not isinstance(sequence_parallel, bool):
        raise SpecError(f"sequence_parallel must be True, False or 'both', got "
                        f"{sequence_parallel!r}")
    return block_costs(graph, cluster, job, tp_degrees=tp_degrees,
                       sequence_parallel=sequence_parallel, time_limit_s=time_limit_s)
