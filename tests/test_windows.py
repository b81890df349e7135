"""Local attention (sliding windows and chunks) beside global layers, attention sinks,
post-norms and MoE on every k-th layer: the layer kinds a model gets, the keys its queries
attend to, what that does to FLOPs, step time, context parallelism and the KV cache, the
config.json fields that ask for them and the trainer flags that say them.

Patterns: GPT-OSS alternates 128-token sliding windows with full attention (OpenAI 2025,
"gpt-oss-120b & gpt-oss-20b Model Card", Sec. 2.1: "alternating banded window and fully
dense patterns", bandwidth 128); Gemma 3 has five local layers of 1024 tokens to one global
(Gemma Team 2025, "Gemma 3 Technical Report", Sec. 2.2); Llama 4 attends in chunks of 8192
on three layers of four.
"""

from __future__ import annotations

import dataclasses

import pytest

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, SpecError
from costmodel.formulas.arrays import ConfigArrays
from costmodel.formulas.layercosts import LayerCosts
from costmodel.formulas.memory import memory_table
from costmodel.formulas.steptime import time_table

#: A GPT-OSS-shaped model (its 120b's widths, 8 layers): every other layer a 128-token window.
OSS = ModelSpec(name="oss-small", num_layers=8, hidden_size=2880, num_heads=64,
                num_kv_heads=8, head_dim=64, ffn_hidden_size=2880, moe_ffn_hidden_size=2880,
                num_experts=32, top_k=4, vocab_size=201088, gated_mlp=True, bias=True,
                attention_sinks=True, sliding_window=128, global_every=2)
GLOBAL = dataclasses.replace(OSS, name="oss-global", sliding_window=0, global_every=0)


def test_layer_kinds_follow_the_patterns() -> None:
    assert OSS.kind_attributes == ((True, False), (True, True))
    assert OSS.layer_kinds == (1, 0) * 4  # layer 0 local, layer 1 global, ...
    gemma = dataclasses.replace(GLOBAL, num_experts=0, top_k=0, moe_ffn_hidden_size=None,
                                num_layers=12, sliding_window=1024, global_every=6)
    assert [gemma.layer_is_local(i) for i in range(12)] == ([True] * 5 + [False]) * 2
    every_other = dataclasses.replace(GLOBAL, num_layers=6, moe_every=2,
                                      ffn_hidden_size=8192)
    assert [every_other.layer_is_moe(i) for i in range(6)] == [False, True] * 3
    assert every_other.kind_attributes == ((False, False), (True, False))
    # Counts: three dense layers of 8192 and three MoE layers.
    dense = every_other.dense_layer_params()
    moe = every_other.moe_layer_non_expert_params() + every_other.routed_expert_params()
    assert every_other.num_params() == every_other.embedding_params() + 3 * dense + 3 * moe \
        + every_other.head_params()


def test_sinks_post_norms_and_router_bias_are_counted() -> None:
    """GPT-OSS: a sink logit per head; its router has a bias per expert (bias=True).
    Gemma: four norms a layer."""
    assert OSS.attention_params() - GLOBAL.attention_params() == 0  # both have sinks
    plain = dataclasses.replace(OSS, attention_sinks=False)
    assert OSS.attention_params() - plain.attention_params() == 64
    assert OSS.router_params() == (2880 + 1) * 32
    post = dataclasses.replace(OSS, post_norms=True)
    assert post.dense_layer_params() - OSS.dense_layer_params() == 2 * 2880


@pytest.mark.parametrize(("s", "w", "chunked", "want"), [
    (4096, 128, False, 128 - 128 * 128 / (2 * 4096)),  # sum_p min(p + 1, W) / s, as s W - W^2/2
    (4096, 8192, False, 2048.0),                         # a window past the sequence: full
    (32768, 8192, True, 4096.0),                         # chunks: half a chunk
    (4096, 8192, True, 2048.0),
])
def test_attended_keys(s: int, w: int, chunked: bool, want: float) -> None:
    spec = dataclasses.replace(OSS, sliding_window=w, chunked_attention=chunked)
    assert spec.attended_keys(s, True) == pytest.approx(want)
    assert spec.attended_keys(s, False) == s / 2


