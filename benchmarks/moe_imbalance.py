"""The busiest expert-parallel rank's load under a trained router, from published runs that
measured the same job with forced even routing and with the real (dropless) router.

    python benchmarks/moe_imbalance.py

NVIDIA's Megatron-MoE-ModelZoo trained Qwen3-235B-A22B on 256 H100s (TP4 PP8 VPP4 EP8,
DeepEP, bf16, 16K-128K tokens with CP 1-8) both ways and published model TFLOP/s of each
(yanring/Megatron-MoE-ModelZoo@e8650517d60d71ab73fc6b3b0388cac4ba435181:
best_practice/qwen3/readme.md, "Long Context": 295 / 237, 335 / 277, 368 / 320, 389 / 357).
The FLOPs are the same, so the TFLOP/s ratio is the step-time ratio. For each row this finds
the load ``f`` (``Job.moe_load_imbalance``) whose estimate is that much slower than the
estimate at 1.0, and prints their mean: the ``[moe] load_imbalance`` default in
hardware_profiles/software.toml. The slowdown shrinks with sequence length as attention's
share of the step grows; one ``f`` that fits all four rows says the model attributes the
slowdown to the experts and the all-to-all, where it belongs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scipy.optimize import brentq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate  # noqa: E402
from costmodel.config import accounted_split  # noqa: E402

SOURCE = ("yanring/Megatron-MoE-ModelZoo@e8650517d60d71ab73fc6b3b0388cac4ba435181:"
          "best_practice/qwen3/readme.md")
#: (sequence length, context-parallel degree, TFLOP/s forced even, TFLOP/s dropless).
ROWS = ((16384, 1, 295.0, 237.0), (32768, 2, 335.0, 277.0), (65536, 4, 368.0, 320.0),
        (131072, 8, 389.0, 357.0))


def step(seq: int, cp: int, load: float) -> float:
    """The estimated step time (s) of the ModelZoo row at ``seq`` tokens with ``load``."""
    model = ModelSpec.preset("qwen3-235b-a22b")
    cluster = Cluster.preset("dgx-h100", num_nodes=32)
    job = Job(global_batch_size=256, seq_len=seq, framework="megatron",
              moe_dispatcher="deepep", moe_load_imbalance=load)
    cfg = ParallelConfig(dp=8 // cp, tp=4, pp=8, cp=cp, ep=8, zero_stage=1,
                         sequence_parallel=True, virtual_pipeline_stages=4,
                         recompute="selective",
                         # 94 layers and the embedding and loss over 8 x 4 chunks
                         # (Megatron-LM's accounted split, as the ModelZoo scripts run it).
                         stage_layers=accounted_split(model.num_layers, 8, 4))
    t = estimate(model, cluster, job, cfg).step_time_s
    assert t is not None
    return t


def fitted_loads() -> list[tuple[int, float, float]]:
    """(sequence length, measured slowdown, the load that gives it) per row."""
    out = []
    for seq, cp, even, real in ROWS:
        slow = even / real
        base = step(seq, cp, 1.0)
        f = brentq(lambda x, s=seq, c=cp, b=base, w=slow: step(s, c, x) / b - w, 1.0, 4.0,
                   xtol=1e-4)
        out.append((seq, slow, float(f)))
    return out


def main() -> int:
    print(f"source: {SOURCE}")
    print(f"{'tokens':>8s} {'dropless slowdown':>18s} {'busiest rank load':>18s}")
    loads = fitted_loads()
    for seq, slow, f in loads:
        print(f"{seq:>8d} {slow:>18.3f} {f:>18.3f}")
    mean = sum(f for *_, f in loads) / len(loads)
    spread = max(f for *_, f in loads) - min(f for *_, f in loads)
    print(f"mean load {mean:.3f} (spread {spread:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
