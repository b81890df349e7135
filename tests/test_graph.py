"""``LayerGraph.from_module``: a torch model traced on the meta device into a layer graph.

The reference transformers must match their analytic ``ModelSpec`` (parameters exactly,
model FLOPs within 1 %); hand-written MLP, CNN and ViT models match FLOPs counted by hand;
identical blocks are traced once; unknown ops are named, never silently zero.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from costmodel import ModelSpec, SpecError  # noqa: E402
from costmodel.formulas.steptime import model_flops_per_token  # noqa: E402
from costmodel.trace.graph import LayerGraph  # noqa: E402
from planner.examples import ViT  # noqa: E402
from planner.runtime.model import build_model  # noqa: E402


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-2-70b", "gpt3-125m", "gpt3-2.7b"])
def test_reference_transformers_match_their_spec(name: str) -> None:
    spec = ModelSpec.preset(name)
    seq = 1024
    graph = LayerGraph.from_module(build_model(spec, device="meta"),
                                   torch.randint(0, spec.vocab_size, (2, seq)))
    assert graph.num_params() == spec.num_params()
    # PaLM (Chowdhery et al. 2022, App. B) model FLOPs: 6 N + 12 L q s per token.
    analytic = model_flops_per_token(spec, seq) * 2 * seq
    assert graph.model_flops() == pytest.approx(analytic, rel=0.01)
    # One block traced, standing for all of them.
    block = graph.layer("layers.0")
    assert block.repeat == spec.num_layers and block.module_type == "Block"
    assert not any(x.name.startswith("layers.1") for x in graph.layers)
    assert graph.unsupported == []
    assert block.saved_bytes > 0 and block.output_bytes == 2 * seq * spec.hidden_size * 4
    # Its fused attention runs over the whole sequence of keys (what each query block's
    # fixed work is weighed against, costmodel.formulas.compute.flash_attention_time); other ops
    # have none.
    ops = [graph.node(i) for i in graph.graph.nodes]
    attn = [n for n in ops if n.family == "attention" and n.model_flops and not n.backward]
    assert attn and all(n.attention_keys == seq for n in attn)
    assert all(n.attention_keys is None for n in ops if n.family == "matmul")


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-moe-16b"])
def test_reference_moe_transformers_match_their_spec(name: str) -> None:
    """The reference transformer's mixture-of-experts layers (``MoEFeedForward``): the
    parameters equal the ModelSpec's; dropless, the experts' grouped matmuls do the active
    experts' work, so the model FLOPs equal PaLM's 6 N_active + 12 L q s; the
    MoE layers (after DeepSeekMoE's leading dense one) are one run traced once, their shared
    experts inside it."""
    spec = ModelSpec.preset(name)
    seq = 1024
    graph = LayerGraph.from_module(build_model(spec, device="meta"),
                                   torch.randint(0, spec.vocab_size, (2, seq)))
    assert graph.num_params() == spec.num_params()
    analytic = model_flops_per_token(spec, seq) * 2 * seq
    assert graph.model_flops() == pytest.approx(analytic, rel=1e-4)
    runs = [x for x in graph.layers if x.repeat > 1]
    assert [(x.name, x.repeat) for x in runs] == \
        [(f"layers.{spec.first_dense_layers}", spec.num_moe_layers)]
    assert graph.unsupported == []


def test_moe_layer_routes_as_a_loop_over_tokens_does() -> None:
    """``MoEFeedForward`` against a loop over tokens, as torchtitan's MoE computes it
    (torchtitan/models/moe/moe.py @08dc75ae, MoEArgs defaults): each token's top-k experts
    by sigmoid score (plus the load-balancing bias, which only chooses), the token scaled by
    its score before the expert's MLP (not linear in it: SwiGLU), plus the shared experts.
    Dropless: a sequence's output does not depend on the batch it is in, and the layer
    counts each expert's tokens (``tokens_per_expert``, what a trainer updates the bias
    from)."""
    from planner.runtime.model import MoEFeedForward

    spec = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=16, num_heads=2,
                     vocab_size=64, num_experts=4, top_k=2, moe_ffn_hidden_size=24,
                     num_shared_experts=1, first_dense_layers=1, gated_mlp=True)
    torch.manual_seed(0)
    moe = MoEFeedForward(spec)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    moe.tokens_per_expert.zero_()
    moe.expert_bias.copy_(torch.tensor([0.0, 0.5, 0.0, 0.0]))
    x = torch.randn(3, 10, 16)
    want = torch.zeros_like(x)
    for b in range(3):
        for t in range(10):
            tok = x[b, t]
            scores = torch.sigmoid(moe.router(tok))
            chosen = (scores + moe.expert_bias).topk(2).indices
            for e in chosen:
                u = scores[e] * tok
                want[b, t] += (F.silu(u @ moe.w1[e]) * (u @ moe.w3[e])) @ moe.w2[e]
            want[b, t] += moe.shared(tok)
    got = moe(x)
    assert torch.allclose(got, want, atol=1e-5)
    assert moe.tokens_per_expert.sum() == 3 * 10 * 2
    alone = torch.cat([moe(x[b:b + 1]) for b in range(3)])
    assert torch.allclose(got, alone, atol=1e-6)
    got.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in moe.parameters())

@pytest.mark.parametrize("name, dropout", [("llama-3-8b", 0.0), ("llama-2-70b", 0.0),
                                           ("gpt3-125m", 0.1)])
def test_saved_activations_match_the_analytic_estimate(name: str, dropout: float) -> None:
    """Bytes one block saves for backward: Korthikanti et al. 2022, Sec. 4.1 (sbh(34 +
    5as/h) for GPT), with fused attention saving Q, K, V, O and the log-sum-exp (Dao et al.
    2022) and an eager gated MLP saving four ffn-wide tensors; the trace runs attention and
    RMS norm as the fused kernels a GPU runs."""
    from costmodel import Job, ParallelConfig
    from costmodel.formulas.activations import layer_activations
    from costmodel.formulas.arrays import ConfigArrays
    from costmodel.frameworks import framework

    spec = ModelSpec.preset(name)
    seq = 2048
    graph = LayerGraph.from_module(build_model(spec, device="meta", dropout=dropout),
                                   torch.randint(0, spec.vocab_size, (1, seq)))
    job = Job(global_batch_size=1, seq_len=seq, precision="fp32", framework="torchtitan")
    arrays = ConfigArrays.from_configs(spec, [ParallelConfig(micro_batch_size=1)])
    analytic = float(layer_activations(spec, job, framework("torchtitan"), arrays,
                                       moe=False)["none"][0])
    assert graph.layer("layers.0").saved_bytes == pytest.approx(analytic, rel=0.02)


def test_tracing_every_block_gives_the_same_totals() -> None:
    spec = ModelSpec(name="tiny", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, vocab_size=256)
    module = build_model(spec, device="meta")
    x = torch.randint(0, 256, (2, 32))
    once = LayerGraph.from_module(module, x)
    every = LayerGraph.from_module(module, x, repeat_blocks=False)
    assert [x.name for x in every.layers if x.name.startswith("layers")] == \
        ["layers.0", "layers.1", "layers.2"]
    assert once.num_params() == every.num_params() == spec.num_params()
    assert once.model_flops() == pytest.approx(every.model_flops())
    assert once.saved_bytes() == pytest.approx(every.saved_bytes())
    assert len(module.layers) == 3  # the module is left whole


def test_an_mlp_counts_what_a_hand_count_says() -> None:
    widths = [32, 64, 64, 16]
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                        nn.Linear(64, 16))
    batch = 8
    graph = LayerGraph.from_module(mlp, torch.randn(batch, 32))
    macs = [a * b for a, b in itertools.pairwise(widths)]
    assert graph.forward_model_flops() == 2 * batch * sum(macs)
    # Backward: every weight gradient, and the input gradients of all but the first layer
    # (the input needs no gradient).
    assert graph.model_flops() - graph.forward_model_flops() == \
        2 * batch * (sum(macs) + sum(macs[1:]))
    assert graph.num_params() == sum(p.numel() for p in mlp.parameters())
    assert all(p.device.type == "cpu" for p in mlp.parameters())  # untouched


class _Route(nn.Module):
    """A router: scores, a bias added to choose by, the top-k's indices (its values
    discarded), the chosen scores gathered."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x)
        _, chosen = (scores + 1.0).topk(2, dim=-1)
        return scores.gather(-1, chosen)