def test_a_local_layers_attention_stops_growing_with_the_sequence() -> None:
    """At 32K tokens the global layers' attention core dominates; the windowed layers' does
    128/16384 of its FLOPs, in 2.6 % of its time (a kernel over 128 keys runs less
    efficiently). Per token, model FLOPs and step time fall against the same model
    with full attention everywhere, and the local layers' share stays flat as s grows."""
    job = Job(global_batch_size=8, seq_len=32768)
    a = ConfigArrays.from_configs(OSS, [ParallelConfig(dp=8, ep=8, zero_stage=1,
                                                       recompute="full")])
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    costs = LayerCosts.of(OSS)
    local = costs.layer_compute(cluster.gpu, job, a, 1)
    full = costs.layer_compute(cluster.gpu, job, a, 0)
    keys = OSS.attended_keys(32768, True)
    assert float(local.core_forward[0]) < 0.04 * float(full.core_forward[0])
    assert float(full.forward_flops[0] - local.forward_flops[0]) == pytest.approx(
        2 * 32768 * (16384 - keys) * (OSS.q_dim + OSS.o_dim), rel=1e-9)
    flops = [LayerCosts.of(m).model_flops_per_token(32768) for m in (OSS, GLOBAL)]
    # Model FLOPs count the whole s x s of a global layer, twice the keys of a local one.
    assert flops[1] - flops[0] == pytest.approx(
        4 * 6 * (32768 - 2 * keys) * (OSS.q_dim + OSS.o_dim), rel=1e-12)
    t = [time_table(m, cluster, job, a, memory_table(m, cluster, job, a)).step_time[0]
         for m in (OSS, GLOBAL)]
    assert 0.7 < t[0] / t[1] < 0.85  # measured 0.77: the experts' matmuls stay


def test_context_parallel_passes_a_local_layer_only_what_its_window_reaches() -> None:
    job = Job(global_batch_size=8, seq_len=32768)
    a = ConfigArrays.from_configs(OSS, [ParallelConfig(dp=1, cp=8, ep=8)])
    costs = LayerCosts.of(OSS)
    assert costs.cp_ring_steps(0, job, a)[0] == 7  # the global layers: the whole ring
    assert costs.cp_ring_steps(1, job, a)[0] == 1  # 128 keys back reach one 4096-token chunk


def test_a_windowed_layer_caches_its_window() -> None:
    """vLLM keeps a sliding-window layer's last W tokens (its hybrid KV cache manager); so a
    32K-token context of the half-local model holds about half the cache."""
    import planner

    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    job = planner.InferenceJob(prompt_len=30000, output_len=2768, batch_size=4)
    cfg = planner.InferenceConfig(tp=8, pp=1, replicas=1)
    local = planner.estimate_inference(OSS, cluster, job, cfg).memory.kv_cache_bytes
    full = planner.estimate_inference(GLOBAL, cluster, job, cfg).memory.kv_cache_bytes
    # Four global layers of 32768 tokens and four local ones of 128, against eight global.
    assert local / full == pytest.approx((4 + 4 * 128 / 32768) / 8, rel=1e-9)


def test_window_fields_are_checked() -> None:
    for change, says in (({"sliding_window": 0}, "need sliding_window"),
                         ({"global_every": -1}, "global_every"),
                         ({"moe_every": 0}, "moe_every"),
                         ({"num_layers": 1, "moe_every": 2}, "no MoE layer"),
                         ({"attention_sinks": "yes"}, "attention_sinks")):
        with pytest.raises(SpecError, match=says):
            dataclasses.replace(OSS, **change)


def test_gpt_oss_config_json_fields() -> None:
    """transformers' GptOssConfig keys (the published config.json's names)."""
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
           "vocab_size": 201088, "sliding_window": 128, "attention_bias": True,
           "tie_word_embeddings": False,
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    spec = ModelSpec.from_hf_config(cfg, name="oss4")
    assert (spec.sliding_window, spec.global_every, spec.attention_sinks, spec.bias) == \
        (128, 2, True, True)
    assert spec.kind_attributes == ((True, False), (True, True))
    with pytest.raises(SpecError, match="layer_types"):
        ModelSpec.from_hf_config({**cfg, "layer_types": ["full_attention"] + [
            "sliding_attention"] * 3})
    with pytest.raises(SpecError, match="layer_types"):
        ModelSpec.from_hf_config({**cfg, "layer_types": ["full_attention"]})


