"""Real training steps of small GPTs on one device against the estimate with a profile.

Trains GPT-3-style models (Brown et al. 2020, Table 2.1: 125M, 350M, 760M and 1.3B on a GPU;
tiny ones on a CPU) with the project's runtime, as ``planner run`` would: the reference
transformer through ``planner.apply`` on a one-device plan (bf16 autocast, fp32 weights, AdamW,
flash attention through SDPA), micro-batches 1 to 8, recompute none or full. Each case prints
the measured step time (median of the timed steps after warm-up) and peak memory next to the
estimate on the profile given with ``--profile`` (measured by ``planner profile``) or the
shipped one.

Peak memory is ``torch.cuda.max_memory_allocated`` (the tensors torch holds), compared with
the estimate's total less its ``overhead`` term (CUDA context and cuBLAS workspace, which live
outside torch's allocator). On a CPU only the step time is compared.

    python benchmarks/single_gpu_accuracy.py --profile h100-sxm-2026-11-22.toml
    python benchmarks/single_gpu_accuracy.py --device cpu --profile cpu.toml --quick

Targets (issue 11): step time within 10 % and peak memory within 5 % on the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.hardware import GPU
from planner.plan import Plan
from planner.runtime.apply import apply
from planner.runtime.model import build_model
from planner.runtime.train import synthetic_batch


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    model: str
    seq_len: int
    micro_batch: int
    recompute: str


def _tiny(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    """A small GPT (LayerNorm, learned positions, GELU MLP, tied embeddings) for CPU runs."""
    base = ModelSpec.preset("gpt3-125m")
    return ModelSpec(**{**base.to_dict(), "name": name, "num_layers": layers,
                        "hidden_size": hidden, "num_heads": heads, "num_kv_heads": heads,
                        "ffn_hidden_size": 4 * hidden, "vocab_size": 8192,
                        "max_position_embeddings": 1024})


TINY = {"gpt-tiny-2l": _tiny("gpt-tiny-2l", 2, 256, 4),
        "gpt-tiny-4l": _tiny("gpt-tiny-4l", 4, 512, 8)}


def cases(device: str, quick: bool) -> list[Case]:
    """The grid: models x micro-batches x recompute (a corner of it with ``quick``)."""
    if device == "cuda":
        models, seq, mbs = ["gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b"], 2048, \
            [1, 2, 4, 8]
        if quick:
            models, mbs = ["gpt3-125m", "gpt3-350m"], [1, 4]
    else:
        models, seq, mbs = list(TINY), 256, [1, 2, 4]
        if quick:
            models, mbs = ["gpt-tiny-2l"], [1, 2]
    return [Case(m, seq, b, r) for m in models for b in mbs for r in ("none", "full")]


def _model(name: str) -> ModelSpec:
    if name in TINY:
        return TINY[name]
    if name == "gpt3-1.3b":  # Brown et al. 2020, Table 2.1: 24 layers, 2048 wide, 16 heads
        base = ModelSpec.preset("gpt3-760m")
        return ModelSpec(**{**base.to_dict(), "name": name, "hidden_size": 2048,
                            "num_heads": 16, "num_kv_heads": 16, "ffn_hidden_size": 8192})
    return ModelSpec.preset(name)


def measure(case: Case, gpu: GPU, device: str, steps: int, warmup: int) -> dict[str, float]:
    """Train ``case`` for ``warmup + steps`` steps; the estimate and what was measured."""
    model = _model(case.model)
    cluster = Cluster(gpu=gpu, num_nodes=1, gpus_per_node=1)
    job = Job(global_batch_size=case.micro_batch, seq_len=case.seq_len, precision="bf16",
              optimizer="adamw", framework="torchtitan")
    cfg = ParallelConfig(dp=1, micro_batch_size=case.micro_batch, recompute=case.recompute)
    est = estimate(model, cluster, job, cfg)
    plan = Plan(model=model, cluster=cluster, job=job, config=cfg, estimate=est)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run = apply(plan, build_model(model, device="meta"), device=device)
    opt = run.optimizer(lr=1e-4)
    times = []
    for step in range(warmup + steps):
        x, y = synthetic_batch(job, model.vocab_size, step)
        x, y = x.to(device), y.to(device)
        sync()
        t0 = time.perf_counter()
        run.step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    out = {"step_s": statistics.median(times), "estimate_s": float(est.step_time_s)}
    if device == "cuda":
        out["peak_bytes"] = float(torch.cuda.max_memory_allocated())
        out["estimate_bytes"] = float(est.peak_memory_bytes) - est.memory.overhead_bytes
    del run, opt
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--profile", help="a profile from 'planner profile' (default: the shipped "
                   "datasheet profile of --gpu)")
    p.add_argument("--gpu", default="h100-sxm", help="shipped GPU profile without --profile")
    p.add_argument("--steps", type=int, default=5, help="timed steps per case")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--quick", action="store_true", help="a corner of the grid")
    p.add_argument("--json", action="store_true", help="rows as JSON")
    args = p.parse_args()
    gpu = GPU.from_file(args.profile) if args.profile else GPU.preset(args.gpu)
    rows = []
    print(f"{'case':<34s} {'step (ms)':>10s} {'est (ms)':>10s} {'error':>7s} "
          f"{'peak GiB':>9s} {'est GiB':>8s} {'error':>7s}", file=sys.stderr)
    for case in cases(args.device, args.quick):
        try:
            r = measure(case, gpu, args.device, args.steps, args.warmup)
        except torch.OutOfMemoryError:
            print(f"{case.model} mbs={case.micro_batch} {case.recompute}: out of memory",
                  file=sys.stderr)
            continue
        err = r["estimate_s"] / r["step_s"] - 1
        row = {**case.__dict__, **r, "step_error": err}
        mem = ""
        if "peak_bytes" in r:
            row["memory_error"] = r["estimate_bytes"] / r["peak_bytes"] - 1
            mem = (f"{r['peak_bytes'] / 2**30:>9.2f} {r['estimate_bytes'] / 2**30:>8.2f} "
                   f"{100 * row['memory_error']:>+6.1f}%")
        rows.append(row)
        name = f"{case.model} s={case.seq_len} mbs={case.micro_batch} rc={case.recompute}"
        print(f"{name:<34s} {1e3 * r['step_s']:>10.1f} {1e3 * r['estimate_s']:>10.1f} "
              f"{100 * err:>+6.1f}% {mem}", file=sys.stderr)
    if not rows:
        return 1
    step_err = [abs(r["step_error"]) for r in rows]
    print(f"\nstep time: mean |error| {100 * statistics.mean(step_err):.1f}%, max "
          f"{100 * max(step_err):.1f}% over {len(rows)} cases", file=sys.stderr)
    mem_err = [abs(r["memory_error"]) for r in rows if "memory_error" in r]
    if mem_err:
        print(f"peak memory: mean |error| {100 * statistics.mean(mem_err):.1f}%, max "
              f"{100 * max(mem_err):.1f}%", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
