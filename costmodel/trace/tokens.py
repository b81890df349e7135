"""What a traced graph's ops do with tokens, read before any layout is chosen: which dims of each
tensor run along the model inputs' tokens, which ops mix tokens (attention, a token-mixing
linear), which route them to experts and with what top-k, which ops are attention's
projections, and which nodes follow a leader's layout. ``ShardingProblem`` (its tensor-parallel
mode: no loop along the tokens is split) is built on these facts.
"""

from __future__ import annotations

from costmodel.trace.graph import LayerGraph
from costmodel.trace.layouts import (
    Layout,
    Mesh,
    Strategy,
    _holds_tokens,
    _Input,
    _rify,
)
from costmodel.trace.sharding import REPLICATE, Loop


class GraphFacts:
    """The token and routing facts of a sharding problem's graph (``ShardingProblem`` is
    one): computed once when the problem is built, from the fields declared here."""

    graph: LayerGraph
    mesh: Mesh
    nodes: list[int]
    inputs: dict[int, list[_Input]]
    layer: dict[int, str]
    sequence_parallel: bool
    token_dims: dict[int, frozenset[int]]
    score_dims: dict[int, frozenset[int]]
    routers: set[int]
    routing_topks: dict[int, tuple[int, int]]
    routed: set[int]
    strategies: dict[int, list[Strategy]]

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
                # loop splits them: ``costmodel.trace.sharding``): an image's pixels, a ViT's
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


#: Families whose ops follow the layout of their single input node.
_LIGHT = ("elementwise", "norm", "softmax", "reduction", "loss", "index", "pool")
