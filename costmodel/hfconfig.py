"""Reading a Hugging Face ``config.json`` (already parsed: a dict) into ``ModelSpec``'s fields,
family by family (``model_type``). Never the hub; ``ModelSpec.from_hf_config`` reads the file.
"""

from __future__ import annotations

from typing import Any

from costmodel.errors import SpecError

__all__ = ["HF_FAMILIES", "hf_fields"]


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


def _rotary_decoder(c: _HFConfig, tied: bool = False) -> dict[str, Any]:
    """The fields each rotary, RMSNorm, gated-MLP decoder family here shares (``tied``: the
    family's default for ``tie_word_embeddings``)."""
    return {"num_layers": c.need("num_hidden_layers"), "hidden_size": c.need("hidden_size"),
            "num_heads": c.need("num_attention_heads"), "gated_mlp": True,
            "tied_embeddings": c.flag("tie_word_embeddings", tied),
            "position_embedding": "rope", "norm": "rmsnorm"}


def _deepseek_moe(c: _HFConfig) -> dict[str, Any]:
    """DeepSeekMoE's layers (DeepSeek, DeepSeek-V2/V3, GLM-4.5): ``n_routed_experts`` experts
    of ``moe_intermediate_size``, top ``num_experts_per_tok``, ``n_shared_experts`` shared
    ones, after ``first_k_dense_replace`` dense layers, and their group-limited routing."""
    return {"num_experts": c.need("n_routed_experts"), "top_k": c.need("num_experts_per_tok"),
            "moe_ffn_hidden_size": c.need("moe_intermediate_size"),
            "num_shared_experts": c.whole("n_shared_experts", 0),
            "first_dense_layers": c.whole("first_k_dense_replace", 0), **_group_limit(c)}


def _group_limit(c: _HFConfig) -> dict[str, Any]:
    """DeepSeek-V2/V3's group-limited routing: ``topk_group`` of ``n_group`` expert groups
    per token (nothing where the limit does not bind: one group, or all of them)."""
    groups, limit = c.whole("n_group", 0), c.whole("topk_group", 0)
    if groups > 1 and 0 < limit < groups:
        return {"expert_groups": groups, "expert_group_limit": limit}
    return {}


def _decoder_fields(c: _HFConfig) -> dict[str, Any]:
    """llama, mistral, qwen2, qwen3, mixtral, deepseek (DeepSeekMoE) and qwen3_moe: rotary,
    RMSNorm, SwiGLU."""
    out: dict[str, Any] = {
        **_rotary_decoder(c),
        "num_kv_heads": c.cfg.get("num_key_value_heads") or c.need("num_attention_heads"),
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.vocabulary(),
        "qkv_bias": c.mtype == "qwen2",
        # transformers' Qwen3Attention: q_norm and k_norm, RMSNorm(head_dim), before RoPE.
        "qk_norm": c.mtype in ("qwen3", "qwen3_moe"),
    }
    if c.flag("use_sliding_window", False):
        # Qwen2/3's windows start at layer max_window_layers, a pattern global_every does not
        # describe; the published checkpoints train without them.
        raise SpecError(f"HF config {c.label!r}: Qwen's sliding-window attention "
                        "(use_sliding_window, from max_window_layers on) is not supported; "
                        "plan it with use_sliding_window false")
    if c.mtype in ("mistral", "mixtral") and c.cfg.get("sliding_window"):
        # Mistral 7B v0.1: every layer attends to the last sliding_window keys.
        out["sliding_window"] = c.whole("sliding_window", 0)
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
        out.update(_deepseek_moe(c))
    if c.mtype == "qwen3_moe":
        out.update(_qwen3_moe_fields(c))
    return out


