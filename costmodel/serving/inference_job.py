"""What is served and how: ``InferenceJob`` (lengths, batch, precisions, latency bounds),
``InferenceConfig`` (tensor/pipeline degrees, replicas, weight precision), the weight and
KV-cache formats, and the checks of a configuration against a model and a cluster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from costmodel.errors import SpecError
from costmodel.hardware import GPU, Cluster
from costmodel.model import ModelSpec
from hardware_profiles.numbers import real

__all__ = ["ELEMENT_BYTES", "KV_PRECISIONS", "MAX_BATCH", "MAX_TOKENS", "OBJECTIVES",
           "WEIGHT_PRECISIONS", "InferenceConfig", "InferenceJob", "compute_dtype",
           "validate_inference", "weight_bytes_per_element"]

#: Weight formats, widest first (the order ties are broken in: the more exact one wins).
WEIGHT_PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
KV_PRECISIONS = ("bf16", "fp16", "fp8")
OBJECTIVES = ("latency", "throughput")
#: Bytes per element of each weight, KV-cache and activation format.
ELEMENT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
# Per group of quantized weights: an fp16 scale, and for asymmetric int4 a packed 4-bit zero
# point (AutoAWQ WQLinear_GEMM / AutoGPTQ QuantLinear layouts).
_GROUP_BYTES = {"int8": 2.0, "int4": 2.5}
# Sanity bounds, far beyond served contexts and batches, so that a typo is an error.
MAX_TOKENS = 2**24
MAX_BATCH = 2**20
#: A latency bound beyond a day is a typo (seconds).
MAX_SECONDS = 86400.0


def weight_bytes_per_element(precision: str, group_size: int = 128) -> float:
    """Bytes one matmul weight takes at ``precision``, its share of group scales included."""
    if precision not in ELEMENT_BYTES:
        raise SpecError(f"weight precision {precision!r} is not one of "
                        f"{', '.join(WEIGHT_PRECISIONS)}")
    return ELEMENT_BYTES[precision] + _GROUP_BYTES.get(precision, 0.0) / group_size


def _positive_int(owner: str, key: str, value: Any, most: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{owner}.{key} must be a positive integer, got {value!r}")
    if value > most:
        raise SpecError(f"{owner}.{key} = {value:,} is beyond any served model (at most "
                        f"{most:,}); check the units")


def _seconds(owner: str, key: str, value: Any) -> None:
    if value is not None:
        real(value, f"{owner}.{key} (seconds)", lo=0.0, lo_open=True, hi=MAX_SECONDS)


@dataclass(frozen=True, kw_only=True)
class InferenceJob:
    """What is served. Lengths in tokens; bounds in seconds.

    ``batch_size``: sequences a replica serves at once; ``None`` lets the search choose (1 for
    the ``latency`` objective). ``weight_precision``: one of ``WEIGHT_PRECISIONS`` or a tuple
    of them for the search to choose from (``int8`` / ``int4`` are weight-only W8A16 / W4A16
    with group-wise scales; ``fp8`` runs fp8 matmuls where the GPU has them and is weight-only
    elsewhere). ``kv_cache_precision``: ``bf16``, ``fp16`` or ``fp8``. ``objective``:
    ``latency`` (the lowest request latency) or ``throughput`` (the most output tokens/s of
    all replicas), either under ``max_ttft_s`` (time to first token) and ``max_tpot_s``
    (time per output token). ``prefill_chunk_tokens``: the most prompt tokens one forward
    pass takes (vLLM ``--max-num-batched-tokens`` with chunked prefill); ``None`` prefills
    the whole batch at once. ``dtype``: activations and 16-bit weights (``bf16`` / ``fp16``).
    """

    prompt_len: int
    output_len: int
    batch_size: int | None = None
    weight_precision: str | tuple[str, ...] = "bf16"
    kv_cache_precision: str = "bf16"
    objective: str = "latency"
    max_ttft_s: float | None = None
    max_tpot_s: float | None = None
    quant_group_size: int = 128
    prefill_chunk_tokens: int | None = None
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        owner = "InferenceJob"
        _positive_int(owner, "prompt_len", self.prompt_len, MAX_TOKENS)
        _positive_int(owner, "output_len", self.output_len, MAX_TOKENS)
        if self.batch_size is not None:
            _positive_int(owner, "batch_size", self.batch_size, MAX_BATCH)
        wp = self.weight_precision
        if isinstance(wp, list | tuple):
            wp = tuple(wp)
            if not wp:
                raise SpecError(f"{owner}.weight_precision is empty; name at least one of "
                                f"{', '.join(WEIGHT_PRECISIONS)}")
            object.__setattr__(self, "weight_precision", wp[0] if len(wp) == 1 else wp)
        for p in self.weight_precisions:
            if p not in WEIGHT_PRECISIONS:
                raise SpecError(f"{owner}.weight_precision {p!r} is not one of "
                                f"{', '.join(WEIGHT_PRECISIONS)}")
        if self.kv_cache_precision not in KV_PRECISIONS:
            raise SpecError(f"{owner}.kv_cache_precision {self.kv_cache_precision!r} is not one "
                            f"of {', '.join(KV_PRECISIONS)}")
        if self.objective not in OBJECTIVES:
            raise SpecError(f"{owner}.objective {self.objective!r} is not one of "
                            f"{', '.join(OBJECTIVES)}")
        if self.dtype not in ("bf16", "fp16"):
            raise SpecError(f"{owner}.dtype {self.dtype!r} is not bf16 or fp16")
        _seconds(owner, "max_ttft_s", self.max_ttft_s)
        _seconds(owner, "max_tpot_s", self.max_tpot_s)
        _positive_int(owner, "quant_group_size", self.quant_group_size, MAX_TOKENS)
        if self.prefill_chunk_tokens is not None:
            _positive_int(owner, "prefill_chunk_tokens", self.prefill_chunk_tokens, MAX_TOKENS)

    @property
    def weight_precisions(self) -> tuple[str, ...]:
        """The weight precisions the search may choose from."""
        wp = self.weight_precision
        return wp if isinstance(wp, tuple) else (wp,)

    @property
    def context_len(self) -> int:
        """Tokens a sequence holds in the KV cache at the end: prompt plus output."""
        return self.prompt_len + self.output_len

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (``kind`` marks it as an inference job)."""
        out = dataclasses.asdict(self)
        if isinstance(self.weight_precision, tuple):
            out["weight_precision"] = list(self.weight_precision)
        return {"kind": "inference", **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InferenceJob:
        """The inverse of ``to_dict``."""
        return cls(**{k: v for k, v in data.items() if k != "kind"})


@dataclass(frozen=True, kw_only=True)
class InferenceConfig:
    """One way to serve: ``tp`` x ``pp`` GPUs per replica, ``replicas`` copies, each serving
    ``batch_size`` sequences at once with weights at ``weight_precision``."""

    tp: int = 1
    pp: int = 1
    replicas: int = 1
    batch_size: int = 1
    weight_precision: str = "bf16"

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "replicas"):
            _positive_int("InferenceConfig", key, getattr(self, key), 2**20)
        _positive_int("InferenceConfig", "batch_size", self.batch_size, MAX_BATCH)
        if self.weight_precision not in WEIGHT_PRECISIONS:
            raise SpecError(f"InferenceConfig.weight_precision {self.weight_precision!r} is "
                            f"not one of {', '.join(WEIGHT_PRECISIONS)}")

    @property
    def world_size(self) -> int:
        """GPUs this configuration occupies: ``tp * pp * replicas``."""
        return self.tp * self.pp * self.replicas

    def describe(self, dtype: str = "bf16") -> str:
        """The configuration in one line; 16-bit weights are named by the job's ``dtype``
        (bf16 or fp16)."""
        weights = dtype if self.weight_precision == "bf16" else self.weight_precision
        return (f"tp={self.tp} pp={self.pp} replicas={self.replicas} batch={self.batch_size} "
                f"{weights}")

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict."""
        return dataclasses.asdict(self)


def validate_inference(model: ModelSpec, cluster: Cluster, job: InferenceJob,
                       cfg: InferenceConfig) -> None:
    """Check ``cfg`` against the model, the cluster and the job; SpecError names the fix."""
    if model.causal is False or model.patch_size or model.num_token_types:
        raise SpecError(f"inference planning covers decoder-only language models; "
                        f"{model.name} is an encoder")
    if cfg.world_size > cluster.num_gpus:
        raise SpecError(f"tp*pp*replicas = {cfg.tp}*{cfg.pp}*{cfg.replicas} = {cfg.world_size} "
                        f"exceeds the cluster's {cluster.num_gpus} GPUs")
    if cfg.tp > cluster.scale_up:
        raise SpecError(f"tp={cfg.tp} exceeds {cluster.domain_words()}; tensor parallel "
                        "stays inside a node or NVLink domain (use pp across them)")
    kv = int(model.num_kv_heads or model.num_heads)
    if model.num_heads % cfg.tp:
        raise SpecError(f"tp={cfg.tp} does not divide num_heads={model.num_heads}")
    if kv % cfg.tp and cfg.tp % kv:
        raise SpecError(f"tp={cfg.tp} must divide num_kv_heads={kv} or be a multiple of it "
                        "(KV heads are split, or replicated when tp exceeds them)")
    ffns = [int(model.ffn_hidden_size or 0)] + ([int(model.moe_ffn_hidden_size or 0)]
                                                 if model.is_moe else [])
    for f in ffns:
        if f % cfg.tp:
            raise SpecError(f"tp={cfg.tp} does not divide the MLP hidden size {f}")
    if cfg.pp > model.num_layers:
        raise SpecError(f"pp={cfg.pp} exceeds the model's {model.num_layers} layers")
    dtype = compute_dtype(cluster.gpu, job, cfg.weight_precision)
    if not cluster.gpu.supports(dtype):
        raise SpecError(f"{cluster.gpu.name} has no {dtype} math in its profile; serve in "
                        "fp16 (InferenceJob dtype='fp16')")
    if job.kv_cache_precision == "bf16" and not cluster.gpu.supports("bf16"):
        raise SpecError(f"{cluster.gpu.name} has no bf16; use kv_cache_precision 'fp16'")


def compute_dtype(gpu: GPU, job: InferenceJob, precision: str) -> str:
    """The matmul dtype: fp8 where the weights are fp8 and the GPU has fp8 tensor cores
    (W8A8, vLLM ``--quantization fp8``), the weights' own for 16-bit weights, else the
    activations' 16-bit type (weight-only kernels dequantize to it, e.g. Marlin)."""
    if precision == "fp8" and gpu.supports("fp8"):
        return "fp8"
    if precision in ("bf16", "fp16"):
        return precision
    return job.dtype
