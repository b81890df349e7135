"""Real training steps of small GPTs on one device against the estimate with a profile.

Trains GPT-3-style models (Brown et al. 2020, Table 2.1: 125M, 350M, 760M and 1.3B on a GPU;
tiny ones on a CPU) with the project's runtime, as ``planner run`` would: the reference
transformer through ``planner.apply`` on a one-device plan (bf16 autocast, fp32 weights, AdamW,
flash attention through SDPA), micro-batches 1 to 8, recompute none or full. Each case prints
the measured step time (median of the timed steps after warm-up) and peak memory next to the
estimate on the profile given with ``--profile`` (measured by ``planner profile``) or the
shipped one.

Each step clips the gradient norm as torchtitan does; Adam is torch's fused kernel (as
``planner.apply`` builds it on a GPU). Peak memory is ``torch.cuda.max_memory_allocated`` (the
tensors torch holds, less what was allocated before the case), compared with
the estimate's total less its ``overhead`` term (CUDA context and cuBLAS workspace, which live
outside torch's allocator). On a CPU only the step time is compared.

    python benchmarks/single_gpu_accuracy.py --profile h100-sxm-2026-11-22.toml
    python benchmarks/single_gpu_accuracy.py --device cpu --profile cpu.toml --quick

``--save FILE`` writes the measured rows (with the device, torch version and date);
``--rows FILE`` re-estimates saved rows on this machine, no GPU needed, e.g. the H100 steps
measured on 2026-11-22 against the shipped or a measured profile:

    python benchmarks/single_gpu_accuracy.py --rows benchmarks/data/h100-sxm-steps-2026-11-22.json

``--zero-stage 3`` runs the same plans through FSDP2 (``fully_shard`` on a world of one, NCCL)
instead of DDP; ``--models``, ``--micro-batches``, ``--recompute`` and ``--seq-len`` pick
other grids (``llama-3-8b-4l`` is Llama 3 8B cut to four layers, at full width).

Targets (issue 11): step time within 10 % and peak memory within 5 % on the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import torch

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.hardware import GPU
from planner.result import Plan
from planner.runtime.apply import apply
from planner.runtime.model import build_model
from planner.runtime.modules import synthetic_batch


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    model: str
    seq_len: int
    micro_batch: int
    recompute: str
    zero_stage: int = 0
    offload: str = "none"


def _tiny(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    """A small GPT (LayerNorm, learned positions, GELU MLP, tied embeddings) for CPU runs."""
    base = ModelSpec.preset("gpt3-125m")
    return ModelSpec(**{**base.to_dict(), "name": name, "num_layers": layers,
                        "hidden_size": hidden, "num_heads": heads, "num_kv_heads": heads,
                        "ffn_hidden_size": 4 * hidden, "vocab_size": 8192,
                        "max_position_embeddings": 1024})


TINY = {"gpt-tiny-2l": _tiny("gpt-tiny-2l", 2, 256, 4),
        "gpt-tiny-4l": _tiny("gpt-tiny-4l", 4, 512, 8)}


def cases(device: str, quick: bool, models: list[str] | None = None,
          micro_batches: list[int] | None = None, recompute: list[str] | None = None,
          seq_len: int | None = None, zero_stage: int = 0, offload: str = "none"
          ) -> list[Case]:
    """The grid: models x micro-batches x recompute (a corner of it with ``quick``); the
    given lists replace the default axes."""
    if device == "cuda":
        names, seq, mbs = ["gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b"], 2048, \
            [1, 2, 4, 8]
        if quick:
            names, mbs = ["gpt3-125m", "gpt3-350m"], [1, 4]
    else:
        names, seq, mbs = list(TINY), 256, [1, 2, 4]
        if quick:
            names, mbs = ["gpt-tiny-2l"], [1, 2]
    names, mbs = models or names, micro_batches or mbs
    return [Case(m, seq_len or seq, b, r, zero_stage, offload) for m in names for b in mbs
            for r in (recompute or ["none", "full"])]


def _model(name: str) -> ModelSpec:
    """A preset, a tiny GPT, GPT-3 1.3B, or ``<preset>-<n>l``: a preset cut to n layers."""
    if name in TINY:
        return TINY[name]
    if name == "gpt3-1.3b":  # Brown et al. 2020, Table 2.1: 24 layers, 2048 wide, 16 heads
        base = ModelSpec.preset("gpt3-760m")
        return ModelSpec(**{**base.to_dict(), "name": name, "hidden_size": 2048,
                            "num_heads": 16, "num_kv_heads": 16, "ffn_hidden_size": 8192})
    base_name, _, layers = name.rpartition("-")
    if base_name and layers.endswith("l") and layers[:-1].isdigit():
        base = ModelSpec.preset(base_name)
        return ModelSpec(**{**base.to_dict(), "name": name, "num_layers": int(layers[:-1])})
    return ModelSpec.preset(name)


def _plan(case: Case, gpu: GPU) -> Plan:
    """The one-device plan of ``case`` and its estimate on ``gpu``."""
    model = _model(case.model)
    cluster = Cluster(gpu=gpu, num_nodes=1, gpus_per_node=1)
    job = Job(global_batch_size=case.micro_batch, seq_len=case.seq_len, precision="bf16",
              optimizer="adamw", framework="torchtitan")
    cfg = ParallelConfig(dp=1, micro_batch_size=case.micro_batch, recompute=case.recompute,
                         zero_stage=case.zero_stage, offload=case.offload)
    return Plan(model=model, cluster=cluster, job=job, config=cfg,
                estimate=estimate(model, cluster, job, cfg))


def _estimates(plan: Plan) -> dict[str, float]:
    est = plan.estimate
    return {"estimate_s": float(est.step_time_s),
            "estimate_bytes": float(est.peak_memory_bytes) - est.memory.overhead_bytes}


def measure(case: Case, gpu: GPU, device: str, steps: int, warmup: int) -> dict[str, float]:
    """Train ``case`` for ``warmup + steps`` steps; the estimate and what was measured."""
    plan = _plan(case, gpu)
    model, job = plan.model, plan.job
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    base = 0
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    run = apply(plan, build_model(model, device="meta"), device=device)
    opt = run.optimizer(lr=1e-4)
    params = run.parameters()
    times = []
    for step in range(warmup + steps):
        x, y = synthetic_batch(job, model.vocab_size, step)
        x, y = x.to(device), y.to(device)
        sync()
        t0 = time.perf_counter()
        run.step(x, y)
        # torchtitan clips the gradient norm every step (max_norm 1.0), as the estimate's
        # optimizer step counts.
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    out = {"step_s": statistics.median(times), "steps_s": times, **_estimates(plan)}
    if device == "cuda":
        out["peak_bytes"] = float(torch.cuda.max_memory_allocated() - base)
    else:
        del out["estimate_bytes"]
    return out


def _measure_or_none(case: Case, gpu: GPU, device: str, steps: int, warmup: int
                     ) -> dict[str, float] | None:
    try:
        return measure(case, gpu, device, steps, warmup)
    except torch.OutOfMemoryError:
        return None


def _isolated(case: Case, gpu: GPU, device: str, steps: int, warmup: int
              ) -> dict[str, float] | None:
    """``measure`` in a fresh process (``None`` when it runs out of memory): a previous case's
    model can outlive it in torch.distributed's and the allocator's state and be freed in the
    middle of the next one, which then reads a peak too low (seen on the H100: 4.5 GiB)."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_measure_or_none, case, gpu, device, steps, warmup).result()


