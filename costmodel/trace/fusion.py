"""What a traced block's memory-bound kernels move and what it keeps for backward when its ops
are fused (TorchInductor under torch.compile) or run eager, and under per-op selective
activation checkpointing (torchtitan's op SAC); the tallies ``block_costs`` adds them to.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from costmodel.config import Job
from costmodel.formulas.kernels import Gemm, Kernels
from costmodel.formulas.roofline import BACKWARD_BYTES, aligned
from costmodel.trace.autoshard import ShardingProblem, Solution, _collective_names
from costmodel.trace.layouts import COPY_OPS, grouped_mm, matmul_operands


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
    compiled: Kernels = field(default_factory=Kernels)
    recomputed: Kernels = field(default_factory=Kernels)
    saved_compiled: float = 0.0
    op_saved: float = 0.0
    op_saved_compiled: float = 0.0
    op_recomputed: Kernels = field(default_factory=Kernels)
    op_regather: float = 0.0
    op_regather_calls: float = 0.0
    collectives: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    expert_params: float = 0.0

    def run(self, kernel: Kernels, compiled: bool = True) -> None:
        """Count ``kernel`` among the eager kernels, and among the compiled ones where
        ``compiled`` (a kernel ``torch.compile`` does not fuse away)."""
        self.kernels = self.kernels.merged(kernel)
        if compiled:
            self.compiled = self.compiled.merged(kernel)

    def add(self, kind: str, nbytes: float, calls: float) -> None:
        """Count ``calls`` collectives of ``kind`` moving ``nbytes`` in all."""
        self.collectives[kind] = self.collectives.get(kind, 0.0) + nbytes
        self.calls[kind] = self.calls.get(kind, 0.0) + calls


def _add_memory_bound(sol: Solution, out: dict[str, _Tally], fused: set[int],
                      layers: dict[str, list[int]], readers: dict[int, set[int]]
                      ) -> dict[int, float]:
    """The casts and copies (eager; compiled, those no fused region takes in), and the
    compiled kernels' fused regions and what backward keeps of them (returned: the bytes
    kept of each tensor compiled, ``_compiled_saved``). ``layers``: each layer's nodes
    (``_by_layer``); ``readers``: each node's (``_consumers``)."""
    for layer, kernel, src, copy_readers in _copies(sol):
        if layer in out:
            # Compiled, a cast next to a fused region is part of its kernel.
            out[layer].run(kernel, compiled=src not in fused and not copy_readers & fused)
    kept = _compiled_saved(sol, out, fused, layers, readers)
    for layer, kernel in _regions(sol, fused, kept, readers):
        out[layer].compiled = out[layer].compiled.merged(kernel)
    return kept


def _by_layer(p: ShardingProblem) -> dict[str, list[int]]:
    """The real forward nodes of each layer, in trace order."""
    out: dict[str, list[int]] = {}
    for v in sorted(p.nodes):
        out.setdefault(p.layer[v], []).append(v)
    return out


def _consumers(p: ShardingProblem) -> dict[int, set[int]]:
    """The real forward nodes reading each node's output (through views)."""
    out: dict[int, set[int]] = {}
    for v in p.nodes:
        for inp in p.inputs[v]:
            out.setdefault(inp.source, set()).add(v)
    return out


