"""KernelEfficiency: the fractions of a GPU's datasheet that its kernels reach (a profile's
``[efficiency]`` table), and the per-kernel fixed cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hardware_profiles
from costmodel.config import FP4_PRECISIONS, QUANTIZED_PRECISIONS
from costmodel.errors import SpecError
from hardware_profiles.numbers import real

__all__ = ["MAX_KERNEL_OVERHEAD_S", "OPTIONAL_ATTENTION", "KernelEfficiency"]

#: The largest fixed cost of one kernel a profile may give (s;
#: ``hardware_profiles.MAX_KERNEL_OVERHEAD_US``): far beyond any device, so that a unit slip
#: is an error, not a plan.
MAX_KERNEL_OVERHEAD_S = hardware_profiles.MAX_KERNEL_OVERHEAD_US * 1e-6


#: The optional fused-attention fractions of an ``[efficiency]`` table (forward, backward)
#: by kernel, beside ``attention`` / ``attention_backward`` (FlashAttention-2).
OPTIONAL_ATTENTION = hardware_profiles.ATTENTION_FRACTIONS[2:]


@dataclass(frozen=True, kw_only=True)
class KernelEfficiency:
    """How close kernels come to the datasheet, as fractions (the ``[efficiency]`` table).

    ``gemm``: fraction of the dense peak a large matrix multiply sustains (in a shipped
    profile, the best-shape ``torch.matmul`` of ml-engineering's "Maximum Achievable Matmul
    FLOPS" table for every GPU, so that ``planner calibrate``'s in-training ratio carries
    over like for like; a measured profile fits it on its own sweep). ``memory``: fraction
    of HBM bandwidth a memory-bound (elementwise, normalization) kernel sustains.
    ``kernel_overhead_s``: fixed time each kernel adds (launch gap, pipeline fill and drain of
    the tiles), which is what makes small matmuls slow. ``attention`` / ``attention_backward``:
    fraction of the dense peak of a fused (flash) attention kernel, forward and backward
    (FlashAttention-2's in a shipped profile; whatever SDPA ran in a measured one).
    ``attention_cudnn`` / ``attention_cudnn_backward``: the same for the GPU vendor's own fused
    attention that Transformer Engine's FusedAttention calls: cuDNN's on NVIDIA (also SDPA's
    cuDNN backend), AMD's assembly kernels (aiter's "v3", Transformer Engine on ROCm with
    ``NVTE_CK_USES_FWD_V3`` / ``NVTE_CK_USES_BWD_V3``) on Instinct GPUs, where the profile has
    a figure for it; without one it takes the ``attention`` fractions (``attention_for``).
    ``attention_aotriton`` / ``attention_aotriton_backward``: the same for AOTriton, AMD's
    Triton FlashAttention that PyTorch's SDPA runs on ROCm (Instinct GPUs only).
    ``gemm_unaligned``: fraction of the dense peak of a matmul whose inner or output dimension
    is not a multiple of 16 bytes (an odd vocabulary such as GPT-2's 50257): cuBLAS then runs
    it with unaligned (align1/align2) kernels without the tensor-memory accelerator, several
    times slower (``gemm_unaligned_for``). ``comm_slowdown``: seconds of compute lost per
    second of communication that runs beside it (NCCL's kernels occupy SMs, one per channel,
    and share HBM bandwidth with the compute kernels, so overlapped communication is not
    free); fitted by ``planner calibrate``, 0 where nothing is fitted. ``source``: where the
    values come from (a paper, a measurement or ``planner calibrate``).
    """

    gemm: float
    memory: float
    kernel_overhead_s: float
    attention: float
    attention_backward: float
    gemm_fp8: float | None = None
    gemm_fp4: float | None = None
    gemm_unaligned: float | None = None
    comm_slowdown: float = 0.0
    attention_cudnn: float | None = None
    attention_cudnn_backward: float | None = None
    attention_aotriton: float | None = None
    attention_aotriton_backward: float | None = None
    source: str = ""

    def attention_for(self, kernel: str) -> tuple[float, float]:
        """(forward, backward) fractions of the fused attention ``kernel`` (``"flash"``,
        ``"cudnn"`` or ``"aotriton"``, ``costmodel.config.ATTENTION_KERNELS``); a kernel the
        profile has no figure for takes ``"flash"``'s."""
        fwd, bwd = (getattr(self, f"attention_{kernel}", None),
                    getattr(self, f"attention_{kernel}_backward", None))
        if kernel != "flash" and fwd is not None and bwd is not None:
            return fwd, bwd
        return self.attention, self.attention_backward

    def gemm_unaligned_for(self, dtype: str) -> float:
        """The matmul fraction for unaligned shapes: the profile's ``gemm_unaligned``, else
        ``gemm_for(dtype)`` times the ratio measured on an H100 (``[cublas]
        unaligned_gemm_ratio`` in hardware_profiles/software.toml)."""
        if self.gemm_unaligned is not None:
            return self.gemm_unaligned
        ratio = float(hardware_profiles.load_software()["cublas"]["unaligned_gemm_ratio"])
        return self.gemm_for(dtype) * ratio

    def gemm_for(self, dtype: str) -> float:
        """The matmul fraction for ``dtype``: ``gemm_fp4`` for nvfp4 and mxfp4 (the GPU's
        FP4 format) where the profile has a measured one; else ``gemm_fp8`` for the quantized
        precisions (fp8, and fp4 on a GPU without an FP4 measurement, whose profile says its
        fraction is assumed to be fp8's) where it has that; else ``gemm``."""
        if dtype in FP4_PRECISIONS and self.gemm_fp4 is not None:
            return self.gemm_fp4
        if dtype in QUANTIZED_PRECISIONS and self.gemm_fp8 is not None:
            return self.gemm_fp8
        return self.gemm

    def __post_init__(self) -> None:
        optional = ("gemm_fp8", "gemm_fp4", "gemm_unaligned", *OPTIONAL_ATTENTION)
        for key in ("gemm", "memory", "attention", "attention_backward", *optional):
            v = getattr(self, key)
            if v is None and key in optional:
                continue
            object.__setattr__(self, key, real(v, f"efficiency.{key}", lo=0.0, hi=1.0,
                                               lo_open=True))
        for k in OPTIONAL_ATTENTION[::2]:
            if (getattr(self, k) is None) != (getattr(self, f"{k}_backward") is None):
                raise SpecError(f"efficiency: give {k} and {k}_backward together (the "
                                "kernel's forward and backward fractions), or neither")
        object.__setattr__(self, "comm_slowdown", real(self.comm_slowdown,
                                                       "efficiency.comm_slowdown", lo=0.0,
                                                       hi=1.0))
        object.__setattr__(self, "kernel_overhead_s", real(
            self.kernel_overhead_s, "efficiency.kernel_overhead_s", lo=0.0,
            hi=MAX_KERNEL_OVERHEAD_S))

    @classmethod
    def from_profile(cls, data: dict[str, Any], where: str) -> KernelEfficiency:
        """Build from an ``[efficiency]`` table (``kernel_overhead_us`` in microseconds);
        every value a number (``real``), not a string."""
        if not isinstance(data, dict):
            raise SpecError(f"{where}: efficiency must be a table of fractions, got "
                            f"{str(data)[:60]!r}")
        try:
            return cls(
                **{k: data[k] for k in ("gemm", "memory", "attention", "attention_backward")},
                kernel_overhead_s=real(data["kernel_overhead_us"],
                                       "efficiency.kernel_overhead_us", lo=0.0,
                                       hi=MAX_KERNEL_OVERHEAD_S * 1e6) * 1e-6,
                gemm_fp8=data.get("gemm_fp8"), gemm_fp4=data.get("gemm_fp4"),
                gemm_unaligned=data.get("gemm_unaligned"),
                **{k: data[k] for k in OPTIONAL_ATTENTION if k in data},
                comm_slowdown=data.get("comm_slowdown", 0.0),
                source=str(data.get("source", "")),
            )
        except KeyError as e:
            raise SpecError(f"{where}: the [efficiency] table lacks the key {e.args[0]!r}; "
                            "see hardware_profiles/gpus/a100-80gb.toml") from None
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
