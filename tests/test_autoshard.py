"""Splitting rules, resharding costs and the sharding ILP on traced graphs.

The ILP must equal brute force over every assignment of strategies on small graphs; on a
transformer block it must recover Megatron's column/row split with sequence parallel when
the weights cannot be replicated, and pure data parallel for a small model with a large batch.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from costmodel import Cluster, Infeasible, Job, ModelSpec, SpecError  # noqa: E402
from costmodel.formulas.comm import Topology  # noqa: E402
from costmodel.trace.autoshard import ShardingProblem, brute_force, solve  # noqa: E402
from costmodel.trace.blockcosts import costs_from_graph  # noqa: E402
from costmodel.trace.graph import LayerGraph  # noqa: E402
from costmodel.trace.layouts import Mesh  # noqa: E402
from costmodel.trace.sharding import (  # noqa: E402
    PARTIAL,
    REPLICATE,
    op_loops,
    reshard_time,
    view_groups,
    view_map,
    view_spans,
)
from planner.runtime.model import build_model  # noqa: E402

NODE = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)


def test_matmul_rules_are_megatrons_splits() -> None:
    loops = op_loops("addmm", "matmul", [], [(64,), (32, 16), (16, 64)], (32, 64))
    by_role = {lp.role: lp for lp in loops}
    # rows: A split, B and bias replicated; columns: B and bias split (column-parallel);
    # contraction: A by columns, B by rows, output a partial sum (row-parallel).
    assert by_role["m"].ins == (None, 0, None) and by_role["m"].out == 0
    assert by_role["n"].ins == (0, None, 1) and by_role["n"].out == 1
    assert by_role["k"].ins == (None, 1, 0) and by_role["k"].out is None


def test_norm_softmax_reduction_embedding_and_unknown_rules() -> None:
    norm = op_loops("native_layer_norm", "norm", [[64], 1e-5], [(2, 8, 64), (64,), (64,)],
                    (2, 8, 64))
    assert [lp.out for lp in norm] == [0, 1]  # never the normalized dim
    soft = op_loops("_softmax", "softmax", [-1, False], [(2, 8, 8)], (2, 8, 8))
    assert [lp.out for lp in soft] == [0, 1, 2]
    # The softmax axis too, vocabulary-parallel: max, sum (forward) and the gradient's sum
    # (backward) all-reduced, one fp32 value per row each; the other loops need nothing.
    assert [lp.all_reduce_bytes for lp in soft] == [0.0, 0.0, 3 * 4.0 * 2 * 8]
    loss = op_loops("nll_loss_forward", "loss", [1, -100], [(16, 50), (16,)], ())
    assert [(lp.ins, lp.out) for lp in loss] == [((0, 0), None), ((1, None), None)]
    total = op_loops("sum", "reduction", [[1], False], [(4, 8, 3)], (4, 3))
    assert [(lp.ins, lp.out) for lp in total] == [((0,), 0), ((1,), None), ((2,), 1)]
    emb = op_loops("embedding", "embedding", [], [(100, 16), (2, 8)], (2, 8, 16))
    assert [(lp.ins, lp.out) for lp in emb] == [((None, 0), 0), ((None, 1), 1), ((1, None), 2),
                                               ((0, None), None)]  # vocab-parallel: partial
    assert op_loops("topk", "routing", [2], [(4, 8)], (4, 2)) == ()
    assert op_loops("bessel_j0", "unknown", [], [(4, 8)], (4, 8)) == ()


def test_view_maps_follow_dims_through_reshapes_and_transposes() -> None:
    assert view_map("view", [[32, 64]], (2, 16, 64), (32, 64)) == (0, 2)
    assert view_map("view", [[2, 16, 4, 16]], (2, 16, 64), (2, 16, 4, 16)) == (0, 1, 2, None)
    assert view_map("_unsafe_view", [[2, 16, 64]], (32, 64), (2, 16, 64)) == (0, None, 1)
    assert view_map("transpose", [1, 2], (2, 16, 4, 8), (2, 4, 16, 8)) == (0, 2, 1, 3)
    assert view_map("permute", [[2, 0, 1]], (2, 3, 4), (4, 2, 3)) == (2, 0, 1)
    assert view_map("t", [], (3, 4), (4, 3)) == (1, 0)
    assert view_map("expand", [[5, 3, 4]], (1, 4), (5, 3, 4)) == (None, None, 1)


def test_view_spans_say_which_dims_a_reshape_runs_along() -> None:
    # [batch * seq] split into [batch, seq]: both run along the merged dim (where view_map
    # gives the leading one only, the dim a split of the first output dim splits).
    assert view_spans("_unsafe_view", [[2, 16, 64]], (32, 64), (2, 16, 64)) == ((0,), (0,), (1,))
    assert view_groups("_unsafe_view", [[2, 16, 64]], (32, 64), (2, 16, 64)) == (
        ((0,), (0, 1)), ((1,), (2,)))
    # A slice runs along the dim it slices; a broadcast dim along none; a permutation moves.
    assert view_spans("slice", [1, 0, 8], (2, 16, 64), (2, 8, 64)) == ((0,), (1,), (2,))
    assert view_spans("expand", [[5, 3, 4]], (1, 4), (5, 3, 4)) == ((), (), (1,))
    assert view_spans("permute", [[2, 0, 1]], (2, 3, 4), (4, 2, 3)) == ((2,), (0,), (1,))
    assert view_groups("permute", [[2, 0, 1]], (2, 3, 4), (4, 2, 3)) is None


def test_tokens_are_followed_through_reshapes_factor_by_factor() -> None:
    """A model fed features rather than token ids (``[batch, seq, features]`` into a linear,
    as a ViT's patches are): nn.MultiheadAttention views its ``[seq * batch, 3 * hidden]``
    projection as ``[seq, batch * heads, head_dim]`` and then ``[batch, heads, seq,
    head_dim]``. Followed factor by factor, the attention's batch and sequence dims run
    along the tokens and its heads do not, so tensor parallelism may split the heads:
    Megatron-LM's split of the attention (Shoeybi et al. 2019, Sec. 3), which the ILP
    picks; followed by the leading dim alone, the sequence was lost at the first linear's
    output and no op of the attention met the tokens (each had to stay whole)."""

    class Encoder(nn.Module):
        def __init__(self, d: int = 256, heads: int = 4) -> None:
            super().__init__()
            self.inp = nn.Linear(16, d)
            self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
                for _ in range(2)])
            self.head = nn.Linear(d, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
            return self.head(x[:, 0])

    with torch.device("meta"):
        graph = LayerGraph.from_module(Encoder(), torch.zeros(4, 8, 16), dtype=torch.bfloat16)
    job = Job(global_batch_size=64, seq_len=1)
    problem = ShardingProblem(graph, Mesh((1, 2)), NODE, job, budget=math.inf,
                              tensor_parallel=True)
    attn = [v for v in problem.nodes if graph.node(v).layer == "blocks.0"
            and graph.node(v).op.startswith("aten._scaled_dot_product")]
    assert len(attn) == 1 and graph.node(attn[0]).shape == (4, 4, 8, 64)
    assert problem.token_dims[attn[0]] == frozenset({0, 2})  # batch and sequence, not heads
    sol = solve(problem)
    ops = [(graph.node(v).op.split(".")[1][:12], sol.strategy(v).label) for v in problem.nodes
           if graph.node(v).module == "blocks.0.self_attn"]
    assert ops == [("mm", "R|n"), ("add", "R|d2"), ("_scaled_dot_", "R|h"), ("addmm", "R|k")]


def test_an_images_pixels_are_its_tokens() -> None:
    """A ViT traced on one image (``planner.examples.ViT``, ViT-L/16's widths): its patch
    convolution's output positions and the class token joined to them along the sequence
    are tokens, as a language model's positions are, so tensor parallelism splits its
    blocks as Megatron-LM splits a decoder's (heads, then the MLP column- then row-wise)
    and divides their compute. Without it nothing in the blocks met a token dim (batch 1,
    no loop along a convolution's positions or a concatenation's joined dim): every op
    stayed whole on every rank and TP only added its ranks' idle time."""
    from planner.examples import ViT

    with torch.device("meta"):
        vit = ViT(dim=1024, depth=2, heads=16, patch=16, image=224, classes=1000)
    graph = LayerGraph.from_module(vit, torch.zeros(1, 3, 224, 224), dtype=torch.bfloat16)
    job = Job(global_batch_size=256, seq_len=1, framework="torchtitan")
    costs = costs_from_graph(graph, NODE, job, tp_degrees=(1, 2))
    plan = costs.tp_plan(2)
    assert plan["blocks.*.linear1"] == "colwise" and plan["blocks.*.linear2"] == "rowwise"
    attn = [label for _v, module, _op, label, _lay in costs.layouts[2]
            if module == "blocks.0.self_attn"]
    assert attn == ["R|n", "R|h", "R|k"]
    # Its patch convolution, and the class token and positions its own forward adds, stay
    # whole: no module boundary (or TP style) to split them on, as planner.apply runs them.
    stem = [(op.split(".")[1], label) for _v, module, op, label, _lay in costs.layouts[2]
            if module in ("", "patch")]
    assert stem == [("convolution", "R|R"), ("cat", "R|R"), ("add", "R|R")]
    (block,) = costs.layer_blocks()
    assert block.at(2).forward_flops < 0.6 * block.at(1).forward_flops
    # Its TP traffic is Megatron-LM's: the attention's and the MLP's output all-reduced
    # forward, their input gradients backward, one activation each. The packed projection's
    # query, key and value rows are split by heads (planner.runtime.attention reorders them
    # so), so nothing gathers them; before, the views that pick a head out of the packed
    # features left the heads unmapped and the ILP all-gathered the projection's output
    # (three activations a layer).
    act = 197 * 1024 * 2  # 196 patches and the class token, bf16
    tp2 = block.at(2).collectives
    assert tp2["all-reduce"] == pytest.approx(4 * act, rel=1e-9)
    # The head is split by its input features: backward gathers the class token's gradient
    # (one token, once in the stack) before the select's backward puts it in its sequence;
    # before, the ILP charged gathering the whole sequence's gradient there.
    assert tp2.get("all-gather", 0.0) * block.repeat <= 1024 * 2 * (1 + 1e-9)


def test_a_packed_projections_heads_map_to_its_features() -> None:
    """``_packed_heads``: a view's dim holding the heads of an nn.MultiheadAttention's packed
    projection output ``[tokens, 3 * heads * head_dim]`` (source dim 1; pieces are (source
    dim, size, inner)) maps to its features, which HeadParallel's row order splits by
    heads; a head's width (the innermost piece) never does, nor heads merged with the
    sequences."""
    from costmodel.trace.layouts import _packed_heads

    heads, width = (1, 16, 64), (1, 64, 1)
    # [batch, heads, seq, head_dim], the batch and sequence mapped to the tokens (dim 0).
    assert _packed_heads((0, None, 0, None), [((0, 2, 1),), (heads,), ((0, 8, 2),), (width,)],
                         1) == (0, 1, 0, None)
    # [heads, seq, head_dim] of one sequence: the heads.
    assert _packed_heads((None, 0, None), [(heads,), ((0, 8, 1),), (width,)], 1) == (1, 0, None)
    # [batch * heads, seq, head_dim] of two sequences: not the heads alone, not the width.
    assert _packed_heads((None, 0, None), [((0, 2, 8), heads), ((0, 8, 1),), (width,)],
                         1) == (None, 0, None)
    # Already mapped: unchanged.
    assert _packed_heads((0, 1), [((0, 8, 1),), ((1, 3072, 1),)], 1) == (0, 1)


def test_cross_attention_splits_the_heads_of_its_packed_projection() -> None:
    """nn.MultiheadAttention attending to another sequence (a T5-style decoder's attention
    over the encoder's output, ``planner.examples.EncoderDecoder``) slices its packed input
    projection's weight into the query rows and the key and value rows: each slice is
    split by its output features (the heads) as the whole projection is in self-attention,
    and the attention and output projection follow (Megatron-LM's split). Before, a slice
    of a weight kept no dim to split along its rows, so the ILP split the projections by
    their input features and all-reduced the queries, keys and values."""
    from planner.examples import EncoderDecoder

    with torch.device("meta"):
        t5 = EncoderDecoder(vocab=64, dim=32, heads=4, encoder_layers=1, decoder_layers=1)
    graph = LayerGraph.from_module(t5, torch.zeros(2, 8, dtype=torch.long))
    job = Job(global_batch_size=8, seq_len=8)
    costs = costs_from_graph(graph, NODE, job, tp_degrees=(1, 2))
    cross = [label for _v, module, _op, label, _lay in costs.layouts[2]
             if module == "decoder.0.multihead_attn"]
    assert cross == ["R|n", "R|d2", "R|n", "R|d2", "R|h", "R|k"]


def test_multihead_attention_projections_split_only_as_its_heads_style_runs() -> None:
    """Under sequence parallelism at tp = 8, the ILP split a T5-style decoder's cross-attention
    key and value projection by its input features (its partial sums reduced after), a
    layout no TP style runs: the search then refused sequence parallelism at that degree for
    the whole model. An ``nn.MultiheadAttention``'s projections may only split as
    ``HeadParallel`` splits them: the packed input projection by its output features (the
    heads), the output projection by its input features."""
    from planner.examples import EncoderDecoder

    with torch.device("meta"):
        t5 = EncoderDecoder(vocab=512, dim=128, heads=8, encoder_layers=1, decoder_layers=1)
    graph = LayerGraph.from_module(t5, torch.zeros(1, 64, dtype=torch.long),
                                   dtype=torch.bfloat16)
    job = Job(global_batch_size=256, seq_len=64, framework="torchtitan")
    costs = costs_from_graph(graph, NODE, job, tp_degrees=(1, 8), sequence_parallel=True)
    assert costs.tp_refusal(8, True) == ""
    for module in ("decoder.0.multihead_attn", "decoder.0.self_attn", "encoder.0.self_attn"):
        labels = [label for _v, m, _op, label, _lay in costs.layouts[8] if m == module]
        assert labels[-2:] == ["R|h", "R|k"] and set(labels[:-2]) == {"R|n"}, (module, labels)


def test_resharding_costs_are_the_collectives() -> None:
    cluster = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=8, inter_node_link="ib-ndr")
    topo = Topology.of(cluster)
    mesh, strides = (2, 8), (8, 1)
    nbytes = 64 * 2**20
    r = REPLICATE
    # Axis 1 (8 GPUs in a node): partial -> replicated is an all-reduce of the whole tensor.
    assert reshard_time(topo, mesh, strides, (r, PARTIAL), (r, r), nbytes) == \
        pytest.approx(float(topo.all_reduce(nbytes, 8, 1)))
    assert reshard_time(topo, mesh, strides, (r, PARTIAL), (r, 0), nbytes) == \
        pytest.approx(float(topo.reduce_scatter(nbytes, 8, 1)))
    # Axis 0 crosses nodes, on a tensor already split 8 ways on axis 1.
    assert reshard_time(topo, mesh, strides, (0, 1), (r, 1), nbytes) == \
        pytest.approx(float(topo.all_gather(nbytes / 8, 2, 8)))
    assert reshard_time(topo, mesh, strides, (r, 0), (r, 1), nbytes) == \
        pytest.approx(float(topo.all_to_all(nbytes / 8, 8, 1)))
    assert reshard_time(topo, mesh, strides, (r, r), (0, 1), nbytes) == 0.0  # local slices
    with pytest.raises(ValueError):
        reshard_time(topo, mesh, strides, (r, r), (r, PARTIAL), nbytes)


def _mlp_graph(batch: int = 64) -> LayerGraph:
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    return LayerGraph.from_module(mlp, torch.randn(batch, 512), dtype=torch.bfloat16)


class _Block(nn.Module):
    """Pre-norm residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.mark.parametrize("case", ["mlp-1x8", "mlp-2x4", "block-1x4", "mlp-tight"])
def test_the_ilp_equals_brute_force(case: str) -> None:
    job = Job(global_batch_size=64, seq_len=1)
    if case.startswith("block"):
        graph = LayerGraph.from_module(_Block(256), torch.randn(4, 128, 256),
                                       dtype=torch.bfloat16)
        mesh = Mesh((1, 4))
    else:
        graph = _mlp_graph()
        mesh = Mesh((2, 4)) if case == "mlp-2x4" else Mesh((1, 8))
    problem = ShardingProblem(graph, mesh, NODE, job, micro_batches=4)
    if case == "mlp-tight":  # a budget between the least and the most memory
        low = brute_force(ShardingProblem(graph, mesh, NODE, job, micro_batches=4,
                                          budget=math.inf))
        problem = ShardingProblem(graph, mesh, NODE, job, micro_batches=4,
                                  budget=0.5 * low.memory_bytes)
    assert 1 < problem.size() <= 200_000
    ilp, brute = solve(problem), brute_force(problem)
    assert ilp.optimal
    assert ilp.objective_s == pytest.approx(brute.objective_s, rel=1e-6)
    assert ilp.memory_bytes <= problem.budget


class _Combine(nn.Module):
    """A MoE layer's shape in miniature: a router's two scores per token, the tokens sent
    to a row-split MLP in the router's order, its output gathered back, weighted by the
    scores and summed."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.router = nn.Linear(h, 2, bias=False)
        self.up = nn.Linear(h, 4 * h, bias=False)
        self.down = nn.Linear(4 * h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.router(x).softmax(-1)
        pick = torch.cat([w[:, 0].argsort(), w[:, 1].argsort()])
        y = self.down(torch.nn.functional.gelu(self.up(x.index_select(0, pick))))
        back = y.index_select(0, pick.argsort()).view(2, -1, x.shape[1])
        return (back * w.t().unsqueeze(-1)).sum(0)


def test_a_partial_sum_is_carried_to_after_the_weighted_sum() -> None:
    """Under tensor parallelism the down projection's partial sums pass unreduced through
    the gather, the weighting and the sum (ops linear in them), and are all-reduced once,
    on half the bytes (two routed copies per token); the router stays whole; the ILP equals
    brute force over every assignment, the carrying strategies included."""
    graph = LayerGraph.from_module(nn.Sequential(_Combine(1024)), torch.randn(4096, 1024),
                                   dtype=torch.bfloat16)
    problem = ShardingProblem(graph, Mesh((1, 4)), NODE, Job(global_batch_size=64, seq_len=1),
                              micro_batches=4, tensor_parallel=True)
    sol, brute = solve(problem), brute_force(problem)
    assert sol.objective_s == pytest.approx(brute.objective_s, rel=1e-6)
    ops = {v: op.split(".")[1] for v, op, _label, _out in sol.layouts()}
    mm = [label for v, _op, label, _out in sol.layouts() if ops[v] == "mm"]
    assert mm == ["R|R", "R|n", "R|k"]  # the router whole; the MLP column- then row-split
    reduced = [(ops[u], ops[v], kinds) for u, v, kinds, _s in sol.collectives()
               if "all-reduce" in kinds and not kinds.startswith("bwd")]
    assert reduced == [("sum", "sum", "all-reduce@1")]  # the weighted sum, into the loss
    assert sum(sol.strategy(v).label == "P" for v in ops) == 3  # gather, weight, sum


def _transformer(h: int, batch: int, seq: int, layers: int = 4) -> LayerGraph:
    spec = ModelSpec(name="block", num_layers=layers, hidden_size=h, num_heads=h // 128,
                     num_kv_heads=h // 128, ffn_hidden_size=4 * h, vocab_size=32000,
                     gated_mlp=False)
    return LayerGraph.from_module(build_model(spec, device="meta"),
                                  torch.randint(0, 32000, (batch, seq)), dtype=torch.bfloat16)


def _by_module(graph: LayerGraph, sol: object, op: str) -> dict[str, str]:
    return {graph.node(v).module.rsplit(".", 1)[-1]: label
            for v, name, label, _out in sol.layouts()  # type: ignore[attr-defined]
            if name.startswith(op) and graph.node(v).layer == "layers.0"}


def test_megatron_column_row_split_with_sequence_parallel_is_recovered() -> None:
    """One sequence of 2,048 tokens of a 16-layer h=8192 model on 8 GPUs of a node, with
    memory for one eighth of the weights' state: Megatron-LM's split (Shoeybi et al. 2019,
    Sec. 3; Korthikanti et al. 2022, Sec. 4.2.2) is the cheapest, and the ILP finds it."""
    graph = _transformer(8192, 1, 2048, layers=16)
    job = Job(global_batch_size=1, seq_len=2048)
    problem = ShardingProblem(graph, Mesh((1, 8)), NODE, job, budget=28 * 2**30)
    sol = solve(problem)
    mm = _by_module(graph, sol, "aten.mm")
    assert {mm[k] for k in ("wq", "wk", "wv", "w1")} == {"R|n"}  # column-parallel
    assert mm["wo"] == mm["w2"] == "R|k"  # row-parallel: partial sums
    assert set(_by_module(graph, sol, "aten._scaled_dot_product").values()) == {"R|h"}
    # Sequence parallel: the residual stream between them is split along the sequence.
    residual = [sol.strategy(v).out for v in problem.nodes
                if graph.node(v).layer == "layers.0" and graph.node(v).module == "layers.0"]
    assert residual and all(out == (REPLICATE, 1) for out in residual)
    kinds = " ".join(c[2] for c in sol.collectives())
    assert "reduce-scatter@1" in kinds and "all-gather@1" in kinds


def test_pure_data_parallel_for_a_small_model_and_a_large_batch() -> None:
    graph = _transformer(256, 64, 512)
    job = Job(global_batch_size=64, seq_len=512)
    sol = solve(ShardingProblem(graph, Mesh((1, 8)), NODE, job))
    labels = {label for v, name, label, _ in sol.layouts() if name.startswith("aten.mm")}
    assert labels == {"R|m"}  # every matmul split by rows (tokens), weights replicated
    assert all(c[2].startswith("all-reduce") for c in sol.collectives())  # only the loss


def test_plan_takes_a_module() -> None:
    """A module of repeated blocks goes through the one search (its LayerCosts; samples:
    seq_len 1)."""
    import planner

    cluster = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=8, inter_node_link="ib-ndr")
    job = Job(global_batch_size=256, seq_len=1)
    model = nn.Sequential(*[_Block(1024) for _ in range(8)])
    plan = planner.plan(model, cluster, job, example_inputs=torch.randn(32, 128, 1024))
    assert isinstance(plan, planner.Plan) and plan.config.world_size == 16
    layer = next(b for b in plan.model.blocks if b.kind == "layer")
    assert layer.repeat == 8 and plan.model.num_layers == 8  # "0" traced once
    assert plan.estimate.fits and "why not" in plan.summary()
    with pytest.raises(SpecError, match="example_inputs"):
        planner.plan(model, cluster, job)


def test_a_reference_transformer_module_is_traced_not_read() -> None:
    """The module ``build_model`` returns carries its ModelSpec, but ``plan`` traces it like
    any other module (nothing reads the ``.spec``): the same configuration as the preset,
    the step time apart by the eager kernels it runs."""
    import planner

    spec = ModelSpec.preset("gpt3-125m")
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    job = Job(global_batch_size=64, seq_len=1024)
    from_module = planner.plan(build_model(spec, device="meta"), cluster, job,
                               example_inputs=torch.zeros(1, 1024, dtype=torch.long))
    from_spec = planner.plan(spec, cluster, job)
    assert from_module.model.spec is None  # its LayerCosts come from the trace
    assert from_module.config == from_spec.config
    assert from_module.estimate.step_time_s == pytest.approx(from_spec.estimate.step_time_s,
                                                             rel=0.2)
    with pytest.raises(SpecError, match="trace the job's sequence length"):
        planner.plan(build_model(spec, device="meta"), cluster, job,
                     example_inputs=torch.zeros(1, 512, dtype=torch.long))


def test_nothing_fits_says_so() -> None:
    graph = _mlp_graph()
    job = Job(global_batch_size=64, seq_len=1)
    with pytest.raises(SpecError, match="no sharding fits"):
        solve(ShardingProblem(graph, Mesh((1, 8)), NODE, job, budget=1024.0))
    with pytest.raises(Infeasible, match="nothing fits"):
        import planner

        tiny = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1)
        planner.plan(_transformer(8192, 64, 4096, layers=512), tiny,
                     Job(global_batch_size=64, seq_len=4096))
