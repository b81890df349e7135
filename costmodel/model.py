"""ModelSpec: the transformer hyper-parameters the cost model reads, with exact parameter counts.

Covers decoder-only (GPT, Llama 2/3 with GQA and gated MLP, Qwen3 with qk-norm), multi-head
latent attention with multi-token prediction (DeepSeek-V2/V3, Kimi K2), mixture-of-experts
(Mixtral, DeepSeekMoE with shared experts and leading dense layers, Qwen3-MoE) and encoder-only
(BERT, ViT) transformers. Presets live in ``costmodel/data/models.toml`` with their sources;
``from_hf_config`` reads a Hugging Face ``config.json`` (a path or a dict; never the hub).
"""

from __future__ import annotations

import copy
import functools
import tomllib
import warnings
from dataclasses import dataclass, fields
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import hardware_profiles
from costmodel.errors import SpecError
from costmodel.hfconfig import hf_fields, language_config
from hardware_profiles.files import read_json_object

__all__ = ["ModelSpec"]

POSITION_EMBEDDINGS = ("rope", "learned", "none")
NORMS = ("rmsnorm", "layernorm")


@functools.lru_cache(maxsize=1)
def _load_presets() -> dict[str, dict[str, Any]]:
    """The shipped presets (``data/models.toml``), parsed once; callers copy what they
    keep."""
    path = resources.files("costmodel").joinpath("data/models.toml")
    with path.open("rb") as f:
        return tomllib.load(f)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Hyper-parameters of one transformer. Sizes are element counts, not bytes.

    ``num_kv_heads`` defaults to ``num_heads`` (MHA), ``ffn_hidden_size`` to ``4 * hidden_size``,
    ``head_dim`` to ``hidden_size // num_heads``. MoE: ``num_experts`` routed experts of
    ``moe_ffn_hidden_size`` each, ``top_k`` per token, ``num_shared_experts`` always active, and
    the first ``first_dense_layers`` layers use a dense MLP of ``ffn_hidden_size``. Group-limited
    routing (DeepSeek-V2/V3's ``n_group`` / ``topk_group``): the experts form ``expert_groups``
    equal groups and a token's experts come from at most ``expert_group_limit`` of them (0: no
    limit; DeepSeek-V3 8 and 4, its node-limited routing, report Sec. 2.1.2).
    Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1):
    ``kv_lora_rank > 0`` compresses each token's keys and values into a latent of
    ``kv_lora_rank`` (and the queries into ``q_lora_rank``, 0 for a full query projection),
    normed and projected up per head; each head's query and key hold ``head_dim`` elements,
    of which the last ``qk_rope_head_dim`` carry the rotary embedding (the key's shared by
    every head), and its value ``v_head_dim``. ``mtp_layers``: multi-token prediction modules
    (DeepSeek-AI 2024, "DeepSeek-V3", Sec. 2.2), each a norm of the hidden state and of the
    next token's embedding, a ``2h -> h`` projection and one more layer (MoE where the model's
    last layer is), sharing the embedding and output layer, with a loss of its own.
    Layer patterns: a MoE layer is one from ``first_dense_layers`` on whose ``(index + 1)``
    divides by ``moe_every`` (Llama 4 Maverick and Qwen3's ``decoder_sparse_step``: 2 for every
    other layer). ``sliding_window > 0`` makes layers local: each query attends to the last
    ``sliding_window`` keys (Beltagy et al. 2020, "Longformer"; Mistral 7B), or with
    ``chunked_attention`` to the keys of its own chunk of that many tokens (Llama 4); every
    ``global_every``-th layer (``(index + 1) % global_every == 0``; 0: none) attends to all
    (GPT-OSS 2, Gemma 3 6, Llama 4 4). ``attention_sinks``: a learned logit per head added
    to each softmax's denominator (GPT-OSS; Xiao et al. 2024, "Efficient Streaming Language
    Models with Attention Sinks"). ``post_norms``: a norm after the attention's and the MLP's
    outputs too, before the residual add (Gemma 2 and 3: four norms a layer). ``global_nope``:
    the global layers take no rotary embedding (Llama 4's NoPE layers).
    ``qk_norm``: each head's query and key pass an RMSNorm of ``head_dim`` before the rotary
    embedding (Qwen3; Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion
    Parameters", Sec. 2.1), one weight of ``head_dim`` each for q and k. Vision
    (ViT): ``patch_size > 0`` replaces the token embedding with a patch projection, and
    ``vocab_size`` is then the number of classes of the head.
    """

    name: str = "custom"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int
    head_dim: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = False
    position_embedding: str = "rope"
    max_position_embeddings: int = 0
    norm: str = "rmsnorm"
    bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    dropout: bool = False
    causal: bool = True
    num_token_types: int = 0
    embedding_norm: bool = False
    final_norm: bool = True
    patch_size: int = 0
    image_size: int = 0
    num_channels: int = 3
    num_experts: int = 0
    top_k: int = 0
    moe_ffn_hidden_size: int | None = None
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    expert_groups: int = 0
    expert_group_limit: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    mtp_layers: int = 0
    moe_every: int = 1
    sliding_window: int = 0
    global_every: int = 0
    chunked_attention: bool = False
    attention_sinks: bool = False
    post_norms: bool = False
    global_nope: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_kinds()
        self._check_experts()

    def _check_expert_groups(self) -> None:
        """Group-limited routing needs experts split into equal groups and a limit below
        their count."""
        g, m = self.expert_groups, self.expert_group_limit
        if not g and not m:
            return
        if not (0 < m < g) or (self.num_experts % g if self.num_experts else True):
            raise SpecError(f"ModelSpec {self.name!r}: expert_groups={g} and "
                            f"expert_group_limit={m} need 0 < limit < groups and groups "
                            f"dividing num_experts={self.num_experts} (or both 0: no limit)")

    def _positive(self, key: str, allow_zero: bool = False) -> int:
        """Field ``key`` must be a positive (``allow_zero``: non-negative) integer; its value."""
        v = getattr(self, key)
        is_int = isinstance(v, int) and not isinstance(v, bool)
        ok = is_int and (v >= 0 if allow_zero else v > 0)
        if not ok:
            need = "a non-negative" if allow_zero else "a positive"
            raise SpecError(f"ModelSpec {self.name!r}: {key} must be {need} integer, got {v!r}")
        return v

    def _check_sizes(self) -> None:
        """Counts and widths are integers in range; fill the defaults of the KV heads, the MLP
        width and the head width."""
        for key in ("num_layers", "hidden_size", "num_heads"):
            self._positive(key)
        # Sanity bounds, far beyond any published model, so a typo is an error.
        for key, most in (("num_layers", 2**14), ("hidden_size", 2**20), ("num_heads", 2**14),
                          ("vocab_size", 2**24), ("num_experts", 2**14),
                          ("ffn_hidden_size", 2**22)):
            v = getattr(self, key)
            if isinstance(v, int) and v > most:
                raise SpecError(f"ModelSpec {self.name!r}: {key} = {v:,} is beyond any model "
                                f"(at most {most:,}); check the config")
        self._positive("moe_every")
        for key in ("vocab_size", "max_position_embeddings", "num_token_types", "patch_size",
                    "image_size", "num_experts", "top_k", "num_shared_experts",
                    "first_dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                    "mtp_layers", "sliding_window", "global_every", "expert_groups",
                    "expert_group_limit"):
            self._positive(key, allow_zero=True)
        self._check_expert_groups()
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        kv_heads = self._positive("num_kv_heads")
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        self._positive("ffn_hidden_size")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise SpecError(
                    f"ModelSpec {self.name!r}: hidden_size {self.hidden_size} is not divisible "
                    f"by num_heads {self.num_heads}; pass head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        self._positive("head_dim")
        if self.num_heads % kv_heads:
            raise SpecError(
                f"ModelSpec {self.name!r}: num_heads {self.num_heads} must be a multiple of "
                f"num_kv_heads {self.num_kv_heads} (grouped-query attention)"
            )
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        self._positive("v_head_dim")
        self._check_latent()

    def _check_latent(self) -> None:
        """Multi-head latent attention's fields agree: a latent, rotary dims inside the head,
        one K and V per head, no attention biases."""
        latent = ("q_lora_rank", "qk_rope_head_dim")
        if not self.kv_lora_rank:
            if any(getattr(self, k) for k in latent):
                raise SpecError(f"ModelSpec {self.name!r}: q_lora_rank / qk_rope_head_dim "
                                "are multi-head latent attention's; they need kv_lora_rank > 0")
            return
        if not 0 < self.qk_rope_head_dim < int(self.head_dim or 0):
            raise SpecError(f"ModelSpec {self.name!r}: qk_rope_head_dim "
                            f"{self.qk_rope_head_dim} must be between 1 and head_dim - 1 "
                            f"({self.head_dim}: the no-rotary and rotary parts of a query)")
        if self.num_kv_heads != self.num_heads or self.bias or self.qkv_bias or self.qk_norm:
            raise SpecError(f"ModelSpec {self.name!r}: multi-head latent attention has one key "
                            "and value per head (num_kv_heads = num_heads) and no attention "
                            "biases or qk_norm")

    def _check_kinds(self) -> None:
        """Switches are booleans (``gated_mlp="no"`` is not a gated MLP), position embedding
        and norm are known kinds; learned positions and patches have their sizes."""
        for key in ("gated_mlp", "tied_embeddings", "bias", "qkv_bias", "qk_norm", "dropout",
                    "causal", "embedding_norm", "final_norm", "chunked_attention",
                    "attention_sinks", "post_norms", "global_nope"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"ModelSpec {self.name!r}: {key} must be True or False, got "
                                f"{getattr(self, key)!r:.60}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise SpecError(
                f"ModelSpec {self.name!r}: position_embedding {self.position_embedding!r} is not "
                f"one of {', '.join(POSITION_EMBEDDINGS)}"
            )
        if self.norm not in NORMS:
            raise SpecError(
                f"ModelSpec {self.name!r}: norm {self.norm!r} is not one of {', '.join(NORMS)}"
            )
        if (self.position_embedding == "learned" and self.patch_size == 0
                and self.max_position_embeddings == 0):
            raise SpecError(
                f"ModelSpec {self.name!r}: learned position embeddings need "
                "max_position_embeddings > 0"
            )
        if (self.global_every or self.chunked_attention) and not self.sliding_window:
            raise SpecError(f"ModelSpec {self.name!r}: global_every / chunked_attention "
                            "describe local attention; they need sliding_window > 0")
        if self.patch_size and (self.image_size == 0 or self.image_size % self.patch_size):
            raise SpecError(
                f"ModelSpec {self.name!r}: image_size {self.image_size} must be a positive "
                f"multiple of patch_size {self.patch_size}"
            )

    def _check_experts(self) -> None:
        """Routing fields agree with the number of experts; fill the expert MLP width."""
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise SpecError(
                    f"ModelSpec {self.name!r}: top_k {self.top_k} must be between 1 and "
                    f"num_experts {self.num_experts}"
                )
            if self.moe_ffn_hidden_size is None:
                object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
            self._positive("moe_ffn_hidden_size")
            if not self.num_moe_layers:
                raise SpecError(
                    f"ModelSpec {self.name!r}: first_dense_layers {self.first_dense_layers} "
                    f"and moe_every {self.moe_every} leave no MoE layer out of "
                    f"{self.num_layers}"
                )
        elif self.top_k or self.num_shared_experts:
            raise SpecError(
                f"ModelSpec {self.name!r}: top_k / num_shared_experts need num_experts > 0"
            )

    # ------------------------------------------------------------------ structure
    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.num_experts > 0

    def layer_is_moe(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) routes tokens to experts: from
        ``first_dense_layers`` on, every ``moe_every``-th."""
        return self.is_moe and index >= self.first_dense_layers \
            and (index + 1) % self.moe_every == 0

    def layer_is_local(self, index: int) -> bool:
        """Whether layer ``index`` attends to a window (or chunk) of keys, not all of them."""
        return self.sliding_window > 0 and not (
            self.global_every and (index + 1) % self.global_every == 0)

    @cached_property
    def layer_attributes(self) -> tuple[tuple[bool, bool], ...]:
        """(routes to experts, attends locally) of each layer in order."""
        return tuple((self.layer_is_moe(i), self.layer_is_local(i))
                     for i in range(self.num_layers))

    @cached_property
    def kind_attributes(self) -> tuple[tuple[bool, bool], ...]:
        """The kinds of layer the model has, as (routes to experts, attends locally), in
        order: a dense model's one kind, a MoE model's dense and MoE layers, each of those
        local or global (``layer_kinds`` indexes this)."""
        return tuple(sorted(set(self.layer_attributes), key=lambda a: (a[1], a[0])))

    @cached_property
    def num_moe_layers(self) -> int:
        """Layers with a routed-expert MLP (``layer_is_moe``)."""
        return sum(moe for moe, _ in self.layer_attributes) if self.is_moe else 0

    @cached_property
    def layer_kinds(self) -> tuple[int, ...]:
        """The kind of each layer in order (``costmodel.formulas.arrays.Layers``), an index
        into ``kind_attributes``: 0 for a dense layer, 1 for a MoE layer, as many more as
        local attention makes."""
        index = {a: k for k, a in enumerate(self.kind_attributes)}
        return tuple(index[a] for a in self.layer_attributes)

    def has_rotary(self, local: bool) -> bool:
        """Whether a (``local`` or global) layer rotates its queries and keys."""
        return self.position_embedding == "rope" and (local or not self.global_nope)

    def attended_keys(self, seq_len: int | float, local: bool) -> float:
        """Keys a query attends to on average over a sequence of ``seq_len`` tokens under the
        causal mask: ``s / 2``; a local layer's sliding window of W, ``W - W^2 / 2s`` (the
        first W queries see fewer); chunked, ``min(s, W) / 2`` (Llama 4's chunks restart the
        mask); non-causal: all ``s``."""
        s, w = float(seq_len), float(self.sliding_window)
        if not self.causal:
            return s if not local else min(s, w)
        if not local or s <= w:
            return s / 2
        return w / 2 if self.chunked_attention else w - w * w / (2 * s)

    @property
    def first_stage_layers(self) -> int:
        """Layers a pipeline's first stage must hold because they read the model's own
        inputs (``LayerCosts.first_stage_layers``): a preset reads them in its embedding
        alone, so none."""
        return 0

    @property
    def q_dim(self) -> int:
        """Width of the query projection: ``num_heads * head_dim``."""
        return self.num_heads * int(self.head_dim or 0)

    @property
    def kv_dim(self) -> int:
        """Width of the keys: ``num_kv_heads * head_dim`` (of the values too, unless
        ``v_head_dim`` differs: ``v_dim``)."""
        return int(self.num_kv_heads or 0) * int(self.head_dim or 0)

    @property
    def v_dim(self) -> int:
        """Width of the values: ``num_kv_heads * v_head_dim``."""
        return int(self.num_kv_heads or 0) * int(self.v_head_dim or 0)

    @property
    def o_dim(self) -> int:
        """Width of the attention's output, the output projection's input:
        ``num_heads * v_head_dim``."""
        return self.num_heads * int(self.v_head_dim or 0)

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def latent_dim(self) -> int:
        """Elements per token MLA's down projections make: the query latent (0 without one),
        the key-value latent and the shared rotary key (0 for other attention)."""
        if not self.is_mla:
            return 0
        return self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def attention_input_dim(self) -> int:
        """Elements per token the tensor-parallel (column-parallel) linears of the attention
        read: the hidden state, or MLA's latents (with the hidden state where the query has
        no latent). Under sequence parallelism this is what is all-gathered into them
        (Megatron-Core ``MLASelfAttention.get_query_key_value_tensors``: the down
        projections run on each rank's sequence shard with replicated weights)."""
        if not self.is_mla:
            return self.hidden_size
        q_in = self.q_lora_rank or self.hidden_size
        return q_in + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def rotary_elements(self) -> int:
        """Elements per token the rotary-embedding kernels read and write, all heads: the
        queries and keys; MLA's fused kernels rotate the rotary parts and assemble each
        head's query, key and value (Megatron-Core ``fused_apply_mla_rope_for_q`` /
        ``_for_kv``): ``q + k + v``; 0 without rotary embeddings."""
        if self.position_embedding != "rope":
            return 0
        return self.q_dim + self.kv_dim + (self.v_dim if self.is_mla else 0)

    def attention_matmuls(self) -> tuple[tuple[int, int, bool], ...]:
        """(input features, output features, split over tensor parallel) of each linear of one
        attention block in call order: the fused Q, K, V projection and the output projection
        (Megatron-LM column and row parallel); MLA's query down and up projections (or one
        query projection), key-value down projection (latent and rotary key) and up
        projection (no-rotary keys and values per head), then the output projection; the
        down projections replicated on every tensor-parallel rank (DeepSeek-AI 2024,
        "DeepSeek-V2", Eqs. 9-14 and 37-38; Megatron-Core ``MLASelfAttention``)."""
        h = self.hidden_size
        if not self.is_mla:
            return ((h, self.q_dim + self.kv_dim + self.v_dim, True), (self.o_dim, h, True))
        nope = int(self.head_dim or 0) - self.qk_rope_head_dim
        q = ((h, self.q_lora_rank, False), (self.q_lora_rank, self.q_dim, True)) \
            if self.q_lora_rank else ((h, self.q_dim, True),)
        kv = ((h, self.kv_lora_rank + self.qk_rope_head_dim, False),
              (self.kv_lora_rank, self.num_heads * (nope + int(self.v_head_dim or 0)), True))
        return (*q, *kv, (self.o_dim, h, True))

    @property
    def num_patches(self) -> int:
        """Image patches per sample for a ViT (0 for token models)."""
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0

    # ------------------------------------------------------------------ parameter counts
    def _norm_params(self) -> int:
        # LayerNorm has a weight and a bias; RMSNorm only a weight.
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def qk_norm_params(self) -> int:
        """The query and key norms' weights of one layer (``qk_norm``): ``head_dim`` each,
        shared by the heads (every tensor-parallel rank holds them whole)."""
        return 2 * int(self.head_dim or 0) if self.qk_norm else 0

    def attention_params(self) -> int:
        """Parameters of one attention block: Q, K, V, output projection and their biases;
        MLA's projections and the RMSNorms of its latents; a sink logit per head."""
        h = self.hidden_size
        weights = sum(i * o for i, o, _ in self.attention_matmuls())
        biases = 0
        if self.bias or self.qkv_bias:
            biases += self.q_dim + self.kv_dim + self.v_dim
        if self.bias:
            biases += h
        sinks = self.num_heads if self.attention_sinks else 0
        return weights + biases + self.latent_norm_params() + sinks

    def layer_norm_params(self) -> int:
        """The norms of one layer: before the attention and the MLP (and after each, with
        ``post_norms``), and the query and key norms."""
        return (4 if self.post_norms else 2) * self._norm_params() + self.qk_norm_params()

    def latent_norm_params(self) -> int:
        """MLA's RMSNorms of the query and key-value latents (``q_lora_rank`` and
        ``kv_lora_rank`` weights; 0 for other attention)."""
        return self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0

    def attention_replicated_params(self) -> int:
        """Parameters of one attention block every tensor-parallel rank holds whole: MLA's
        down projections and latent norms (0 for other attention; its norms and the query
        and key norms are counted with the layer's)."""
        return sum(i * o for i, o, split in self.attention_matmuls() if not split) \
            + self.latent_norm_params()

    def mlp_params(self, ffn: int) -> int:
        """Parameters of one (dense or expert) MLP of inner width ``ffn``."""
        h = self.hidden_size
        if self.gated_mlp:  # gate, up and down projections (SwiGLU), Shazeer 2020
            return 3 * h * ffn + (2 * ffn + h if self.bias else 0)
        return 2 * h * ffn + (ffn + h if self.bias else 0)

    def routed_expert_params(self) -> int:
        """Parameters of the routed experts of one MoE layer (what expert parallel shards)."""
        return self.num_experts * self.mlp_params(int(self.moe_ffn_hidden_size or 0))

    def dense_layer_params(self) -> int:
        """Parameters of one transformer layer with a dense MLP (norms included)."""
        return self.attention_params() + self.mlp_params(int(self.ffn_hidden_size or 0)) \
            + self.layer_norm_params()

    def router_params(self) -> int:
        """A MoE layer's router: ``hidden x experts`` (and a bias per expert with ``bias``,
        GPT-OSS's)."""
        return (self.hidden_size + (1 if self.bias else 0)) * self.num_experts

    def moe_layer_non_expert_params(self) -> int:
        """Parameters of one MoE layer outside the routed experts: attention, norms, router,
        shared experts. These are sharded by tensor parallel like a dense layer."""
        shared = self.num_shared_experts * self.mlp_params(int(self.moe_ffn_hidden_size or 0))
        return (self.attention_params() + self.layer_norm_params() + self.router_params()
                + shared)

    def layer_params(self, index: int) -> int:
        """Parameters of layer ``index`` (0-based)."""
        if not 0 <= index < self.num_layers:
            raise SpecError(f"layer index {index} out of range 0..{self.num_layers - 1}")
        if self.layer_is_moe(index):
            return self.moe_layer_non_expert_params() + self.routed_expert_params()
        return self.dense_layer_params()

    def embedding_params(self) -> int:
        """Input side: token (or patch) embedding, position and token-type embeddings, norm."""
        h = self.hidden_size
        if self.patch_size:
            # Conv patch projection with bias, a class token, and a learned position per patch
            # plus the class token (Dosovitskiy et al. 2021, Eq. 1).
            n = self.num_patches
            total = self.num_channels * self.patch_size**2 * h + h + h + (n + 1) * h
        else:
            total = self.vocab_size * h
            if self.position_embedding == "learned":
                total += self.max_position_embeddings * h
        total += self.num_token_types * h
        if self.embedding_norm:
            total += self._norm_params()
        return total

    def head_params(self) -> int:
        """Output side: final norm and, when untied, the output projection (LM head)."""
        total = self._norm_params() if self.final_norm else 0
        if not self.tied_embeddings and self.vocab_size:
            total += self.vocab_size * self.hidden_size + (self.vocab_size if self.bias else 0)
        return total

    def mtp_extra_params(self) -> int:
        """Parameters of one multi-token prediction module outside its layer: the norms of
        the hidden state and of the embedding, the ``2h -> h`` projection and the norm before
        the shared output layer (DeepSeek-V3's ``enorm``, ``hnorm``, ``eh_proj``,
        ``shared_head.norm``)."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self._norm_params()

    def mtp_params(self) -> int:
        """Parameters of the multi-token prediction modules (``mtp_layers``; the embedding
        and output layer they share with the model are not counted again)."""
        if not self.mtp_layers:
            return 0
        return self.mtp_layers * (self.layer_params(self.num_layers - 1)
                                  + self.mtp_extra_params())

    def num_params(self) -> int:
        """Total parameters (tied embeddings counted once; the multi-token prediction
        modules included: ``mtp_params``)."""
        dense = self.dense_layer_params()
        layers = (self.num_layers - self.num_moe_layers) * dense
        if self.is_moe:
            layers += self.num_moe_layers * (self.moe_layer_non_expert_params()
                                             + self.routed_expert_params())
        return self.embedding_params() + layers + self.head_params() + self.mtp_params()

    def num_active_params(self) -> int:
        """Parameters one token passes through (``top_k`` of the routed experts; the
        multi-token prediction modules included)."""
        if not self.is_moe:
            return self.num_params()
        inactive = (self.num_experts - self.top_k) * self.mlp_params(
            int(self.moe_ffn_hidden_size or 0)
        )
        return self.num_params() - (self.num_moe_layers + self.mtp_layers) * inactive

    def mtp_active_params(self) -> int:
        """Parameters one token passes through in the multi-token prediction modules."""
        if not self.is_moe or not self.mtp_layers:
            return self.mtp_params()
        inactive = (self.num_experts - self.top_k) * self.mlp_params(
            int(self.moe_ffn_hidden_size or 0))
        return self.mtp_params() - self.mtp_layers * inactive

    # ------------------------------------------------------------------ constructors
    @staticmethod
    def preset_names() -> list[str]:
        """Names of the shipped presets."""
        return sorted(_load_presets())

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """A shipped preset by name (``llama-3-70b``, ``gpt3-175b``, ``mixtral-8x7b``, ...)."""
        presets = _load_presets()
        key = str(name).strip().lower()
        if key not in presets:
            raise hardware_profiles.unknown_name("model", name, list(presets))
        return cls(name=key, **copy.deepcopy(presets[key]))

    @classmethod
    def from_hf_config(cls, config: str | Path | dict[str, Any], *, name: str | None = None
                       ) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a path or the parsed dict); no hub access.

        Supported ``model_type``: llama, mistral, qwen2, qwen3, mixtral, deepseek
        (DeepSeekMoE), qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2 (multi-head latent
        attention), glm4_moe, gpt_oss, gemma3 (its language model), gemma3_text, llama4 (its
        language model) and llama4_text (local and global attention), gpt2, bert, vit.
        """
        if isinstance(config, dict):
            cfg, label = config, name or str(config.get("_name_or_path") or "hf-config")
        else:
            p = Path(config)
            cfg = read_json_object(p, "HF config")
            label = name or p.stem
        if language_config(cfg, label) is not None:
            warnings.warn(f"{label}: a multimodal config ({cfg.get('model_type')}): planning "
                          "its language model (text_config), not its vision encoder",
                          stacklevel=2)
        return cls(name=label, **hf_fields(cfg, label))

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-serializable)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