def _qwen3_moe_fields(c: _HFConfig) -> dict[str, Any]:
    """Qwen3's MoE layers (transformers' Qwen3MoeDecoderLayer): ``num_experts`` routed experts
    of ``moe_intermediate_size``, ``num_experts_per_tok`` per token, no shared expert; a
    layer is MoE where ``(index + 1) % decoder_sparse_step == 0`` and it is not in
    ``mlp_only_layers`` (every layer in the published checkpoints): ``moe_every``."""
    if c.cfg.get("mlp_only_layers"):
        raise SpecError(f"HF config {c.label!r}: dense layers listed by mlp_only_layers are "
                        "not supported; plan it with decoder_sparse_step alone")
    return {"num_experts": c.need("num_experts"), "top_k": c.need("num_experts_per_tok"),
            "moe_ffn_hidden_size": c.need("moe_intermediate_size"),
            "moe_every": c.whole("decoder_sparse_step", 1)}


def _deepseek_mla_fields(c: _HFConfig) -> dict[str, Any]:
    """DeepSeek-V2 and V3 (and Kimi K2, built as DeepSeek-V3): multi-head latent attention
    (``kv_lora_rank``, ``q_lora_rank`` or null for a full query projection,
    ``qk_nope_head_dim + qk_rope_head_dim`` per query and key head, ``v_head_dim`` per value
    head), DeepSeekMoE layers after ``first_k_dense_replace`` dense ones (transformers'
    DeepseekV3DecoderLayer; ``moe_layer_freq`` 1 in every published checkpoint), and
    ``num_nextn_predict_layers`` multi-token prediction modules (V3). The routers'
    score-correction biases (V3's aux-loss-free balancing, one per expert, not trained by
    gradient) are not counted."""
    if c.whole("moe_layer_freq", 1) != 1:
        raise SpecError(f"HF config {c.label!r}: moe_layer_freq != 1 is not supported")
    if c.flag("attention_bias", False):
        raise SpecError(f"HF config {c.label!r}: attention_bias is not supported with "
                        "multi-head latent attention")
    heads = c.need("num_attention_heads")
    nope, rope = c.need("qk_nope_head_dim"), c.need("qk_rope_head_dim")
    for key, v in (("qk_nope_head_dim", nope), ("qk_rope_head_dim", rope)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"HF config {c.label!r}: {key} must be a positive whole number, "
                            f"got {v!r:.60}")
    out: dict[str, Any] = {
        **_rotary_decoder(c), "num_kv_heads": heads,
        "ffn_hidden_size": c.need("intermediate_size"), "vocab_size": c.vocabulary(),
        "head_dim": nope + rope, "qk_rope_head_dim": rope, "v_head_dim": c.need("v_head_dim"),
        "kv_lora_rank": c.need("kv_lora_rank"), "q_lora_rank": c.whole("q_lora_rank", 0),
        "mtp_layers": c.whole("num_nextn_predict_layers", 0),
    }
    if c.whole("n_routed_experts", 0):
        out.update(_deepseek_moe(c))
    return out


#: What a ``layer_types`` entry of a local layer reads (transformers 4.5x).
LOCAL_LAYER_TYPES = ("sliding_attention", "chunked_attention")


def window_pattern(c: _HFConfig, layers: int, default_every: int = 0) -> int:
    """``ModelSpec.global_every`` of a config's local and global layers: from
    ``layer_types`` (every k-th layer global, the others local; all local: 0), else
    ``sliding_window_pattern`` (Gemma 3's), else ``default_every``. SpecError for a pattern
    that is not periodic so."""
    types = c.cfg.get("layer_types")
    if types is None:
        return c.whole("sliding_window_pattern", default_every)
    if not isinstance(types, list) or len(types) != layers:
        raise SpecError(f"HF config {c.label!r}: layer_types must list one type per layer "
                        f"({layers}), got {types!r:.80}")
    return periodic_globals(c, "layer_types", [t in LOCAL_LAYER_TYPES for t in types], types)


def periodic_globals(c: _HFConfig, key: str, local: list[bool], shown: list[Any]) -> int:
    """``ModelSpec.global_every`` of a per-layer list of local (True) and global layers: the
    k for which every k-th layer alone is global (0: all local); SpecError otherwise."""
    if all(local):
        return 0
    for every in range(1, len(local) + 1):
        if all(loc == bool((i + 1) % every) for i, loc in enumerate(local)):
            return every
    raise SpecError(f"HF config {c.label!r}: {key} {shown[:8]!r}... are not every k-th layer "
                    "global and the rest local, the patterns supported")