def test_a_multimodal_config_plans_its_language_model_and_says_so() -> None:
    text = {"model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 1152,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "intermediate_size": 6912, "sliding_window": 512}
    with pytest.warns(UserWarning, match="language model"):
        spec = ModelSpec.from_hf_config({"model_type": "gemma3", "text_config": text,
                                         "vision_config": {"hidden_size": 1152}}, name="g")
    assert spec.post_norms and spec.qk_norm and spec.tied_embeddings
    assert spec.vocab_size == 262208 and spec.global_every == 6  # Gemma3TextConfig defaults
    assert [spec.layer_is_local(i) for i in range(6)] == [True] * 5 + [False]


def test_megatron_flags_for_windows_and_sinks() -> None:
    from planner.emit.megatron import _model_args

    args = [str(x) for x in _model_args(OSS, Job(global_batch_size=8, seq_len=4096))]
    assert args[args.index("--window-size") + 1] == "128,0"
    assert args[args.index("--window-attn-skip-freq") + 1] == "2"
    assert args[args.index("--softmax-type") + 1] == "learnable"
    every_other = dataclasses.replace(GLOBAL, num_layers=4, moe_every=2, ffn_hidden_size=8192)
    args = [str(x) for x in _model_args(every_other, Job(global_batch_size=8, seq_len=4096))]
    assert "--window-size" not in args


def test_the_plan_of_a_windowed_model_is_searched() -> None:
    import planner

    cluster = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=8)
    job = Job(global_batch_size=64, seq_len=8192, framework="megatron")
    got = planner.plan(OSS, cluster, job)
    assert got.estimate.fits
    # The plan's estimate is the model's: the same configuration estimated directly.
    again = planner.estimate(OSS, cluster, job, got.config)
    assert again.step_time_s == pytest.approx(got.estimate.step_time_s, rel=1e-9)
    with pytest.warns(UserWarning, match="local attention windows"):
        got.emit("torchtitan")


# (published total, tolerance), (published activated, tolerance, counted with the embedding):
# gpt-oss: the model card's Table 1 (OpenAI 2025), active counts without the embedding;
# Mixtral 8x22B: Mistral AI's announcement, 141B and 39B (rounded: half a billion);
# Llama 4: meta-llama/llama-models MODEL_CARD.md, 400B (Maverick) and 17B activated
# (rounded), everything a token passes through; Scout's 109B holds its vision encoder,
# which a language model's plan leaves out (107.8B here).
PUBLISHED = {
    "gpt-oss-120b": ((116.83e9, 0.0005), (5.13e9, 0.002, False)),
    "gpt-oss-20b": ((20.91e9, 0.0005), (3.61e9, 0.002, False)),
    "mixtral-8x22b": ((141e9, 0.5 / 141), (39e9, 0.5 / 39, False)),
    "llama-4-maverick": ((400e9, 0.005), (17e9, 0.5 / 17, True)),
    "llama-4-scout": ((109e9, 0.015), (17e9, 0.5 / 17, True)),
}


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_published_counts(name: str, published: tuple) -> None:
    (total, t_tol), (active, a_tol, with_embedding) = published
    spec = ModelSpec.preset(name)
    assert spec.num_params() == pytest.approx(total, rel=t_tol)
    got = spec.num_active_params() - (0 if with_embedding else spec.embedding_params())
    assert got == pytest.approx(active, rel=a_tol)


def test_gemma_3_counts_are_the_reports() -> None:
    """Gemma 3 Technical Report, Table 1, 27B: 25,600M non-embedding parameters (and 1,416M
    embedding, of a 262K vocabulary: 1,409.6M counted here from the config's 262208)."""
    spec = ModelSpec.preset("gemma-3-27b")
    assert spec.num_params() - spec.embedding_params() == pytest.approx(25_600e6, rel=0.0005)
    assert spec.embedding_params() == pytest.approx(1_416e6, rel=0.005)


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b", "gemma-3-27b",
                                  "mixtral-8x22b", "llama-4-scout", "llama-4-maverick"])
def test_published_config_json_is_the_preset(name: str) -> None:
    import warnings
    from pathlib import Path

    path = Path(__file__).parent / "data" / "hf_configs" / f"{name}.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the multimodal ones say they plan the text model
        got = ModelSpec.from_hf_config(path, name=name)
    want = ModelSpec.preset(name)
    assert {k: v for k, v in got.to_dict().items() if k != "source"} == \
        {k: v for k, v in want.to_dict().items() if k != "source"}


def test_llama_4_layers() -> None:
    """Maverick: MoE on the odd layers, chunked attention on all but every fourth, which
    attends to all keys without rotary embeddings."""
    spec = ModelSpec.preset("llama-4-maverick")
    assert [spec.layer_is_moe(i) for i in range(4)] == [False, True, False, True]
    assert [spec.layer_is_local(i) for i in range(4)] == [True, True, True, False]
    assert spec.chunked_attention and spec.sliding_window == 8192
    assert spec.attended_keys(32768, True) == 4096.0
    # The global layers take no rotary embedding: their rotary kernels' time is gone.
    assert spec.global_nope and spec.has_rotary(True) and not spec.has_rotary(False)
    job = Job(global_batch_size=8, seq_len=8192)
    a = ConfigArrays.from_configs(spec, [ParallelConfig(dp=8, ep=8)])
    gpu = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8).gpu
    local, glob = (dataclasses.replace(spec, global_nope=False), spec)
    kind = spec.kind_attributes.index((True, False))  # a global MoE layer
    with_rope = LayerCosts.of(local).layer_compute(gpu, job, a, kind).forward[0]
    without = LayerCosts.of(glob).layer_compute(gpu, job, a, kind).forward[0]
    assert without < with_rope


