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
Llama (RMSNorm, RoPE, GQA, SwiGLU), tied or untied embeddings, and mixture-of-experts layers
(Mixtral, DeepSeekMoE: routed top-k experts with a fixed capacity, shared experts, leading
dense layers; ``MoEFeedForward``). Not vision (patch) models, token types or embedding norms:
``build_model`` says so.
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
from costmodel.trace_ops import IN_FUSED_FORWARD

__all__ = ["Attention", "Block", "FeedForward", "MoEFeedForward", "Transformer", "build_model",
           "rope_table"]

#: Standard deviation of the normal initialisation of weights (GPT-2, Radford et al. 2019).
INIT_STD = 0.02
#: RoPE base frequency (Su et al. 2021, Sec. 3.4.2; Llama 2).
ROPE_THETA = 10000.0
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

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, hd = spec.hidden_size, int(spec.head_dim or 0)
        qkv_bias = spec.bias or spec.qkv_bias
        self.head_dim = hd
        self.rope = spec.position_embedding == "rope"
        self.causal = spec.causal
        self.recompute_core = False
        self.wq = nn.Linear(h, spec.q_dim, bias=qkv_bias)
        self.wk = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.q_dim, h, bias=spec.bias)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              rope: torch.Tensor | None = None) -> torch.Tensor:
        if self.rope:
            table = _table_for(q, rope)
            q, k = _Rotary.apply(q, table), _Rotary.apply(k, table)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
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
    """A mixture-of-experts MLP (Shazeer et al. 2017; Mixtral, Jiang et al. 2024): a linear
    router scores the ``num_experts`` experts for each token; the ``top_k`` best (softmax
    over all, renormalised over those k) each run the token through their MLP
    (``moe_ffn_hidden_size`` wide, gated or not as the dense MLP), and their outputs,
    weighted by those scores, are summed; plus ``num_shared_experts`` MLPs of the same width
    that every token runs (DeepSeekMoE, Dai et al. 2024).

    Tokens go to their experts through a fixed capacity (GShard, Lepikhin et al. 2020;
    Switch, Fedus et al. 2022): ``ceil(capacity_factor * seq * top_k / num_experts)``
    slots per expert and sequence, filled in token order; a token past its expert's
    capacity skips that expert (its residual carries it on). Capacity per sequence keeps
    a sequence's result independent of the batch it is in; static shapes let the layer
    trace on the meta device, its experts running one batched matmul per projection of
    ``experts x (batch * capacity)`` tokens: ``capacity_factor * tokens * top_k * 2 h f``
    FLOPs each, the active experts' at capacity factor 1 (when ``seq * top_k`` is a
    multiple of ``num_experts``)."""

    def __init__(self, spec: ModelSpec, capacity_factor: float = 1.0) -> None:
        super().__init__()
        h, f, e = spec.hidden_size, int(spec.moe_ffn_hidden_size or 0), spec.num_experts
        self.num_experts, self.top_k, self.capacity_factor = e, spec.top_k, capacity_factor
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if spec.gated_mlp else None
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        self.b1 = nn.Parameter(torch.empty(e, 1, f)) if spec.bias else None
        self.b3 = nn.Parameter(torch.empty(e, 1, f)) if spec.bias and spec.gated_mlp else None
        self.b2 = nn.Parameter(torch.empty(e, 1, h)) if spec.bias else None
        self.shared = nn.ModuleList([FeedForward(spec, f)
                                     for _ in range(spec.num_shared_experts)])

    def capacity(self, seq: int) -> int:
        """Slots per expert for one sequence of ``seq`` tokens."""
        return math.ceil(self.capacity_factor * seq * self.top_k / self.num_experts)

    def _experts(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert's MLP on its slots ``x`` [experts, slots, hidden]."""
        def proj(w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
            return torch.bmm(t, w) if b is None else torch.baddbmm(b, t, w)

        if self.w3 is not None:
            inner = F.silu(proj(self.w1, self.b1, x)) * proj(self.w3, self.b3, x)
        else:
            inner = F.gelu(proj(self.w1, self.b1, x), approximate="tanh")
        return proj(self.w2, self.b2, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [batch, seq, hidden] -> [batch, seq, hidden]."""
        b, s, h = x.shape
        e, k, cap = self.num_experts, self.top_k, self.capacity(s)
        probs = self.router(x).float().softmax(-1)
        weight, expert = probs.topk(k, dim=-1)  # [b, s, k]
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        expert = expert.reshape(b, s * k)  # each sequence's choices in token order
        chosen = F.one_hot(expert, e)  # [b, s k, e]
        position = ((chosen.cumsum(1) - 1) * chosen).sum(-1)  # within its expert's slots
        fits = (position < cap).reshape(-1)
        kept = fits.to(x.dtype).reshape(b * s * k, 1)
        row = torch.arange(b, device=x.device).repeat_interleave(s * k)
        # Slot (expert, sequence, position) of each choice in an [e, b * cap] layout.
        slot = (expert.reshape(-1) * b + row) * cap + position.reshape(-1).clamp(max=cap - 1)
        # Each slot reads the token of the choice that fills it (static shapes: a choice past
        # its expert's capacity writes to one spare slot, dropped). Gathering by index saves
        # only the index for backward, as a trainer's token permutation does; scattering the
        # tokens with index_add would save a copy of them.
        spare = e * b * cap
        target = torch.where(fits, slot, spare)
        token = torch.arange(b * s, device=x.device).repeat_interleave(k)  # of each choice
        source = torch.zeros(spare + 1, dtype=torch.long, device=x.device).scatter(
            0, target, token)[:spare]
        filled = torch.zeros(spare + 1, dtype=x.dtype, device=x.device).scatter(
            0, target, torch.ones_like(kept.reshape(-1)))[:spare]
        slots = x.reshape(b * s, h).index_select(0, source) * filled.unsqueeze(1)
        out = self._experts(slots.view(e, b * cap, h)).reshape(e * b * cap, h)
        mixed = out.index_select(0, slot) * (weight.reshape(-1, 1) * kept)
        y = mixed.view(b, s, k, h).sum(2)
        for mlp in self.shared:
            y = y + mlp(x)
        return y


class Block(nn.Module):
    """One pre-norm transformer layer: ``x + attention(norm(x))``, then ``+ mlp(norm(.))``
    (a mixture of experts where ``moe``)."""

    def __init__(self, spec: ModelSpec, dropout: float, moe: bool = False,
                 capacity_factor: float = 1.0) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        self.feed_forward: nn.Module = (MoEFeedForward(spec, capacity_factor) if moe
                                        else FeedForward(spec))
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

    def __init__(self, spec: ModelSpec, *, dropout: float = 0.0,
                 capacity_factor: float = 1.0) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_position_embeddings, h)
            if spec.position_embedding == "learned" else None)
        # GPT-2's embedding dropout (Radford et al. 2019; Megatron-LM's embedding dropout).
        self.emb_dropout = nn.Dropout(dropout) if spec.dropout and dropout > 0 else None
        self.layers = nn.ModuleDict({str(i): Block(spec, dropout, kind == 1, capacity_factor)
                                     for i, kind in enumerate(spec.layer_kinds)})
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
            rope = rope_table(x.shape[1], int(self.spec.head_dim or 0), x.device)
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
            elif isinstance(module, MoEFeedForward):
                for w, std in ((module.w1, INIT_STD), (module.w3, INIT_STD), (module.w2, deep)):
                    if w is not None:
                        nn.init.normal_(w, mean=0.0, std=std)
                for bias in (module.b1, module.b3, module.b2):
                    if bias is not None:
                        nn.init.zeros_(bias)


def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int | None = 0,
                dropout: float = 0.0, capacity_factor: float = 1.0) -> Transformer:
    """The reference transformer of ``spec`` on ``device``, initialised with ``seed``.

    On ``device="meta"`` nothing is allocated and nothing is initialised (``seed`` is
    ignored): parallelize it with ``planner.apply``, which materialises each rank's shard.
    ``dropout``: the dropout probability where ``spec.dropout`` has dropout layers (0 keeps
    runs deterministic). ``capacity_factor``: expert slots over the tokens' choices of a
    mixture-of-experts layer (``MoEFeedForward``). Raises ``SpecError`` for specs it does
    not build.
    """
    unsupported = [(spec.patch_size > 0, "vision patch embeddings (ViT)"),
                   (spec.num_token_types > 0, "token-type embeddings (BERT)"),
                   (spec.embedding_norm, "an embedding norm (BERT)")]
    missing = [what for bad, what in unsupported if bad]
    if missing:
        raise SpecError(f"the reference transformer does not build {spec.name!r}: it has "
                        f"{', '.join(missing)}; pass your own torch module instead")
    if not 0.0 <= dropout < 1.0:
        raise SpecError(f"dropout must be in [0, 1), got {dropout!r}")
    if not capacity_factor > 0:
        raise SpecError(f"capacity_factor must be positive, got {capacity_factor!r}")
    with torch.device(device):
        model = Transformer(spec, dropout=dropout, capacity_factor=capacity_factor)
    if str(device) != "meta":
        model.init_weights(seed)
    return model