def _llama4_fields(c: _HFConfig) -> dict[str, Any]:
    """Llama 4's language model (transformers' Llama4TextConfig; Meta 2025, "The Llama 4
    herd"): rotary, RMSNorm, GQA; chunked attention of ``attention_chunk_size`` on the layers
    with rotary embeddings and full attention on the others (``no_rope_layers``, 0 marking
    them; empty: every ``no_rope_layer_interval``-th, default 4); a mixture of
    ``num_local_experts`` experts of ``intermediate_size`` (top ``num_experts_per_tok``) and
    one shared expert on every ``interleave_moe_layer_step``-th layer, dense MLPs of
    ``intermediate_size_mlp`` on the others. Its query and key L2 norms have no weights."""
    layers = c.need("num_hidden_layers")
    flags = c.cfg.get("no_rope_layers") or []
    if flags:
        if not isinstance(flags, list) or len(flags) != layers:
            raise SpecError(f"HF config {c.label!r}: no_rope_layers must list one 0 or 1 per "
                            f"layer ({layers}), got {flags!r:.80}")
        every = periodic_globals(c, "no_rope_layers", [bool(f) for f in flags], flags)
    else:
        every = c.whole("no_rope_layer_interval", 4)
    return {
        **_rotary_decoder(c),
        "num_kv_heads": c.need("num_key_value_heads"), "head_dim": c.need("head_dim"),
        "ffn_hidden_size": c.need("intermediate_size_mlp"), "vocab_size": c.vocabulary(),
        "moe_ffn_hidden_size": c.need("intermediate_size"),
        "num_experts": c.need("num_local_experts"), "top_k": c.need("num_experts_per_tok"),
        "num_shared_experts": 1, "moe_every": c.whole("interleave_moe_layer_step", 1),
        "sliding_window": c.whole("attention_chunk_size", 0),
        "chunked_attention": bool(c.cfg.get("attention_chunk_size")),
        "global_nope": True,  # the global layers are the ones without rotary embeddings
        "global_every": every if c.cfg.get("attention_chunk_size") else 0,
    }


def _glm4_moe_fields(c: _HFConfig) -> dict[str, Any]:
    """GLM-4.5 (transformers' Glm4MoeConfig; Zhipu AI 2025, "GLM-4.5"): rotary on
    ``partial_rotary_factor`` of each head (costed as a whole head's: a memory-bound kernel),
    biases on q, k and v (``attention_bias``), RMSNorm on each head's query and key where
    ``use_qk_norm``, ``first_k_dense_replace`` dense layers of ``intermediate_size`` then
    ``n_routed_experts`` experts of ``moe_intermediate_size`` (top ``num_experts_per_tok``)
    and ``n_shared_experts`` shared ones, ``num_nextn_predict_layers`` MTP modules. The
    routers' score-correction biases are not counted (as DeepSeek-V3's)."""
    return {
        **_rotary_decoder(c), **_deepseek_moe(c),
        "num_kv_heads": c.need("num_key_value_heads"), "head_dim": c.need("head_dim"),
        "ffn_hidden_size": c.need("intermediate_size"), "vocab_size": c.vocabulary(),
        "qkv_bias": c.flag("attention_bias", False), "qk_norm": c.flag("use_qk_norm", False),
        "mtp_layers": c.whole("num_nextn_predict_layers", 0),
    }


