"""float8 matmul throughput by scaling recipe on one GPU, against bf16, on a model's shapes.

Times ``torch._scaled_mm`` (the kernel torchao's Float8Linear calls) with one scale per
tensor (torchao's "tensorwise" recipe) and with one scale per row of the left operand and per
column of the right one ("rowwise"), and ``torch.mm`` in bf16, on the forward,
input-gradient and weight-gradient shapes of Llama 3 8B's and 70B's linears (Dubey et al.
2024, Table 3) at 8192 tokens, unsplit and split 8 ways by tensor parallelism. Prints
TFLOP/s per shape and the harmonic mean per recipe: what a float8 step gains per GEMM.

    python benchmarks/fp8_gemm.py --save fp8.json        # on a Hopper GPU, under a minute
    python benchmarks/fp8_gemm.py --rows benchmarks/data/fp8-gemm-h200-2026-11-27.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from functools import partial

import torch

# (name, hidden, ffn, q width, kv width) of Llama 3 8B and 70B.
MODELS = [("llama3-8b", 4096, 14336, 4096, 1024), ("llama3-70b", 8192, 28672, 8192, 1024)]


def shapes(tokens: int = 8192) -> list[tuple[str, int, int, int]]:
    """(label, M, K, N) of every linear's three matmuls, unsplit and at tp 8."""
    out = []
    for name, h, f, q, kv in MODELS:
        for tp in (1, 8):
            for lin, k, n in (("qkv", h, (q + 2 * kv) // tp), ("o", q // tp, h),
                              ("up", h, 2 * f // tp), ("down", f // tp, h)):
                out.append((f"{name} tp{tp} {lin} fwd", tokens, k, n))
                out.append((f"{name} tp{tp} {lin} dgrad", tokens, n, k))
                out.append((f"{name} tp{tp} {lin} wgrad", n, tokens, k))
    return out


def _time(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure() -> list[dict]:
    rows = []
    f8 = torch.float8_e4m3fn
    for label, m, k, n in shapes():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8, b8 = a.to(f8), b.to(f8)
        bt = b8.t()  # column-major right operand, as _scaled_mm needs
        one = torch.ones((), device="cuda")
        sa, sb = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        row = {"shape": label, "m": m, "k": k, "n": n}
        flops = 2.0 * m * k * n
        row["bf16_s"] = _time(partial(torch.mm, a, b.t()))
        row["tensorwise_s"] = _time(partial(torch._scaled_mm, a8, bt, one, one,
                                            out_dtype=torch.bfloat16))
        try:
            row["rowwise_s"] = _time(partial(torch._scaled_mm, a8, bt, sa, sb,
                                             out_dtype=torch.bfloat16))
        except RuntimeError as e:
            print(f"{label}: rowwise failed: {e}", file=sys.stderr)
        row["flops"] = flops
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def report(saved: dict) -> None:
    print(f"{saved['device']}, torch {saved['torch']}, {saved['date']}")
    print(f"{'shape':<30s} {'bf16':>7s} {'tensorw':>8s} {'roww':>7s}  TFLOP/s")
    hm: dict[str, list[float]] = {"bf16": [], "tensorwise": [], "rowwise": []}
    for r in saved["rows"]:
        tf = {kind: r["flops"] / r[f"{kind}_s"] / 1e12 for kind in hm if f"{kind}_s" in r}
        for kind, v in tf.items():
            hm[kind].append(v)
        print(f"{r['shape']:<30s} {tf['bf16']:7.0f} {tf['tensorwise']:8.0f} "
              f"{tf.get('rowwise', float('nan')):7.0f}")
    means = {k: statistics.harmonic_mean(v) for k, v in hm.items() if v}
    print("harmonic mean: " + ", ".join(f"{k} {v:.0f}" for k, v in means.items()))
    if "rowwise" in means:
        print(f"rowwise / tensorwise {means['rowwise'] / means['tensorwise']:.3f}; "
              f"tensorwise / bf16 {means['tensorwise'] / means['bf16']:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save", help="write the measurements to this JSON file")
    p.add_argument("--rows", help="print measurements saved with --save")
    args = p.parse_args()
    if args.rows:
        with open(args.rows) as f:
            report(json.load(f))
        return 0
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU with float8 matmuls (Hopper or later); --rows reads saved ones")
    saved = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
             "date": datetime.date.today().isoformat(), "rows": measure()}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
    report(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
