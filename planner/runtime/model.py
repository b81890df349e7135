"""The project's reference transformer: a torch ``nn.Module`` built from a ``ModelSpec``.

It is the model ``planner.apply`` knows how to split, the one the runtime tests train, and a
template for user modules: the names follow Meta's Llama reference code (and torchtitan),
``tok_embeddings``, ``layers`` (a ``ModuleDict`` keyed by layer index, so that a pipeline stage
keeps the original names), ``norm`` and ``output``. A stage of a pipeline is the same class
with the parts it does not hold set to ``None``: ``forward`` then takes hidden states instead
of tokens, or returns them instead of logits.

Built on any device, the meta device included (``build_model(spec, device="meta")``
allocates nothing); ``init_weights`` initialises it after ``to_empty``. The parameter count
equals ``ModelSpec.num_params()`` for every spec it accepts (tested).

Covers decoder and encoder token models: GPT (LayerNorm, learned positions, biases, GELU MLP),
Llama (RMSNorm, RoPE, GQA, SwiGLU), multi-head latent attention (DeepSeek-V2/V3, Kimi K2;
``LatentAttention``), tied or untied embeddings, and mixture-of-experts layers
(Mixtral, DeepSeekMoE: routed top-k experts run as torchtitan runs them, shared experts,
leading dense layers; ``MoEFeedForward``). Not vision (patch) models, token types or
embedding norms: ``build_model`` says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from costmodel.errors import SpecError
from costmodel.model import ModelSpec
from costmodel.trace.trace_ops import IN_FUSED_FORWARD, local_attention

__all__ = ["Attention", "Block", "FeedForward", "LatentAttention", "MoEFeedForward",
           "Transformer", "build_model", "reference_refusal", "rope_table"]

#: Standard deviation of the normal initialisation of weights (GPT-2, Radford et al. 2019).
INIT_STD = 0.02
#: RoPE base frequency (Su et al. 2021, Sec. 3.4.2; Llama 2).
ROPE_THETA = 10000.0
#: torchtitan's MoEArgs.route_scale: the factor on a token's expert scores (a kernel of its
#: own, which its default of 1 still runs).
ROUTE_SCALE = 1.0
#: Normalisation epsilon (Llama 2 uses 1e-5 for RMSNorm; GPT-2 for LayerNorm).
NORM_EPS = 1e-5


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=NORM_EPS)
    return nn.LayerNorm(spec.hidden_size, eps=NORM_EPS)


def rope_table(seq: int, head_dim: int, device: torch.device | str) -> torch.Tensor:
    """The rotary angles of positions 0..seq-1 as unit complex numbers, stored as their real
    and imaginary parts [1, seq, 1, head_dim / 2, 2] (fp32; Su et al. 2021, Eq. 34,
    consecutive pairs of each head rotated, as in Meta's Llama and torchtitan).
    ``Transformer.forward`` computes it once for all its layers, as torchtitan computes its
    ``freqs_cis`` once per model; real, it crosses a pipeline stage's send as any
    activation does (gloo sends no complex tensor)."""
    d = head_dim
    inv = ROPE_THETA ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return torch.view_as_real(torch.polar(torch.ones_like(angles), angles))[None, :, None]


def _rotation(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``x`` [batch, seq, heads, head_dim] rotated by the complex ``freqs`` [1, seq, 1,
    head_dim / 2], as torchtitan's ``apply_rotary_emb``: upcast to fp32 (at least), each
    consecutive pair taken as one complex number and multiplied, cast back: three kernels."""
    wide = x if x.dtype == torch.float64 else x.float()
    z = torch.view_as_complex(wide.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs).flatten(3).to(x.dtype)


class _Rotary(torch.autograd.Function):
    """RoPE as one autograd node that saves no activation: a rotation is orthogonal, so the
    input gradient is the output gradient rotated back (what fused RoPE kernels do; the cost
    model counts no activations for it). The angle table is the model's, shared by every
    layer, and kept on the node without being saved as the layer's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        ctx.freqs = torch.view_as_complex(table)
        # Traced, its kernels each have a backward (the rotation back), which grad mode,
        # off in here, would not show.
        token = IN_FUSED_FORWARD.set(x.requires_grad)
        try:
            return _rotation(x, ctx.freqs)
        finally:
            IN_FUSED_FORWARD.reset(token)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _rotation(grad, ctx.freqs.conj()), None


def _table_for(x: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
    """The model's angle table (``rope_table``) for ``x`` [batch, seq, heads, head_dim],
    computed here when missing, of another length than ``x``'s (a module run alone, or a
    sequence-parallel rank whose model saw only its share of the tokens) or no longer fp32
    (FSDP's mixed precision casts a block's floating-point inputs to its parameter dtype)."""
    if table is None or table.shape[1] != x.shape[1] or table.dtype != torch.float32:
        return rope_table(x.shape[1], x.shape[-1], x.device)
    return table


class Attention(nn.Module):
    """Multi-head (or grouped-query) self-attention with Q, K, V and output projections.

    The number of heads is read from the projections' local width, so the module runs
    unchanged on a tensor-parallel shard (heads split over the ranks). ``recompute_core``:
    selective recompute (Korthikanti et al. 2022, Sec. 5): the attention core is recomputed
    in backward instead of keeping what it saved.
    """

    def __init__(self, spec: ModelSpec, local: bool = False) -> None:
        super().__init__()
        h, hd = spec.hidden_size, int(spec.head_dim or 0)
        qkv_bias = spec.bias or spec.qkv_bias
        self.head_dim = hd
        self.rope = spec.has_rotary(local)  # Llama 4's global layers have none
        self.causal = spec.causal
        self.recompute_core = False
        # A local layer's window (ModelSpec.layer_is_local) and GPT-OSS's sink logits.
        self.window = spec.sliding_window if local else 0
        self.chunked = spec.chunked_attention
        # Sets a local layer apart from a global one of the same weights when a trace looks
        # for repeated blocks (costmodel.trace.recorder._signature).
        self.trace_key = (self.window, self.chunked, self.rope) if self.window else None
        self.wq = nn.Linear(h, spec.q_dim, bias=qkv_bias)
        self.wk = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.q_dim, h, bias=spec.bias)
        self.sinks = nn.Parameter(torch.empty(spec.num_heads)) if spec.attention_sinks else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              rope: torch.Tensor | None = None) -> torch.Tensor:
        if self.rope:
            table = _table_for(q, rope)
            q, k = _Rotary.apply(q, table), _Rotary.apply(k, table)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.window or self.sinks is not None:
            out = local_attention(q, k, v, self.window, self.chunked, self.sinks)
            return out.transpose(1, 2).flatten(2)
        # Grouped-query attention: each K/V head serves num_heads / num_kv_heads query heads,
        # without materialising repeated K and V.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2).flatten(2)

    def forward(self, x: torch.Tensor,
                rope: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]; ``rope``: the model's RoPE
        angle table (``rope_table``), else computed here."""
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(self._core, q, k, v, rope, use_reentrant=False)
        else:
            out = self._core(q, k, v, rope)
        return self.wo(out)


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1, Eqs. 9-19),
    in its training form: the query projected down to ``q_lora_rank`` (or straight to the
    heads when 0), normed and projected up to every head's ``head_dim``; the key and value
    compressed into one ``kv_lora_rank`` latent plus a ``qk_rope_head_dim`` rotary key shared
    by the heads, the latent normed and projected up to each head's no-rotary key and value
    (``v_head_dim``); the last ``qk_rope_head_dim`` of each query and key rotated; the core a
    fused attention over keys of ``head_dim`` and values of ``v_head_dim``. Names as
    torchtitan's deepseek_v3 (``wq_a``, ``q_norm``, ``wq_b``, ``wkv_a``, ``kv_norm``,
    ``wkv_b``, ``wo``). Heads are read from the up projections' local width."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, hd = spec.hidden_size, int(spec.head_dim or 0)
        self.rope_dim, self.v_dim = spec.qk_rope_head_dim, int(spec.v_head_dim or 0)
        self.nope = hd - self.rope_dim
        self.kv_lora = spec.kv_lora_rank
        self.causal = spec.causal
        self.recompute_core = False
        q_lora = spec.q_lora_rank
        self.wq_a = nn.Linear(h, q_lora, bias=False) if q_lora else None
        self.q_norm = nn.RMSNorm(q_lora, eps=NORM_EPS) if q_lora else None
        self.wq_b = nn.Linear(q_lora or h, spec.q_dim, bias=False)
        self.wkv_a = nn.Linear(h, self.kv_lora + self.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.kv_lora, eps=NORM_EPS)
        self.wkv_b = nn.Linear(self.kv_lora, spec.num_heads * (self.nope + self.v_dim),
                               bias=False)
        self.wo = nn.Linear(spec.o_dim, h, bias=False)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2).flatten(2)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]; ``rope``: the model's angle
        table of ``qk_rope_head_dim`` (``rope_table``), else computed here."""
        b, s = x.shape[0], x.shape[1]
        latent = x if self.wq_a is None or self.q_norm is None \
            else self.q_norm(self.wq_a(x))
        q = self.wq_b(latent).view(b, s, -1, self.nope + self.rope_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        c, k_pe = self.wkv_a(x).split([self.kv_lora, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(c)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        # The values copied out, so that the attention keeps them alone and not the whole
        # up projection (whose no-rotary keys the concatenation below copies).
        v = v.contiguous()
        k_pe = k_pe.unsqueeze(2)
        table = _table_for(k_pe, rope)
        q_pe, k_pe = _Rotary.apply(q_pe, table), _Rotary.apply(k_pe, table)
        heads = q_nope.shape[2]
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, heads, -1)], dim=-1)
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out)


class FeedForward(nn.Module):
    """The MLP: ``w2(silu(w1 x) * w3 x)`` when gated (SwiGLU, Shazeer 2020), else
    ``w2(gelu(w1 x))`` (GPT); ``ffn`` wide (default ``spec.ffn_hidden_size``)."""

    def __init__(self, spec: ModelSpec, ffn: int | None = None) -> None:
        super().__init__()
        h, f = spec.hidden_size, int(ffn or spec.ffn_hidden_size or 0)
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(h, f, bias=spec.bias)
        self.w3 = nn.Linear(h, f, bias=spec.bias) if spec.gated_mlp else None
        self.w2 = nn.Linear(f, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]."""
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class MoEFeedForward(nn.Module):
    """A mixture-of-experts MLP as torchtitan runs one (Shazeer et al. 2017; torchtitan/
    models/moe/moe.py @08dc75ae with MoEArgs' defaults, its dispatch without the grouped
    matmuls' padding, which torchtitan dropped in fe80b63c, April 2026): a linear router's
    sigmoid scores in fp32; each token's ``top_k`` experts by score plus a load-balancing
    bias (auxiliary-loss-free balancing, Wang et al. 2024: the bias only chooses, and
    ``tokens_per_expert`` counts the load a trainer updates it from between steps); the
    tokens sorted by expert and scaled by their scores in fp32; every expert's MLP
    (``moe_ffn_hidden_size`` wide, gated or not as the dense MLP) as one
    ``torch._grouped_mm`` per projection over the sorted tokens; the outputs put back in
    token order and summed over the k choices; plus ``num_shared_experts`` MLPs of the same
    width that every token runs (DeepSeekMoE, Dai et al. 2024), one MLP as wide as all of
    them, as torchtitan holds them.

    Dropless: every choice runs (no capacity), the active experts' ``tokens * top_k * 2 h f``
    FLOPs per projection, and shapes static (the grouped matmuls' rows are the choices), so
    it traces on the meta device as it runs."""

    expert_bias: torch.Tensor
    tokens_per_expert: torch.Tensor

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, e = spec.hidden_size, int(spec.moe_ffn_hidden_size or 0), spec.num_experts
        self.num_experts, self.top_k = e, spec.top_k
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if spec.gated_mlp else None
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        self.b1 = nn.Parameter(torch.empty(e, f)) if spec.bias else None
        self.b3 = nn.Parameter(torch.empty(e, f)) if spec.bias and spec.gated_mlp else None
        self.b2 = nn.Parameter(torch.empty(e, h)) if spec.bias else None
        self.register_buffer("expert_bias", torch.zeros(e))
        self.register_buffer("tokens_per_expert", torch.zeros(e), persistent=False)
        # torchtitan's shared experts: one MLP as wide as all of them.
        self.shared = FeedForward(spec, f * spec.num_shared_experts) \
            if spec.num_shared_experts else None

    def _counts(self, chosen: torch.Tensor) -> torch.Tensor:
        """Choices per expert (torch.histc, as torchtitan counts them; the CPU kernel takes
        no integers)."""
        flat = chosen.reshape(-1)
        if flat.device.type == "cpu":
            flat = flat.float()
        return torch.histc(flat, bins=self.num_experts, min=0, max=self.num_experts)

    def _experts(self, x: torch.Tensor, offsets: torch.Tensor, expert: torch.Tensor | None
                 ) -> torch.Tensor:
        """Every expert's MLP on its rows of ``x`` [choices, hidden], sorted by expert
        (``offsets``: where each expert's rows end; ``expert``: each row's, for the biases)."""
        # torch.autocast leaves torch._grouped_mm alone; torchtitan casts its operands to
        # bf16 itself (``x.bfloat16()``, ``w1.bfloat16()``), as autocast would.
        device = x.device.type
        low = torch.get_autocast_dtype(device) \
            if device in ("cuda", "cpu") and torch.is_autocast_enabled(device) else None

        def proj(w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
            if low is not None:
                t, w = t.to(low), w.to(low)
            out = torch._grouped_mm(t, w, offs=offsets)
            return out if b is None or expert is None else out + b[expert]

        if self.w3 is not None:
            inner = F.silu(proj(self.w1, self.b1, x)) * proj(self.w3, self.b3, x)
        else:
            inner = F.gelu(proj(self.w1, self.b1, x), approximate="tanh")
        return proj(self.w2, self.b2, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]."""
        b, s, h = x.shape
        k = self.top_k
        flat = x.reshape(b * s, h)
        scores = torch.sigmoid(self.router(flat).float())
        _, chosen = torch.topk(scores + self.expert_bias, k=k, dim=-1)
        weight = scores.gather(1, chosen) * ROUTE_SCALE
        with torch.no_grad():
            self.tokens_per_expert.add_(self._counts(chosen))
        # Sorted by expert; each choice's token, scaled by its score in fp32.
        counts = self._counts(chosen)
        order = torch.argsort(chosen.reshape(-1), stable=True)
        routed = (flat[order // k].float() * weight.reshape(-1)[order].reshape(-1, 1)
                  ).to(x.dtype)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        expert = chosen.reshape(-1)[order] if self.b1 is not None else None
        out = self._experts(routed, offsets, expert)
        # Back in token order, the k choices of each token summed.
        y = flat.new_zeros(b * s * k, h)
        y[order] = out
        y = y.reshape(b * s, k, h).sum(1)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.reshape(b, s, h)


class Block(nn.Module):
    """One pre-norm transformer layer: ``x + attention(norm(x))``, then ``+ mlp(norm(.))``
    (a mixture of experts where ``moe``)."""

    def __init__(self, spec: ModelSpec, dropout: float, moe: bool = False,
                 local: bool = False) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention: nn.Module = LatentAttention(spec) if spec.is_mla \
            else Attention(spec, local)
        self.ffn_norm = _norm(spec)
        self.feed_forward: nn.Module = MoEFeedForward(spec) if moe else FeedForward(spec)
        self.dropout = nn.Dropout(dropout) if spec.dropout and dropout > 0 else None

    def forward(self, x: torch.Tensor,
                rope: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]; ``rope``: the model's RoPE
        angle table (``rope_table``; passed by keyword, beside what tensor parallelism
        lays out)."""
        a = self.attention(self.attention_norm(x), rope=rope)
        x = x + (self.dropout(a) if self.dropout is not None else a)
        f = self.feed_forward(self.ffn_norm(x))
        return x + (self.dropout(f) if self.dropout is not None else f)


class Transformer(nn.Module):
    """Embeddings, ``num_layers`` blocks, final norm and LM head of ``spec``.

    ``forward(tokens)`` takes token ids [batch, seq] and returns logits [batch, seq, vocab].
    A pipeline stage without ``tok_embeddings`` takes hidden states [batch, seq, hidden]; one
    without ``output`` (and untied) returns hidden states.
    """

    def __init__(self, spec: ModelSpec, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_position_embeddings, h)
            if spec.position_embedding == "learned" else None)
        # GPT-2's embedding dropout (Radford et al. 2019; Megatron-LM's embedding dropout).
        self.emb_dropout = nn.Dropout(dropout) if spec.dropout and dropout > 0 else None
        self.layers = nn.ModuleDict({str(i): Block(spec, dropout, spec.layer_is_moe(i),
                                                   spec.layer_is_local(i))
                                     for i in range(spec.num_layers)})
        self.norm: nn.Module | None = _norm(spec) if spec.final_norm else None
        self.output: nn.Linear | None = (None if spec.tied_embeddings
                                         else nn.Linear(h, spec.vocab_size, bias=spec.bias))
        self.tied = spec.tied_embeddings
        self.has_head = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (or hidden states on a later pipeline stage) -> logits (or hidden
        states on an earlier one)."""
        if self.tok_embeddings is not None:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                pos = torch.arange(tokens.shape[1], device=tokens.device)
                x = x + self.pos_embeddings(pos)
            if self.emb_dropout is not None:
                x = self.emb_dropout(x)
        rope = None
        if self.spec.position_embedding == "rope":
            rope = rope_table(x.shape[1], self.spec.qk_rope_head_dim
                              or int(self.spec.head_dim or 0), x.device)
        for layer in self.layers.values():
            x = layer(x, rope=rope)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            return self.output(x)
        if self.tied and self.has_head and self.tok_embeddings is not None:
            return F.linear(x, self.tok_embeddings.weight)
        return x

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Initialise every parameter in place: weights N(0, 0.02), the output projections
        of each block scaled by 1/sqrt(2 * num_layers) (GPT-2, Radford et al. 2019, Sec.
        2.3), biases 0, norm weights 1. ``seed`` seeds torch's generator first. Works on
        tensor-parallel and FSDP shards (each rank draws its own shard)."""
        if seed is not None:
            torch.manual_seed(seed)
        deep = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                std = deep if name.endswith(("attention.wo", ".w2")) else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    nn.init.zeros_(bias)
            elif isinstance(module, nn.RMSNorm | nn.LayerNorm):
                module.reset_parameters()
            elif isinstance(module, Attention) and module.sinks is not None:
                nn.init.zeros_(module.sinks)
            elif isinstance(module, MoEFeedForward):
                for w, std in ((module.w1, INIT_STD), (module.w3, INIT_STD), (module.w2, deep)):
                    if w is not None:
                        nn.init.normal_(w, mean=0.0, std=std)
                for bias in (module.b1, module.b3, module.b2):
                    if bias is not None:
                        nn.init.zeros_(bias)
                module.expert_bias.zero_()
                module.tokens_per_expert.zero_()