def _print_row(case: Case, row: dict) -> None:
    err = row["estimate_s"] / row["step_s"] - 1
    row["step_error"] = err
    mem = ""
    if "peak_bytes" in row:
        row["memory_error"] = row["estimate_bytes"] / row["peak_bytes"] - 1
        mem = (f"{row['peak_bytes'] / 2**30:>9.2f} {row['estimate_bytes'] / 2**30:>8.2f} "
               f"{100 * row['memory_error']:>+6.1f}%")
    zero = f" z{case.zero_stage}" if case.zero_stage else ""
    zero += " offload" if case.offload != "none" else ""
    name = f"{case.model} s={case.seq_len} mbs={case.micro_batch} rc={case.recompute}{zero}"
    print(f"{name:<40s} {1e3 * row['step_s']:>10.1f} {1e3 * row['estimate_s']:>10.1f} "
          f"{100 * err:>+6.1f}% {mem}", file=sys.stderr)


def _summary(rows: list[dict]) -> None:
    step_err = [abs(r["step_error"]) for r in rows]
    print(f"\nstep time: mean |error| {100 * statistics.mean(step_err):.1f}%, max "
          f"{100 * max(step_err):.1f}% over {len(rows)} cases", file=sys.stderr)
    mem_err = [abs(r["memory_error"]) for r in rows if "memory_error" in r]
    if mem_err:
        print(f"peak memory: mean |error| {100 * statistics.mean(mem_err):.1f}%, max "
              f"{100 * max(mem_err):.1f}%", file=sys.stderr)