def _compiled_saved(sol: Solution, out: dict[str, _Tally], fused: set[int],
                    layers: dict[str, list[int]], readers: dict[int, set[int]]
                    ) -> dict[int, float]:
    """Each layer's ``saved_compiled``: what it keeps for backward under ``torch.compile``,
    whose partitioner (AOTAutograd's min-cut rematerialization) recomputes in backward what
    the fused ops (``fused``, ``_fusable``) made, where the backward reads it only inside
    fused kernels, from tensors it keeps anyway or, where cheaper, from the tensors they were
    made from. A tensor a matmul, attention or other library kernel reads in backward is
    kept as made (no fused kernel can make it on the fly): a SwiGLU's gate and up outputs
    and their product stay, the activation between them is recomputed (3 ffn-wide tensors
    against eager PyTorch's 4); a compiled loss keeps the logits it was given instead of its
    fp32 log-softmax (both measured, ``costmodel.formulas.activations`` and ``benchmarks/
    op_sac_memory.py``). Returns the bytes kept of each tensor (by the node that made it)."""
    p = sol.problem
    everything: dict[int, float] = {}
    for layer, vs in layers.items():
        savers: dict[int, float] = {}  # tensor -> bytes its savers hold
        casts: set[tuple[int, float]] = set()
        for u in vs:
            for (src, nbytes), copy in zip(p.saved[u], p.saved_copies[u], strict=True):
                # Identical casts of one tensor (an autocast layer's q, k and v inputs) are
                # one tensor in the compiled graph (AOTAutograd's common-subexpression pass).
                if copy and (src, nbytes) in casts:
                    continue
                if copy:
                    casts.add((src, nbytes))
                savers[src] = savers.get(src, 0.0) + nbytes / _holders(sol, u, src)
        other = savers.pop(-1, 0.0)  # the model's inputs, tensors of unknown origin: kept
        # Made and read by fused kernels alone: what backward may recompute, but for a
        # random op's mask (one byte an element): the partitioner does not re-draw random
        # numbers (``_RANDOM``).
        loose = sorted(x for x in savers if x in fused and p.layer.get(x) == layer
                       and readers.get(x, set()) <= fused)
        kept = {x: b for x, b in savers.items() if x not in loose}
        masks = {x: min(savers[x], math.prod(p.graph.node(x).shape)
                        / _share(sol, sol.strategy(x).out))
                 for x in loose
                 if p.graph.node(x).aten in _RANDOM}
        kept.update(masks)
        for src in loose:
            own = savers[src] - masks.get(src, 0.0)
            missing = {x: _made(sol, x) - kept.get(x, 0.0)
                       for x in _roots(sol, src, fused, kept)}
            # As cheap: keep what a library kernel wrote anyway (no extra write).
            if sum(missing.values()) <= own:
                kept.update({x: _made(sol, x) for x in missing})
            else:
                kept[src] = kept.get(src, 0.0) + own
        out[layer].saved_compiled = other + sum(kept.values())
        everything.update(kept)
    return everything


#: Ops that draw random numbers, which AOTAutograd's partitioner does not recompute
#: (``min_cut_rematerialization_partition`` bans them unless rng ops are functionalized,
#: off by default): a dropout keeps its one-byte mask.
_RANDOM = ("native_dropout", "bernoulli", "bernoulli_", "rand", "randn", "rand_like",
           "randn_like")


def _made(sol: Solution, x: int) -> float:
    """Bytes of node ``x``'s output on one rank."""
    return sol.problem.graph.node(x).output_bytes / _share(sol, sol.strategy(x).out)


def _roots(sol: Solution, src: int, fused: set[int], kept: dict[int, float]) -> set[int]:
    """The tensors that recomputing fused node ``src``'s output in backward needs and that
    are not kept whole (``kept``; a dropout's mask is not its output): walking back through
    the fused ops of its layer to the first op that is not one."""
    p = sol.problem
    out: set[int] = set()
    todo = [src]
    while todo:
        for inp in p.inputs[todo.pop()]:
            x = inp.source
            if x < 0 or kept.get(x, 0.0) >= 0.99 * _made(sol, x):
                continue
            if x in fused and p.layer.get(x) == p.layer[src]:
                todo.append(x)
            else:
                out.add(x)
    return out


#: The ops whose outputs torchtitan's per-op selective activation checkpointing saves
#: (``_save_list`` of torchtitan/distributed/activation_checkpoint.py: ``aten.mm``, every
#: second one recomputed, the fused attention kernels, ``_scaled_mm``): a linear with a bias
#: runs as ``addmm``, which it re-runs.
_OP_SAC_MATMULS = ("mm", "_scaled_mm")


