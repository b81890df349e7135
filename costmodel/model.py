"""ModelSpec: the transformer hyper-parameters the cost model reads, with exact parameter counts.

Covers decoder-only (GPT, Llama 2/3 with GQA and gated MLP), mixture-of-experts (Mixtral,
DeepSeekMoE with shared experts and leading dense layers) and encoder-only (BERT, ViT)
transformers. Presets live in ``costmodel/data/models.toml`` with their sources;
``from_hf_config`` reads a Hugging Face ``config.json`` (a path or a dict; never the hub).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import hardware_profiles
from costmodel.errors import SpecError
from hardware_profiles.files import read_json_object

__all__ = ["ModelSpec"]

POSITION_EMBEDDINGS = ("rope", "learned", "none")
NORMS = ("rmsnorm", "layernorm")


def _load_presets() -> dict[str, dict[str, Any]]:
    path = resources.files("costmodel").joinpath("data/models.toml")
    with path.open("rb") as f:
        return tomllib.load(f)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Hyper-parameters of one transformer. Sizes are element counts, not bytes.

    ``num_kv_heads`` defaults to ``num_heads`` (MHA), ``ffn_hidden_size`` to ``4 * hidden_size``,
    ``head_dim`` to ``hidden_size // num_heads``. MoE: ``num_experts`` routed experts of
    ``moe_ffn_hidden_size`` each, ``top_k`` per token, ``num_shared_experts`` always active, and
    the first ``first_dense_layers`` layers use a dense MLP of ``ffn_hidden_size``.
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
    source: str = ""

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_kinds()
        self._check_experts()

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
        for key in ("vocab_size", "max_position_embeddings", "num_token_types", "patch_size",
                    "image_size", "num_experts", "top_k", "num_shared_experts",
                    "first_dense_layers"):
            self._positive(key, allow_zero=True)
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

    def _check_kinds(self) -> None:
        """Switches are booleans (``gated_mlp="no"`` is not a gated MLP), position embedding
        and norm are known kinds; learned positions and patches have their sizes."""
        for key in ("gated_mlp", "tied_embeddings", "bias", "qkv_bias", "qk_norm", "dropout",
                    "causal", "embedding_norm", "final_norm"):
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
            if self.first_dense_layers >= self.num_layers:
                raise SpecError(
                    f"ModelSpec {self.name!r}: first_dense_layers {self.first_dense_layers} "
                    f"leaves no MoE layer out of {self.num_layers}"
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

    @property
    def num_moe_layers(self) -> int:
        """Layers with a routed-expert MLP (all but the first ``first_dense_layers``)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def layer_kinds(self) -> tuple[int, ...]:
        """The kind of each layer in order (``costmodel.formulas.arrays.Layers``): 0 for a dense
        layer, 1 for a MoE layer (all but the first ``first_dense_layers``)."""
        dense = self.num_layers - self.num_moe_layers
        return (0,) * dense + (1,) * self.num_moe_layers

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
        """Width of each of the key and value projections: ``num_kv_heads * head_dim``."""
        return int(self.num_kv_heads or 0) * int(self.head_dim or 0)

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
        """Parameters of one attention block: Q, K, V, output projection and their biases."""
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        biases = 0
        if self.bias or self.qkv_bias:
            biases += self.q_dim + 2 * self.kv_dim
        if self.bias:
            biases += h
        return weights + biases

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
            + 2 * self._norm_params() + self.qk_norm_params()

    def moe_layer_non_expert_params(self) -> int:
        """Parameters of one MoE layer outside the routed experts: attention, norms, router,
        shared experts. These are sharded by tensor parallel like a dense layer."""
        h = self.hidden_size
        shared = self.num_shared_experts * self.mlp_params(int(self.moe_ffn_hidden_size or 0))
        return (self.attention_params() + 2 * self._norm_params() + self.qk_norm_params()
                + h * self.num_experts + shared)

    def layer_params(self, index: int) -> int:
        """Parameters of layer ``index`` (0-based)."""
        if not 0 <= index < self.num_layers:
            raise SpecError(f"layer index {index} out of range 0..{self.num_layers - 1}")
        if self.is_moe and index >= self.first_dense_layers:
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

    def num_params(self) -> int:
        """Total parameters (tied embeddings counted once)."""
        dense = self.dense_layer_params()
        if self.is_moe:
            moe = self.moe_layer_non_expert_params() + self.routed_expert_params()
            layers = self.first_dense_layers * dense + self.num_moe_layers * moe
        else:
            layers = self.num_layers * dense
        return self.embedding_params() + layers + self.head_params()

    def num_active_params(self) -> int:
        """Parameters one token passes through (``top_k`` of the routed experts)."""
        if not self.is_moe:
            return self.num_params()
        inactive = (self.num_experts - self.top_k) * self.mlp_params(
            int(self.moe_ffn_hidden_size or 0)
        )
        return self.num_params() - self.num_moe_layers * inactive

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
        return cls(name=key, **presets[key])

    @classmethod
    def from_hf_config(cls, config: str | Path | dict[str, Any], *, name: str | None = None
                       ) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a path or the parsed dict); no hub access.

        Supported ``model_type``: llama, mistral, qwen2, mixtral, deepseek (DeepSeekMoE),
        gpt2, bert, vit.
        """
        if isinstance(config, dict):
            cfg, label = config, name or str(config.get("_name_or_path") or "hf-config")
        else:
            p = Path(config)
            cfg = read_json_object(p, "HF config")
            label = name or p.stem
        return cls(name=label, **_hf_fields(cfg, label))

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-serializable)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _HFConfig:
    """A Hugging Face config dict read field by field, each of the kind it must be (a
    string where a count belongs, ``"false"`` where a switch belongs, is an error by name,
    not a traceback or a silent misreading)."""

    def __init__(self, cfg: dict[str, Any], label: str) -> None:
        self.cfg, self.label = cfg, label
        self.mtype = str(cfg.get("model_type", "")).lower()

    def need(self, *keys: str) -> Any:
        """The first of ``keys`` the config sets (not ``null``)."""
        for k in keys:
            if k in self.cfg and self.cfg[k] is not None:
                return self.cfg[k]
        raise SpecError(f"HF config {self.label!r} ({self.mtype}) lacks {' / '.join(keys)}")

    def whole(self, key: str, default: int) -> int:
        """An optional count: a whole number (``null`` or absent: ``default``)."""
        v = self.cfg.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecError(f"HF config {self.label!r}: {key} must be a whole number, got "
                            f"{v!r:.60}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        """An optional switch: JSON true or false (the string "false" is not false)."""
        v = self.cfg.get(key, default)
        if not isinstance(v, bool):
            raise SpecError(f"HF config {self.label!r}: {key} must be true or false, got "
                            f"{v!r:.60}")
        return v

    def vocabulary(self) -> Any:
        """``vocab_size``, at least 1 where it is a number (ModelSpec checks the kind)."""
        v = self.need("vocab_size")
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise SpecError(f"HF config {self.label!r}: vocab_size must be at least 1, got {v}")
        return v


def _decoder_fields(c: _HFConfig) -> dict[str, Any]:
    """llama, mistral, qwen2, qwen3, mixtral, deepseek (DeepSeekMoE) and qwen3_moe: rotary,
    RMSNorm, SwiGLU."""
    out: dict[str, Any] = {
        "num_layers": c.need("num_hidden_layers"),
        "hidden_size": c.need("hidden_size"),
        "num_heads": c.need("num_attention_heads"),
        "num_kv_heads": c.cfg.get("num_key_value_heads") or c.need("num_attention_heads"),
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.vocabulary(),
        "gated_mlp": True,
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "position_embedding": "rope",
        "norm": "rmsnorm",
        "qkv_bias": c.mtype == "qwen2",
        # transformers' Qwen3Attention: q_norm and k_norm, RMSNorm(head_dim), before RoPE.
        "qk_norm": c.mtype in ("qwen3", "qwen3_moe"),
    }
    if c.flag("use_sliding_window", False):
        raise SpecError(f"HF config {c.label!r}: sliding-window attention (use_sliding_window) "
                        "is not supported yet; plan it with use_sliding_window false")
    if c.flag("attention_bias", False) or c.flag("mlp_bias", False):
        raise SpecError(f"HF config {c.label!r}: attention_bias / mlp_bias are not supported")
    if c.cfg.get("head_dim"):
        out["head_dim"] = c.cfg["head_dim"]
    if c.mtype == "mixtral":
        out.update(num_experts=c.need("num_local_experts"), top_k=c.need("num_experts_per_tok"),
                   moe_ffn_hidden_size=c.need("intermediate_size"))
    if c.mtype == "deepseek":
        if c.whole("moe_layer_freq", 1) != 1:
            raise SpecError(f"HF config {c.label!r}: moe_layer_freq != 1 is not supported")
        out.update(num_experts=c.need("n_routed_experts"), top_k=c.need("num_experts_per_tok"),
                   moe_ffn_hidden_size=c.need("moe_intermediate_size"),
                   num_shared_experts=c.whole("n_shared_experts", 0),
                   first_dense_layers=c.whole("first_k_dense_replace", 0))
    if c.mtype == "qwen3_moe":
        out.update(_qwen3_moe_fields(c))
    return out


def _qwen3_moe_fields(c: _HFConfig) -> dict[str, Any]:
    """Qwen3's MoE layers (transformers' Qwen3MoeDecoderLayer): ``num_experts`` routed experts
    of ``moe_intermediate_size``, ``num_experts_per_tok`` per token, no shared expert; a
    layer is MoE where ``(index + 1) % decoder_sparse_step == 0`` and it is not in
    ``mlp_only_layers`` (every layer in the published checkpoints)."""
    only = c.cfg.get("mlp_only_layers") or []
    if c.whole("decoder_sparse_step", 1) != 1 or only:
        raise SpecError(f"HF config {c.label!r}: MoE on only some layers (decoder_sparse_step "
                        "!= 1 or mlp_only_layers) is not supported yet")
    return {"num_experts": c.need("num_experts"), "top_k": c.need("num_experts_per_tok"),
            "moe_ffn_hidden_size": c.need("moe_intermediate_size")}


def _gpt2_fields(c: _HFConfig) -> dict[str, Any]:
    h = c.need("n_embd")
    return {
        "num_layers": c.need("n_layer"), "hidden_size": h, "num_heads": c.need("n_head"),
        "ffn_hidden_size": c.whole("n_inner", 0) or 4 * h, "vocab_size": c.vocabulary(),
        "position_embedding": "learned", "max_position_embeddings": c.need("n_positions"),
        "norm": "layernorm", "bias": True, "dropout": True, "tied_embeddings": True,
    }


def _bert_fields(c: _HFConfig) -> dict[str, Any]:
    return {
        "num_layers": c.need("num_hidden_layers"), "hidden_size": c.need("hidden_size"),
        "num_heads": c.need("num_attention_heads"), "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.vocabulary(), "position_embedding": "learned",
        "max_position_embeddings": c.need("max_position_embeddings"),
        "num_token_types": c.whole("type_vocab_size", 2), "embedding_norm": True,
        "final_norm": False, "norm": "layernorm", "bias": True, "dropout": True,
        "tied_embeddings": True, "causal": False,
    }


def _vit_fields(c: _HFConfig) -> dict[str, Any]:
    labels = c.cfg.get("id2label") or {}
    if not isinstance(labels, dict):
        raise SpecError(f"HF config {c.label!r}: id2label must be an object of class names "
                        f"by index, got {labels!r:.60}")
    return {
        "num_layers": c.need("num_hidden_layers"), "hidden_size": c.need("hidden_size"),
        "num_heads": c.need("num_attention_heads"), "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": len(labels), "position_embedding": "learned",
        "patch_size": c.need("patch_size"), "image_size": c.need("image_size"),
        "num_channels": c.whole("num_channels", 3), "norm": "layernorm", "bias": True,
        "causal": False,
    }


_HF_FAMILIES = {"llama": _decoder_fields, "mistral": _decoder_fields, "qwen2": _decoder_fields,
                "qwen3": _decoder_fields, "mixtral": _decoder_fields,
                "deepseek": _decoder_fields, "qwen3_moe": _decoder_fields,
                "gpt2": _gpt2_fields, "bert": _bert_fields, "vit": _vit_fields}


def _hf_fields(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """Map a Hugging Face config dict onto ModelSpec fields."""
    c = _HFConfig(cfg, label)
    if c.mtype not in _HF_FAMILIES:
        raise SpecError(
            f"HF config {label!r}: model_type {c.mtype!r} is not supported; supported: "
            f"{', '.join(_HF_FAMILIES)} (or build ModelSpec(...) directly)")
    return _HF_FAMILIES[c.mtype](c)
