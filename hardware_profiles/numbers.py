"""The one check of a number read from a file or given through the API: a real, finite
number in its physical range, or a ``SpecError`` that names it.

``NaN`` compares false with everything, so a bare ``x <= 0`` check lets it through, and an
infinite capacity or bandwidth makes every configuration fit or every transfer free: each
float a profile, plan or job holds is checked here instead.
"""

from __future__ import annotations

import math
import numbers

from hardware_profiles.errors import SpecError

__all__ = ["real"]


def _interval(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """``[lo, hi]`` in interval notation (``(`` / ``)`` for an open or missing bound)."""
    left = "(-inf" if lo is None else f"{'(' if lo_open else '['}{lo:g}"
    right = "inf)" if hi is None else f"{hi:g}{')' if hi_open else ']'}"
    return f"{left}, {right}"


def real(value: object, what: str, *, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float if it is a real number (an int, a float or a numpy number, not a
    bool or a string), finite, and in ``[lo, hi]`` (``lo_open`` / ``hi_open``: the bound
    itself excluded; ``None``: no bound); else a ``SpecError`` naming ``what`` (e.g.
    ``"GPU 'h100-sxm': efficiency.gemm"``), the range and the value."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    x = float(value) if ok else math.nan  # type: ignore[arg-type]
    if ok and math.isfinite(x):
        ok = ((lo is None or (x > lo if lo_open else x >= lo))
              and (hi is None or (x < hi if hi_open else x <= hi)))
    else:
        ok = False
    if not ok:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
        raise SpecError(f"{what} must be a finite number in "
                        f"{_interval(lo, hi, lo_open, hi_open)}, got {shown}")
    return x