def reference_refusal(spec: ModelSpec) -> str | None:
    """Why the reference transformer does not build ``spec`` (the parts of it it lacks), or
    None when it does; ``build_model`` raises this as a ``SpecError``."""
    unsupported = [(spec.patch_size > 0, "vision patch embeddings (ViT)"),
                   (spec.num_token_types > 0, "token-type embeddings (BERT)"),
                   (spec.embedding_norm, "an embedding norm (BERT)"),
                   (spec.qk_norm, "query and key norms (Qwen3)"),
                   (spec.mtp_layers > 0, "multi-token prediction modules (DeepSeek-V3)"),
                   (spec.is_mla and (spec.sliding_window > 0 or spec.attention_sinks),
                    "latent attention with windows or sinks"),
                   (spec.post_norms, "norms after the attention and the MLP (Gemma)"),
                   (spec.is_moe and spec.bias, "a router with biases (GPT-OSS)")]
    missing = [what for bad, what in unsupported if bad]
    if not missing:
        return None
    return (f"the reference transformer does not build {spec.name!r}: it has "
            f"{', '.join(missing)}; pass your own torch module instead")


def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int | None = 0,
                dropout: float = 0.0) -> Transformer:
    """The reference transformer of ``spec`` on ``device``, initialised with ``seed``.

    On ``device="meta"`` nothing is allocated and nothing is initialised (``seed`` is
    ignored): parallelize it with ``planner.apply``, which materialises each rank's shard.
    ``dropout``: the dropout probability where ``spec.dropout`` has dropout layers (0 keeps
    runs deterministic). Raises ``SpecError`` for specs it does not build.
    """
    refusal = reference_refusal(spec)
    if refusal:
        raise SpecError(refusal)
    if not 0.0 <= dropout < 1.0:
        raise SpecError(f"dropout must be in [0, 1), got {dropout!r}")
    with torch.device(device):
        model = Transformer(spec, dropout=dropout)
    if str(device) != "meta":
        model.init_weights(seed)
    return model
