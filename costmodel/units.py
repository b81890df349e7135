"""Units and the one rule every room shares about element sizes.

Profiles hold human units (GB/s, TFLOP/s, GiB); the cost model works in bytes, bytes/s,
FLOP/s and seconds. GB is decimal (1e9, bandwidths and datasheet memory), GiB binary (1024**3,
what ``torch.cuda.memory_allocated`` and ``nvidia-smi`` report).
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

__all__ = ["GB", "GIB", "MIB", "TFLOPS", "UNITS", "Num", "compute_bytes", "count", "plural"]

#: A quantity the vectorized cost functions take: an array over the rows of a table of
#: configurations, or one number for all of them (numpy broadcasts either).
Num: TypeAlias = np.ndarray | float

#: Bytes in a binary gibibyte and mebibyte.
GIB = 1024**3
MIB = 1024**2
#: Bytes in a decimal gigabyte.
GB = 1e9
#: FLOP/s in one TFLOP/s.
TFLOPS = 1e12
#: Memory units a published figure may be stated in, in bytes.
UNITS = {"GB": GB, "GiB": GIB}


def compute_bytes(precision: str) -> float:
    """Bytes per element of what the matmuls read and write in a job of ``precision``: the
    activations, and the parameters as gathered for compute (ZeRO-3/FSDP). 4 in fp32; 2 in
    every mixed precision, fp8 included, whose activations between the matmuls stay bf16
    (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 4)."""
    return 4.0 if precision == "fp32" else 2.0


def count(n: float, what: str = "parameters") -> str:
    """``n`` things in the unit people read: ``8.03B parameters``, ``125.2M parameters``,
    ``12.3K parameters``, ``512 parameters`` (a tiny model is not "0.00B")."""
    for scale, suffix, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{suffix} {what}"
    return f"{n:.0f} {what}"


def plural(n: int, word: str, words: str | None = None) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1 (``words``: an irregular plural;
    default ``word`` + ``es`` after ``ch``/``s``/``x``, else + ``s``)."""
    if n == 1:
        return f"{n} {word}"
    return f"{n:,} {words or word + ('es' if word.endswith(('ch', 's', 'x')) else 's')}"