def _op_checkpoint(sol: Solution, out: dict[str, _Tally], routed: set[int],
                   compiled: dict[int, float], layers: dict[str, list[int]],
                   readers: dict[int, set[int]], experts: set[int]) -> None:
    """Each layer's figures under torchtitan's per-op selective activation checkpointing
    (``Framework.selective_recompute`` "op"): it keeps the layer's input and the outputs of
    the ops its policy saves, the odd-numbered ``mm`` calls in call order (the first, third,
    ...: of a Llama block wq, wv, w1, w2) and the fused attention kernel's (O and the
    log-sum-exp), and re-runs every other op in backward: the even-numbered ``mm`` calls,
    other matmuls and every memory-bound op. A MoE layer's routed block keeps what it keeps
    without recompute (compiled, what ``_compiled_saved`` keeps: ``compiled``), as
    ``costmodel.formulas.activations`` counts it, and re-runs its memory-bound ops and its
    experts' matmuls (``experts``): ``torch._grouped_mm`` is not on the policy's save list
    (``costmodel.formulas.compute._op_selective``). Compiled, the
    partitioner keeps only the saved outputs backward needs, directly or to re-run what it
    needs (a block's last matmul feeds only its residual add: dropped).

    Sets ``op_saved`` (eager), ``op_saved_compiled`` and ``op_recomputed`` (the matmuls
    re-run; the memory-bound ops are the block's own, eager or fused)."""
    p = sol.problem
    for layer, vs in layers.items():
        t = out[layer]
        kept = _op_kept(p, [v for v in vs if v not in routed])
        for v in vs:
            if p.graph.node(v).model_flops and v not in kept \
                    and (v not in routed or v in experts):
                t.op_recomputed = t.op_recomputed.merged(
                    Kernels(gemms=_kernel(sol, v, _split(sol, v), v in experts).gemms))
        # The tensors the layer's ops save for backward, by the node that made them.
        saved_by: set[int] = set()
        for u in vs:
            for src, nbytes in p.saved[u]:
                if src in routed and u in routed:
                    t.op_saved += nbytes / _holders(sol, u, src)
                saved_by.add(src)
        t.op_saved_compiled = sum(compiled.get(x, 0.0) for x in routed)
        needed: dict[int, bool] = {}
        for v in reversed(vs):
            needed[v] = v in saved_by or any(needed.get(u, False) for u in readers.get(v, ())
                                             if u not in kept and p.layer[u] == layer)
        for v in kept:
            t.op_saved += _made(sol, v)
            t.op_saved_compiled += _made(sol, v) if needed[v] else 0.0


def _op_kept(p: ShardingProblem, vs: list[int]) -> set[int]:
    """The nodes of ``vs`` (one layer's, in call order) whose outputs torchtitan's per-op
    AC policy saves: the odd-numbered ``mm`` calls and the fused attention kernels."""
    kept: set[int] = set()
    count = 0
    for v in vs:
        n = p.graph.node(v)
        if n.family == "matmul" and n.aten in _OP_SAC_MATMULS:
            count += 1
            if count % 2:
                kept.add(v)
        elif n.family == "attention" and n.model_flops:
            kept.add(v)
    return kept


def _fusion_groups(sol: Solution, members: set[int]) -> list[list[int]]:
    """The fused regions of ``members``: joined along the tensors they pass within a layer
    in the layout they are made in, never across a library kernel or a collective
    (``_regions``)."""
    p = sol.problem
    parent = {v: v for v in members}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    # Library kernels (matmuls, attention, ...) on the longest path to each node: two ops
    # with one between them cannot share a kernel (a block's last residual add, which reads
    # the stream its MLP norm read, runs after the MLP).
    barriers: dict[int, int] = {}
    for v in sorted(p.nodes):  # trace order: producers first
        barriers[v] = max((barriers.get(inp.source, 0) + (inp.source not in members)
                           for inp in p.inputs[v] if inp.source >= 0), default=0)
        for inp, lay in zip(p.inputs[v], sol.strategy(v).ins, strict=True):
            if v in members and inp.source in members and p.layer[inp.source] == p.layer[v] \
                    and barriers[inp.source] == barriers[v] \
                    and sol.strategy(inp.source).out == lay:
                parent[root(v)] = root(inp.source)
    groups: dict[int, list[int]] = {}
    for v in sorted(members):
        groups.setdefault(root(v), []).append(v)
    return list(groups.values())