def _gpt_oss_fields(c: _HFConfig) -> dict[str, Any]:
    """GPT-OSS (transformers' GptOssConfig; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model
    Card", Sec. 2.1): rotary, RMSNorm, biases on q, k, v, o, a learned sink logit per head,
    alternating sliding-window (``sliding_window`` 128) and full attention layers
    (``layer_types``), every layer a mixture of ``num_local_experts`` SwiGLU experts of
    ``intermediate_size`` with biases, ``num_experts_per_tok`` per token, a router with a
    bias; untied embeddings."""
    layers = c.need("num_hidden_layers")
    ffn = c.need("intermediate_size")
    return {
        **_rotary_decoder(c),
        "num_kv_heads": c.need("num_key_value_heads"), "head_dim": c.need("head_dim"),
        "ffn_hidden_size": ffn, "moe_ffn_hidden_size": ffn, "vocab_size": c.vocabulary(),
        "num_experts": c.need("num_local_experts"),
        "top_k": c.need("num_experts_per_tok", "experts_per_token"),
        "bias": c.flag("attention_bias", True), "attention_sinks": True,
        "sliding_window": c.whole("sliding_window", 0),
        "global_every": window_pattern(c, layers, 2) if c.cfg.get("sliding_window") else 0,
    }


def _gemma3_fields(c: _HFConfig) -> dict[str, Any]:
    """Gemma 3's language model (transformers' Gemma3TextConfig; Gemma Team 2025, "Gemma 3
    Technical Report", Sec. 2): rotary, RMSNorm before and after the attention and the MLP
    (four a layer), RMSNorm on each head's query and key, a GeGLU MLP, five local layers
    (``sliding_window``) to one global (``sliding_window_pattern`` 6, or ``layer_types``),
    tied embeddings. A multimodal config's ``text_config`` (``gemma3``) is read the same; a
    key it leaves out takes Gemma3TextConfig's default (vocab_size 262208, head_dim 256,
    num_key_value_heads 4, sliding_window 4096)."""
    layers = c.need("num_hidden_layers")
    return {
        **_rotary_decoder(c, tied=True),
        "num_kv_heads": c.whole("num_key_value_heads", 4), "head_dim": c.whole("head_dim", 256),
        "ffn_hidden_size": c.need("intermediate_size"),
        "vocab_size": c.whole("vocab_size", 262_208), "qk_norm": True, "post_norms": True,
        "sliding_window": c.whole("sliding_window", 4096),
        "global_every": window_pattern(c, layers, 6),
    }


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


HF_FAMILIES = {"llama": _decoder_fields, "mistral": _decoder_fields, "qwen2": _decoder_fields,
                "qwen3": _decoder_fields, "mixtral": _decoder_fields,
                "deepseek": _decoder_fields, "qwen3_moe": _decoder_fields,
                "deepseek_v2": _deepseek_mla_fields, "deepseek_v3": _deepseek_mla_fields,
                "kimi_k2": _deepseek_mla_fields, "gpt_oss": _gpt_oss_fields,
                "gemma3": _gemma3_fields, "gemma3_text": _gemma3_fields,
                "llama4": _llama4_fields, "llama4_text": _llama4_fields,
                "glm4_moe": _glm4_moe_fields,
                "gpt2": _gpt2_fields, "bert": _bert_fields, "vit": _vit_fields}


#: Multimodal configs whose language model is planned: model_type -> the key holding its
#: config (the vision encoder and projector are not planned).
MULTIMODAL = {"gemma3": "text_config", "llama4": "text_config"}


def language_config(cfg: dict[str, Any], label: str) -> dict[str, Any] | None:
    """A multimodal config's language model config (``MULTIMODAL``), None for a text one."""
    key = MULTIMODAL.get(str(cfg.get("model_type", "")).lower())
    if key is None or key not in cfg:
        return None
    text = cfg[key]
    if not isinstance(text, dict):
        raise SpecError(f"HF config {label!r}: {key} must be an object, got {text!r:.60}")
    return {"model_type": cfg["model_type"], **text}


def hf_fields(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """Map a Hugging Face config dict onto ModelSpec fields (a multimodal config's
    language model: ``language_config``)."""
    c = _HFConfig(language_config(cfg, label) or cfg, label)
    if c.mtype not in HF_FAMILIES:
        raise SpecError(
            f"HF config {label!r}: model_type {c.mtype!r} is not supported; supported: "
            f"{', '.join(HF_FAMILIES)} (or build ModelSpec(...) directly)")
    return HF_FAMILIES[c.mtype](c)