def reestimate(path: str, gpu: GPU) -> list[dict]:
    """The rows saved by ``--save`` in ``path``, their estimates made again on ``gpu``."""
    with open(path) as f:
        saved = json.load(f)
    rows = []
    for r in saved["rows"]:
        case = Case(**{k: r[k] for k in Case.__dataclass_fields__ if k in r})
        row = {**asdict(case), "step_s": r["step_s"], **_estimates(_plan(case, gpu))}
        if "peak_bytes" in r:
            row["peak_bytes"] = r["peak_bytes"]
        else:
            del row["estimate_bytes"]
        rows.append(row)
    return rows


def _save(args: argparse.Namespace, rows: list[dict]) -> None:
    """Write ``rows`` with the device, torch version and date to ``args.save``."""
    device = (torch.cuda.get_device_name(0) if args.device == "cuda"
              else platform.processor() or platform.machine())
    with open(args.save, "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                   "date": datetime.date.today().isoformat(), "steps": args.steps,
                   "warmup": args.warmup,
                   "note": "step_s: median of the timed steps; peak_bytes: "
                           "torch.cuda.max_memory_allocated, each case in a fresh process",
                   "rows": rows}, f, indent=1)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _names(text: str) -> list[str]:
    return text.split(",")


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
    p.add_argument("--models", type=_names, help="comma-separated model names")
    p.add_argument("--micro-batches", type=_ints, help="comma-separated micro-batch sizes")
    p.add_argument("--recompute", type=_names, help="comma-separated: none, selective, full")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 2048)")
    p.add_argument("--zero-stage", type=int, default=0, choices=(0, 3),
                   help="0: DDP; 3: FSDP2 fully_shard (world of one)")
    p.add_argument("--offload", default="none", choices=("none", "optimizer+params"),
                   help="optimizer+params: FSDP2's CPUOffloadPolicy (with --zero-stage 3)")
    p.add_argument("--save", help="write the measured rows to this JSON file")
    p.add_argument("--rows", help="re-estimate rows saved with --save (no GPU needed)")
    p.add_argument("--json", action="store_true", help="rows as JSON")
    args = p.parse_args()
    gpu = GPU.from_file(args.profile) if args.profile else GPU.preset(args.gpu)
    print(f"{'case':<40s} {'step (ms)':>10s} {'est (ms)':>10s} {'error':>7s} "
          f"{'peak GiB':>9s} {'est GiB':>8s} {'error':>7s}", file=sys.stderr)
    rows = []
    if args.rows:
        try:
            saved = reestimate(args.rows, gpu)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--rows {args.rows}: not rows saved by --save ({e})")
        for row in saved:
            _print_row(Case(**{k: row[k] for k in Case.__dataclass_fields__}), row)
            rows.append(row)
    else:
        grid = cases(args.device, args.quick, args.models, args.micro_batches, args.recompute,
                     args.seq_len, args.zero_stage, args.offload)
        for case in grid:
            r = _isolated(case, gpu, args.device, args.steps, args.warmup)
            if r is None:
                print(f"{case.model} mbs={case.micro_batch} {case.recompute}: out of memory",
                      file=sys.stderr)
                continue
            row = {**asdict(case), **r}
            _print_row(case, row)
            rows.append(row)
            if args.save:  # as it goes, so that a run cut short keeps what it measured
                _save(args, rows)
    if not rows:
        return 1
    _summary(rows)
    if args.save:
        _save(args, rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