def _written(sol: Solution, v: int, outside: set[int], read: bool,
             kept: dict[int, float]) -> float:
    """Bytes a fused region writes of member ``v``'s output: in the dtype the ops
    ``outside`` it read it (a cast on the way out is fused into the region: a rotary
    embedding computed in fp32 writes its bf16 result), laid out as ``v`` makes it (a
    layout conversion to what they read follows the kernel: a sequence-parallel norm
    writes its sequence shard, which is then all-gathered), all of it where no forward op
    reads it (``read`` false: the layer's result, the loss), else what backward keeps of it
    (``kept``)."""
    p = sol.problem
    if not read:
        return _made(sol, v)
    if outside:
        return max(min(p.graph.node(u).inputs[k].nbytes, p.graph.node(v).output_bytes)
                   for u, k in _uses(p, outside, v)) / _share(sol, sol.strategy(v).out)
    return kept.get(v, 0.0)


def _split(sol: Solution, v: int) -> int:
    """Ways node ``v``'s loops are split on the mesh (its work per rank is 1/that)."""
    st = sol.strategy(v)
    return math.prod(m for m, a in zip(sol.problem.mesh.shape, st.axes, strict=True)
                     if a is not None)


#: Widest row TorchInductor reduces in one pass held in registers (a persistent reduction:
#: ``should_use_persistent_reduction`` in torch/_inductor/choices.py, torch 2.13, 1024 for
#: an inner reduction); a wider row is reduced in a loop that reads it once per pass.
PERSISTENT_REDUCTION = 1024


def _fusable(job: Job) -> frozenset[str]:
    """The op families that ``torch.compile`` (TorchInductor) fuses with their neighbours
    into one generated kernel: pointwise ops, norms, softmaxes, reductions, pooling and the
    gathers and concatenations it loads indirectly; the loss's unless it stays eager
    (``Job.compile_loss`` False). Matmuls, attention,
    embeddings and the routing ops (top-k, sort, scatter) stay library kernels."""
    out = {"elementwise", "norm", "softmax", "reduction", "pool", "index"}
    if job.compile_loss is not False:
        out.add("loss")
    return frozenset(out)


def _regions(sol: Solution, members: set[int], kept: dict[int, float],
             readers: dict[int, set[int]]) -> list[tuple[str, Kernels]]:
    """(layer, kernel) of each region ``torch.compile`` fuses out of the memory-bound
    ``members``: the members of one layer joined by the tensors they pass (torchtitan
    compiles each transformer block on its own, so a region stays in its layer), one kernel
    each that reads the region's inputs once and writes the outputs read outside it (or by
    no forward op: the layer's result, the loss) and what backward keeps of its tensors
    (``kept``, ``_compiled_saved``: a dropout's mask), its intermediates kept in registers
    (TorchInductor's vertical and horizontal fusion; Ansel et al. 2024, Sec. 5). Its
    backward moves ``BACKWARD_BYTES`` times as much, as a fused kernel's does
    (``costmodel.formulas.compute.layer_compute``'s fused count)."""
    p = sol.problem
    out = []
    for vs in _fusion_groups(sol, members):
        inside = set(vs)
        reads: dict[tuple[object, ...], float] = {}
        writes = 0.0
        for v in vs:
            n, st = p.graph.node(v), sol.strategy(v)
            for k, (ref, inp) in enumerate(zip(n.inputs, p.inputs[v], strict=True)):
                if inp.source in inside:
                    continue
                key: tuple[object, ...] = (inp.source, inp.param) \
                    if inp.source >= 0 or inp.param else (v, k)
                # The tensor as made (a cast or broadcast on the way in is fused: a norm
                # reading a bf16 stream as fp32 loads bf16), or the part of it read.
                reads[key] = max(reads.get(key, 0.0),
                                 min(ref.nbytes, inp.nbytes) / _share(sol, st.ins[k]))
            writes += _written(sol, v, readers.get(v, set()) - inside,
                               bool(readers.get(v)), kept)
        back = any(p.graph.node(v).grad or p.graph.node(v).fused_grad for v in vs)
        if any(p.graph.node(v).family == "softmax" and p.graph.node(v).shape
               and p.graph.node(v).shape[-1] > PERSISTENT_REDUCTION for v in vs):
            # A softmax over rows wider than one block (a loss over a vocabulary) loops
            # over each row twice, for its max and its exponent sum, and its backward
            # takes both again and writes the gradient: twice the forward's bytes
            # (costmodel.formulas.headcompute.lm_head_compute's compiled loss, measured).
            moved = 2 * sum(reads.values()) + writes
            back_bytes = 2 * moved
        else:
            moved = sum(reads.values()) + writes
            back_bytes = BACKWARD_BYTES * moved
        out.append((p.layer[vs[0]], Kernels(
            memory_bytes=moved, memory_kernels=1,
            memory_backward_bytes=back_bytes if back else 0.0,
            memory_backward_kernels=1 if back else 0)))
    return out


