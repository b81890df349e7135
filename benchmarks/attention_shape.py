"""Fit the fixed work of a fused attention kernel per query block to measured sweeps.

``costmodel.formulas.compute.flash_attention_time`` prices a causal fused attention over ``s`` keys
per
query as ``passes * flops * (1 + fixed_keys / s) / (peak * fraction) + kernel_overhead``: the
work grows with ``s`` but each query block also pays a fixed amount (its diagonal block,
loading the block and its softmax statistics, writing the output; in backward also the row
sums of dO.O and the dQ accumulation), so short sequences run far below the kernel's peak
rate. A head dimension under 128 runs each score's softmax work over fewer matmul FLOPs, so
the kernel's rate falls as ``(head_dim / 128) ** exponent``. This script fits ``fixed_keys``
(forward and backward) and the fractions to the SDPA sweeps that ``planner profile`` stored
in ``hardware_profiles/measured/*.toml`` (each with its own kernel overhead), per GPU and head
dimension, and jointly (one ``fixed_keys`` and one head-dimension exponent per pass, a
head-dim-128 fraction per GPU), and prints the values that ``hardware_profiles/software.toml
[fused_attention]`` carries.

    python benchmarks/attention_shape.py
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from costmodel.formulas.roofline import FLASH_BACKWARD_FLOPS
from costmodel.hardware import GPU

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted((ROOT / "hardware_profiles" / "measured").glob("*.toml"))


def _sweeps() -> list[tuple[str, int, str, np.ndarray, np.ndarray, np.ndarray, float, float]]:
    """(GPU, head dim, pass, keys, FLOPs of the pass, seconds, bf16 peak, kernel overhead)."""
    out = []
    for path in PROFILES:
        data = tomllib.loads(path.read_text())
        points = data.get("measured", {}).get("attention", [])
        if not points:
            continue
        gpu = GPU.from_file(path)
        peak = gpu.peak_flops("bf16")
        # The fit's own overhead: the profile's [efficiency] value before any transfer.
        overhead = float(data["efficiency"]["kernel_overhead_us"]) * 1e-6
        for hd in sorted({int(p["head_dim"]) for p in points}):
            pts = [p for p in points if int(p["head_dim"]) == hd]
            keys = np.array([float(p["seq_len"]) for p in pts])
            # Causal: half of 4 b h s^2 d (Dao 2023), the convention of the cost model.
            flops = np.array([2.0 * p["batch"] * p["heads"] * p["seq_len"] ** 2 * hd
                              for p in pts])
            for name, mult, key in (("forward", 1.0, "forward_s"),
                                    ("backward", FLASH_BACKWARD_FLOPS, "backward_s")):
                sec = np.array([float(p[key]) for p in pts])
                out.append((path.stem, hd, name, keys, mult * flops, sec, peak, overhead))
    return out


def _model(x_frac: float, fixed: float, keys: np.ndarray, flops: np.ndarray, peak: float,
           overhead: float) -> np.ndarray:
    return flops * (1.0 + fixed / keys) / (peak * x_frac) + overhead


def main() -> None:
    sweeps = _sweeps()
    if not sweeps:
        raise SystemExit("no measured attention sweep in hardware_profiles/measured/")
    print(f"{'profile':24s} {'hd':>4s} {'pass':9s} {'fraction':>8s} {'fixed keys':>10s} "
          f"{'max err':>8s}")
    for gpu, hd, name, keys, flops, sec, peak, ovh in sweeps:
        def one(x: np.ndarray, keys: np.ndarray = keys, flops: np.ndarray = flops,
                sec: np.ndarray = sec, peak: float = peak, ovh: float = ovh) -> np.ndarray:
            return np.log(_model(x[0], x[1], keys, flops, peak, ovh) / sec)

        fit = least_squares(one, [0.5, 300.0], bounds=([0.01, 0.0], [1.0, 1e4]))
        print(f"{gpu:24s} {hd:4d} {name:9s} {fit.x[0]:8.3f} {fit.x[1]:10.0f} "
              f"{np.abs(np.expm1(fit.fun)).max():8.1%}")
    for name in ("forward", "backward"):
        mine = [s for s in sweeps if s[2] == name]
        gpus = sorted({s[0] for s in mine})

        def resid(x: np.ndarray, mine: list = mine, gpus: list = gpus) -> np.ndarray:
            return np.concatenate([
                np.log(_model(x[2 + gpus.index(gpu)] * (min(hd, 128) / 128) ** x[1], x[0],
                              keys, flops, peak, ovh) / sec)
                for gpu, hd, _, keys, flops, sec, peak, ovh in mine])

        n = len(gpus)
        fit = least_squares(resid, [300.0, 0.5] + [0.5] * n,
                            bounds=([0.0, 0.0] + [0.01] * n, [1e4, 2.0] + [1.0] * n))
        print(f"joint {name}: fixed_keys = {fit.x[0]:.0f}, head_dim_exponent = {fit.x[1]:.3f} "
              f"(mean |error| {np.abs(np.expm1(fit.fun)).mean():.1%}, "
              f"max {np.abs(np.expm1(fit.fun)).max():.1%})")


if __name__ == "__main__":
    main()