def test_local_attention_is_softmax_attention_over_its_window() -> None:
    """The reference transformer's ``local_attention``: with a window as long as the
    sequence and no sinks it is causal SDPA; a sink logit takes probability mass (each
    query's weights over its keys sum below 1, as the sink's share is dropped); a window
    of w keys leaves a query nothing from further back."""
    torch = pytest.importorskip("torch")
    from costmodel.trace.trace_ops import local_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 12, 8, generator=g) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(local_attention(q, k, v, 12), full, atol=1e-5)
    ones = torch.ones_like(v)
    assert torch.all(local_attention(q, k, ones, 0, sinks=torch.zeros(4)) < 1.0)
    spike = torch.zeros_like(v)
    spike[:, :, 0] = 1.0  # only key 0 carries a value
    out = local_attention(q, k, spike, 4)
    assert torch.all(out[:, :, 4:] == 0) and torch.all(out[:, :, :4] > 0)
    chunked = local_attention(q, k, spike, 4, chunked=True)
    assert torch.all(chunked[:, :, 4:] == 0)


@pytest.mark.slow  # traces 4 layers at 4,096 tokens, costed at four TP degrees: 2 s
def test_a_traced_sliding_window_block_with_sinks_plans_as_its_spec() -> None:
    """The reference transformer with every layer a 128-token sliding window and a sink
    logit per head (Mistral 7B v0.1's windows, GPT-OSS's sinks), traced at 4,096 tokens: its
    fused attention does the work of the keys each query sees (``local_attention``, traced
    as the fused kernel over its window), so its blocks equal the formulas within 1 % on one
    GPU (parameters, FLOPs, activations per recompute mode), and every configuration of 16
    H100s (tp 1-8, with and without SP, each recompute mode) is costed within 2 % of the
    preset under torchtitan's conventions (measured 1.002-1.013x, memory 1.000x). Layers that
    alternate local and global are traced one by one (the trace finds runs of identical
    consecutive blocks), so the oracle takes one kind."""
    torch = pytest.importorskip("torch")
    from costmodel.formulas.memory import memory_table
    from costmodel.formulas.steptime import time_table
    from costmodel.trace.blockcosts import costs_from_graph
    from costmodel.trace.graph import LayerGraph
    from planner.runtime.model import build_model

    seq = 4096
    spec = ModelSpec(name="windowed", num_layers=4, hidden_size=2048, num_heads=32,
                     num_kv_heads=8, head_dim=64, ffn_hidden_size=8192, vocab_size=32000,
                     gated_mlp=True, sliding_window=128, attention_sinks=True)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        flat = logits.float().flatten(0, 1)
        return torch.nn.functional.cross_entropy(
            flat, torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device))

    graph = LayerGraph.from_module(build_model(spec, device="meta"),
                                   torch.zeros(1, seq, dtype=torch.long),
                                   dtype=torch.bfloat16, loss_fn=loss)
    cluster = Cluster(gpu="h100-sxm", num_nodes=2, gpus_per_node=8)
    one = Job(global_batch_size=16, seq_len=seq, framework="deepspeed")
    traced = costs_from_graph(graph, cluster, one, tp_degrees=(1,))
    analytic = LayerCosts.from_spec(spec, one, tp_degrees=(1,))
    assert [b.repeat for b in traced.blocks] == [b.repeat for b in analytic.blocks]
    for x, y in zip(traced.blocks, analytic.blocks, strict=True):
        a, b = x.at(1), y.at(1)
        assert a.params == pytest.approx(b.params, rel=0.01)
        assert a.forward_flops == pytest.approx(b.forward_flops, rel=0.01)
        assert a.backward_flops == pytest.approx(b.backward_flops, rel=0.01)
        for mode, saved in b.activation_bytes.items():
            assert a.activation_bytes[mode] == pytest.approx(saved, rel=0.01), (y.name, mode)
    job = Job(global_batch_size=16, seq_len=seq, framework="torchtitan")
    both = costs_from_graph(graph, cluster, job, tp_degrees=(1, 2, 4, 8),
                            sequence_parallel="both")
    configs = [ParallelConfig(dp=16 // t, tp=t, zero_stage=3, recompute=r,
                              sequence_parallel=sp and t > 1)
               for t in (1, 2, 4, 8) for sp in (False, True)
               for r in ("none", "selective", "full")]
    a = ConfigArrays.from_configs(spec, configs)
    mw, mg = memory_table(spec, cluster, job, a), memory_table(both, cluster, job, a)
    tw, tg = time_table(spec, cluster, job, a, mw), time_table(both, cluster, job, a, mg)
    assert tg.step_time == pytest.approx(tw.step_time, rel=0.02)
    assert mg.peak == pytest.approx(mw.peak, rel=0.02)