def _add_conversions(sol: Solution, out: dict[str, _Tally], routed: set[int]) -> None:
    """The collectives of every layout conversion, to the layer whose output it converts;
    and, as ``op_regather``, the forward all-gathers that torchtitan's per-op selective AC
    runs again in backward: its policy saves no all-gather's output (``_op_checkpoint``),
    which the matmuls it feeds read again for their weight gradients (not in a MoE layer's
    expert block, kept as without recompute; ``costmodel.formulas.tpcomm._op_sac_regathers``)."""
    p = sol.problem
    for g, v, _slot, seconds in p.conversions(sol.choice):
        if seconds <= 0:
            continue
        layer = p.layer[g.producer]  # a conversion belongs to the block whose output it is
        need, grad = g.need(sol.strategy(v), _slot)
        per_instance = g.weight / p.repeat.get(layer, 1)
        names = _collective_names(sol.strategy(g.producer), need, grad).split()
        t = out.setdefault(layer, _Tally())
        for name in names:
            kind = name.removeprefix("bwd:").split("@")[0]
            t.add(kind, per_instance * g.nbytes, per_instance)
            if name.startswith("all-gather") and v not in routed:
                t.op_regather += per_instance * g.nbytes
                t.op_regather_calls += per_instance


def _scores(sol: Solution, src: int) -> bool:
    """Whether node ``src`` makes an attention-score tensor: its last two dims both run
    along the tokens (queries by keys: the scores, their softmax and dropout of an unfused
    attention), as loops carry them (``ShardingProblem.score_dims``: not a MoE layer's
    routed tokens)."""
    rank = len(sol.problem.graph.node(src).shape)
    return rank >= 2 and {rank - 1, rank - 2} <= sol.problem.score_dims.get(src, frozenset())