def test_ops_whose_gradient_never_reaches_the_loss_run_no_backward() -> None:
    """A top-k whose values nothing reads, and the bias added before it, get no gradient:
    autograd runs no backward for them, so the trace counts none (``OpNode.grad``); the
    scores the gather reads still get theirs."""
    graph = LayerGraph.from_module(_Route(), torch.zeros(4, 8))
    fwd = {graph.node(v).op.split(".")[1]: graph.node(v) for v in graph.graph
           if not graph.node(v).backward and graph.node(v).layer != "(loss)"}
    assert not fwd["topk"].grad and not fwd["add"].grad
    assert fwd["mm"].grad and fwd["gather"].grad


class _TwiceLinear(nn.Module):
    """A norm, then one linear applied twice (its weight read by two matmuls), then an
    nn.MultiheadAttention with its weights returned (torch's composite calls the matmuls
    by name, beyond the trace's function mode)."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(h)
        self.lin = nn.Linear(h, h, bias=False)
        self.attn = nn.MultiheadAttention(h, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(self.lin(self.norm(x)))
        return x + self.attn(y, y, y)[0]


def test_a_module_traced_under_autocast_casts_as_torch_autocast_does() -> None:
    """``autocast=torch.bfloat16`` traces what ``torch.autocast`` runs (it does not act on
    meta tensors): parameters and the residual stream in fp32, every matmul and attention
    on bf16 operands, a weight cast once per forward pass however often it is read (autocast
    caches a leaf's cast), the casts of weights not counted as activations (they are the
    weights' low-precision copies, which ``costmodel.formulas.memory`` counts beside them), and the
    norm in the dtype it is given."""
    import math

    h, batch = 16, 4
    graph = LayerGraph.from_module(_TwiceLinear(h), torch.zeros(1, batch, h),
                                   dtype=torch.float32, autocast=torch.bfloat16)
    fwd = [graph.node(v) for v in graph.graph if not graph.node(v).backward]
    mms = [n for n in fwd if n.family in ("matmul", "attention")]
    assert len(mms) >= 4 and all(r.nbytes == 2 * math.prod(r.shape)
                                 for n in mms for r in n.inputs)
    param_casts = [n for n in fwd if "_to_copy" in n.op and n.params]
    assert [n.params for n in param_casts].count(("lin.weight",)) == 1
    assert not any(n.saved_bytes for n in param_casts)
    norms = [n for n in fwd if n.module == "norm" and n.output_bytes]
    assert norms and all(n.output_bytes == 4 * math.prod(n.shape) for n in norms)
    assert graph.param_bytes() == 4 * graph.num_params()
    plain = LayerGraph.from_module(_TwiceLinear(h), torch.zeros(1, batch, h),
                                   dtype=torch.bfloat16)
    assert graph.model_flops() == plain.model_flops()


class BasicBlock(nn.Module):
    """A ResNet basic block (He et al. 2016): two 3x3 convolutions with batch norm and a
    residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


def test_a_resnet_style_cnn() -> None:
    c, hw, batch = 16, 32, 4
    net = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU(),
                        nn.Sequential(*[BasicBlock(c) for _ in range(4)]),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    graph = LayerGraph.from_module(net, torch.randn(batch, 3, hw, hw))
    assert graph.num_params() == sum(p.numel() for p in net.parameters())
    block = graph.layer("2.0")
    assert block.repeat == 4
    # Two 3x3 convolutions, c -> c over hw x hw: 2 * 9 c^2 hw^2 FLOPs each per image.
    assert block.forward_flops == 2 * (2 * 9 * c * c * hw * hw) * batch
    stem = graph.layer("0")
    assert stem.forward_flops == 2 * 9 * 3 * c * hw * hw * batch
    assert graph.unsupported == []


def test_a_vit() -> None:
    vit = ViT()
    graph = LayerGraph.from_module(vit, torch.randn(2, 3, 32, 32))
    assert graph.num_params() == sum(p.numel() for p in vit.parameters())
    assert graph.layer("blocks.0").repeat == 3
    tokens, dim = 2 * 17, 64
    # Per block forward: QKV + output projections 8 d^2, MLP 16 d^2 per token, attention
    # 4 s d per token (scores and weighted sum).
    expected = tokens * (2 * 4 * dim * dim + 2 * 8 * dim * dim) + 2 * 4 * 17 * 17 * dim
    assert graph.layer("blocks.0").forward_flops == pytest.approx(expected, rel=0.01)
    assert graph.unsupported == []
    # nn.MultiheadAttention's composite calls scaled_dot_product_attention by its name in
    # torch.nn.functional: it is traced as the fused kernel, not the s x s math path, and
    # the name is restored afterwards.
    ops = {graph.node(v).op for v in graph.graph.nodes}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops
    assert not ops & {"aten._safe_softmax.default", "aten.bmm.default"}
    assert nn.functional.scaled_dot_product_attention is \
        torch._C._nn.scaled_dot_product_attention


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(self.proj(x))


def test_an_unknown_op_is_named_and_counted_replicated() -> None:
    graph = LayerGraph.from_module(nn.Sequential(Odd()), torch.randn(4, 8))
    assert any("bessel_j0" in op and mod == "0" for op, mod in graph.unsupported)
    node = next(graph.node(i) for i in graph.graph.nodes if "bessel_j0" in graph.node(i).op
                and not graph.node(i).backward)
    assert node.family == "unknown" and node.other_flops == 32 and node.shardable_dims == ()
    assert "unsupported ops" in graph.summary() and "bessel_j0" in graph.summary()


def test_identical_blocks_that_change_shape_are_traced_one_by_one() -> None:
    net = nn.Sequential(*[nn.Conv2d(4, 4, 3, stride=2, padding=1) for _ in range(3)])
    graph = LayerGraph.from_module(net, torch.randn(1, 4, 32, 32))
    convs = [x for x in graph.layers if x.params]
    assert [x.name for x in convs] == ["0", "1", "2"]
    assert all(x.repeat == 1 for x in convs)
    flops = [x.forward_flops for x in convs]
    assert flops[0] == 4 * flops[1] == 16 * flops[2]  # each halves the image


def test_edges_follow_the_tensors() -> None:
    graph = LayerGraph.from_module(nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
                                   torch.randn(2, 8), backward=False)
    import networkx as nx

    assert nx.is_directed_acyclic_graph(graph.graph)
    relu = next(i for i in graph.graph.nodes if graph.node(i).op.startswith("aten.relu"))
    mm = next(i for i in graph.graph.nodes if graph.node(i).family == "matmul")
    assert nx.has_path(graph.graph, mm, relu)
    assert graph.node(mm).params and graph.node(mm).shardable_dims == (0, 1)
    assert graph.model_flops() == graph.forward_model_flops() == 2 * 2 * 8 * 8


class TiedLM(nn.Module):
    """An embedding and an output layer sharing one weight (as Hugging Face models tie them)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 100, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def test_tied_weights_count_once() -> None:
    model = TiedLM()
    graph = LayerGraph.from_module(model, torch.randint(0, 100, (2, 8)))
    assert graph.num_params() == sum(p.numel() for p in model.parameters()) == 100 * 16 + 272
    # The head still multiplies by the (shared) weight: 2 x 16 tokens x 16 x 100 forward.
    assert graph.layer("head").forward_flops == 2 * 16 * 16 * 100


def test_bad_input() -> None:
    with pytest.raises(SpecError, match=r"takes a torch nn\.Module"):
        LayerGraph.from_module("not a module", torch.randn(2))

    class Item(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * float(x.sum().item())

    with pytest.raises(SpecError, match="could not trace Item on the meta device"):
        LayerGraph.from_module(Item(), torch.randn(2))
    # A precision given as anything but a floating dtype is named, not traced in it.
    with pytest.raises(SpecError, match=r"dtype must be a floating torch.dtype .* got 'bf16'"):
        LayerGraph.from_module(nn.Linear(4, 4), torch.zeros(2, 4), dtype="bf16")
    with pytest.raises(SpecError, match=r"autocast must be a floating .* got torch.int8"):
        LayerGraph.from_module(nn.Linear(4, 4), torch.zeros(2, 4), autocast=torch.int8)


def test_a_hugging_face_llama_built_from_its_config() -> None:
    """The optional ``transformers`` path: a Llama built from a config on the meta device
    traces to the parameters of the equivalent ``ModelSpec`` and PaLM's FLOPs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=2, vocab_size=1000,
                                      tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    seq = 128
    graph = LayerGraph.from_module(model, {"input_ids": torch.randint(0, 1000, (1, seq))},
                                   loss_fn=lambda out: out.logits.float().sum())
    spec = ModelSpec(name="hf-llama", num_layers=4, hidden_size=256, num_heads=8,
                     num_kv_heads=2, ffn_hidden_size=688, vocab_size=1000, gated_mlp=True)
    assert graph.num_params() == spec.num_params()
    assert graph.layer("model.layers.0").repeat == 4
    analytic = model_flops_per_token(spec, seq) * seq
    assert graph.model_flops() == pytest.approx(analytic, rel=0.01)