def _kernel(sol: Solution, v: int, shards: int, expert: bool = False) -> Kernels:
    """Node ``v``'s forward kernel on one rank as the ILP placed it (``costmodel.formulas.kernels``;
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
            ia, ib = matmul_operands(n)
            ins = p.inputs[v]
            a_w, b_w = (bool(ins[ia].param), bool(ins[ib].param)) if len(ins) >= 2 \
                else (False, False)
            # A grouped matmul reads the matrices of all its groups (the local experts).
            groups = n.inputs[1].shape[0] if grouped_mm(n) else 1
            w = e * b * (m * k * a_w + groups * k * nn * b_w)
            act = e * b * (m * k + groups * k * nn + m * nn) - w
            needs = [r.grad for r in n.inputs]
            grad_a, grad_b = len(needs) >= 2 and bool(needs[ia]), bool(needs and needs[ib])
            back = int(grad_a) + int(grad_b)
            # The weight whose gradient one of those backward matmuls computes (elements).
            wgrad = b * (m * k * (a_w and grad_a) + groups * k * nn * (b_w and grad_b))
            # A linear (an activation times a weight matrix) that torchao's float8 training
            # runs as a Float8Linear: torchtitan converts every nn.Linear whose dims are
            # multiples of 16 (torchtitan's Float8LinearConverter); a router stays in bf16
            # (quantizing it perturbs the experts chosen; the formulas cast none either).
            full = [lp.size for lp in n.loops if lp.role in ("n", "k")]
            linear = b_w and not a_w and "b" not in roles and not expert \
                and v not in p.routers and all(x % 16 == 0 for x in full)
            return Kernels(gemms=(Gemm(2 * m * nn * k * b, act, w,
                                       bool(aligned(nn, k, e)), back, expert=expert,
                                       cast_in=m * k if linear else 0.0,
                                       cast_out=m * nn if linear else 0.0,
                                       cast_weight=k * nn if linear else 0.0,
                                       weight_grad=float(wgrad)),))
    moved = (sum(r.nbytes for r in n.inputs) + n.output_bytes) / shards
    if n.family == "index" and n.aten in _GATHERS:
        # A gather by index reads the rows it writes (a MoE layer's tokens, each read once
        # per expert it goes to), not the whole tensor it picks from.
        moved = (sum(r.nbytes for r in n.inputs[1:]) + 2 * n.output_bytes) / shards
    if n.family == "embedding":
        # A lookup reads the rows it gathers, not the table: the indices, then a row read
        # and written per token; its backward adds each token's gradient row into the
        # table's gradient, as many bytes (the dense gradient's zeroed table is left out,
        # as the formulas leave it out: costmodel.formulas.headcompute.lm_head_compute).
        rows = (sum(r.nbytes for r in n.inputs if not r.param) + 2 * n.output_bytes) / shards
        return Kernels(memory_bytes=rows, memory_kernels=1,
                       memory_backward_bytes=rows if n.grad else 0.0,
                       memory_backward_kernels=1 if n.grad else 0)
    if n.family == "attention" and n.model_flops:
        flops = n.model_flops / shards * (0.5 if n.causal else 1.0)
        # The keys per query set how much each query block's fixed work weighs
        # (``compute.flash_attention_time``).
        keys = n.attention_keys
        per_key = flops / keys if keys else 0.0
        head_dim = n.attention_head_dim
        return Kernels(attention_flops=flops, attention_kernels=1, attention_backward=n.grad,
                       attention_flops_per_key=per_key,
                       attention_head_dim_flops=flops * head_dim if head_dim else 0.0)
    if n.model_flops:  # a convolution: a roofline like a matmul's, its weights fixed
        w = sum(r.nbytes for r in n.inputs if r.param) / shards
        return Kernels(gemms=(Gemm(n.model_flops / shards, moved - w, w, True,
                                   2 if n.grad else 0),))
    back = n.grad or n.fused_grad  # a fused kernel's decomposition: its backward's bytes
    return Kernels(memory_bytes=moved, memory_kernels=1,
                   memory_backward_bytes=BACKWARD_BYTES * moved if back else 0.0,
                   memory_backward_kernels=1 if back else 0)


#: Index ops that gather rows by an index tensor (its first input the tensor gathered from).
_GATHERS = ("index", "index_select", "gather")


#: View-family ops that fill a new tensor: a kernel writing it, reading nothing (a MoE
#: layer's zeroed un-permutation buffer), without a backward.
_FILLS = ("zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full",
          "full_like", "new_full", "fill", "fill_", "zero_")


def _copies(sol: Solution) -> list[tuple[str, Kernels, int, set[int]]]:
    """(layer, kernel, the real node whose tensor it copies, the real nodes reading the
    copy) of every forward cast or copy, and of every floating tensor filled (``_FILLS``,
    source -1): the sharding graph contracts them as views, but each is a memory-bound
    kernel on the layout of the tensor it copies.

    Several casts of one tensor each hand its gradient back as a tensor of its own (an
    autocast layer's q, k and v projections each cast the fp32 norm output): autograd sums
    them, one kernel per cast beyond the first reading two gradients and writing one in the
    tensor's dtype (counted with the first cast's backward; the formulas' ``branch_sums``,
    ``costmodel.formulas.compute``)."""
    p = sol.problem
    graph = p.graph
    out: list[tuple[str, Kernels, int, set[int]]] = []
    branches: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for i in graph.graph.nodes:
        n = graph.node(i)
        op = n.aten
        if n.backward or n.family != "view" or not n.output_bytes:
            continue
        if op in _FILLS:
            if len(n.shape) == 0 or n.output_bytes < 2 * math.prod(n.shape):
                continue  # a scalar (the loss's gradient seed), integers (a loss's labels)
            # Split as the ops writing into it lay out their outputs.
            fill_readers = _readers(sol, i)
            share = min((_share(sol, sol.strategy(u).out) for u in fill_readers), default=1)
            out.append((n.layer, Kernels(memory_bytes=n.output_bytes / share,
                                         memory_kernels=1), -1, fill_readers))
            continue
        if op not in COPY_OPS:
            continue
        src = n.inputs[0].source if n.inputs else -1
        while src >= 0 and src not in p.layer and graph.node(src).family == "view" \
                and graph.node(src).inputs:
            src = graph.node(src).inputs[0].source
        share = _share(sol, sol.strategy(src).out) if src in p.layer else 1
        readers = _readers(sol, i)
        if src in p.layer and p.layer[src] != n.layer:
            # A cast of the layer's input runs on the input as the layer takes it (whole,
            # or sequence shards under SP; as ``_holders`` reads it): as split as its
            # readers read it, not as another layer's op made it.
            share = min((_share(sol, sol.strategy(u).ins[k]) for u, k in _uses(p, readers, src)),
                        default=1)
        moved = (sum(r.nbytes for r in n.inputs) + n.output_bytes) / share
        if src < 0 and n.inputs and n.inputs[0].param:
            # A cast of a parameter (autocast's of a weight): once per forward pass, its
            # gradient's cast back in backward; the tokens do not scale it.
            out.append((n.layer, Kernels(weight_cast_bytes=moved, weight_cast_kernels=1),
                        src, readers))
            continue
        if n.grad and src >= 0 and n.inputs:
            branches.setdefault((n.layer, src), []).append((len(out), n.inputs[0].nbytes / share))
        out.append((n.layer, Kernels(memory_bytes=moved, memory_kernels=1,
                                     memory_backward_bytes=moved if n.grad or n.fused_grad
                                     else 0.0,
                                     memory_backward_kernels=1 if n.grad or n.fused_grad
                                     else 0), src, readers))
    for casts in branches.values():
        (first, nbytes), extra = casts[0], len(casts) - 1
        if extra:
            layer, k, src, readers = out[first]
            out[first] = (layer, dataclasses.replace(
                k, memory_backward_bytes=k.memory_backward_bytes + 3 * nbytes * extra,
                memory_backward_kernels=k.memory_backward_kernels + extra), src, readers)
    return out


def _readers(sol: Solution, i: int) -> set[int]:
    """The real forward nodes that read node ``i``'s output, through views."""
    p, graph = sol.problem, sol.problem.graph.graph
    out: set[int] = set()
    todo, seen = [i], {i}
    while todo:
        for u in graph.successors(todo.pop()):
            if u in seen or sol.problem.graph.node(u).backward:
                continue
            seen.add(u)
            if u in p.layer:
                out.add(u)
            elif sol.problem.graph.node(u).family == "view":
                todo.append(u)
    return out


def _merge_gemms(k: Kernels) -> Kernels:
    """``k`` with identical matmuls counted once each, with their count."""
    counts: dict[Gemm, int] = {}
    for g in k.gemms:
        key = dataclasses.replace(g, count=1)
        counts[key] = counts.get(key, 0) + g.count
    return dataclasses.replace(k, gemms=tuple(dataclasses.replace(key, count=c)
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
    layer = [u for u in p.nodes if p.layer[u] == p.layer[v]]
    reads = [made if p.sequence_parallel and p.graph.node(u).family == "matmul"
             else _share(sol, sol.strategy(u).ins[k]) for u, k in _uses(p, layer, src)]
    return min(reads, default=made)


def _uses(p: ShardingProblem, users: Iterable[int], src: int) -> list[tuple[int, int]]:
    """(node, input slot) of each input of ``users`` that is node ``src``'s output."""
    return [(u, k) for u in users for k, inp in enumerate(p.inputs[u]) if inp.source == src]
