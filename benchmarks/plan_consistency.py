"""Does every chosen plan's estimate describe the schedule it runs?

For a sweep of planning problems (Llama-3 8B / 70B / 405B, GPT-3 175B; the mixtures of experts
Mixtral 8x7B, Qwen3-30B-A3B and DeepSeek-V3; 8 to 16,384 GPUs; A100 80GB and H100 SXM; global
batch from GPUs / 8 to 8 x GPUs; each trainer), plan, then simulate the chosen configuration's
pipeline op by op (``planner.timeline``) and compare its makespan with the estimate's pipeline
time (the step time without what follows the last backward: gradient reduction, parameter
gather, optimizer, offload). The fastest configuration of every other pipeline schedule the
trainer runs (the search's best per schedule: the V-shaped ZB-V and DualPipeV, Megatron-LM's
combined 1F1B) is checked the same way, and DeepSeek's DualPipe, which the planner costs for
both Megatron-LM and torchtitan but neither runs, on each of those with an even pipeline
(``dualpipe_twins``). Prints how many plans disagree by more than 2 %
(target 0), how many of each schedule were checked, the worst five, and the search time.

    python benchmarks/plan_consistency.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from costmodel.errors import Infeasible, SpecError
from costmodel.formulas.vschedules import as_dualpipe
from costmodel.frameworks import framework
from planner import plan, timeline
from planner.plan import describe
from planner.search import search
from planner.space import row_config

# (model, GPU counts) so that each model meets the scales it is trained at.
SCALES = {
    "llama-3-8b": (8, 64, 512),
    "llama-3-70b": (64, 512, 4096),
    "llama-3-405b": (512, 4096, 16384),
    "gpt3-175b": (64, 1024, 4096),
    "mixtral-8x7b": (8, 64, 512),
    "qwen3-30b-a3b": (8, 64, 512),
    "deepseek-v3": (256, 1024),
}
GPUS = {"a100-80gb": "ib-hdr", "h100-sxm": "ib-ndr"}
BATCH_PER_GPU = (1 / 8, 1 / 2, 2, 8)
TRAINERS = ("megatron", "deepspeed", "torchtitan")


def problems(quick: bool) -> list[tuple[str, int, str, int, str]]:
    out = []
    for name, counts in SCALES.items():
        for n in counts[:2] if quick else counts:
            for gpu in GPUS:
                for per in BATCH_PER_GPU[::3] if quick else BATCH_PER_GPU:
                    for fw in TRAINERS:
                        out.append((name, n, gpu, max(1, int(n * per)), fw))
    return out


def dualpipe_twins(configs: list[ParallelConfig], fw: str) -> list[ParallelConfig]:
    """DeepSeek's DualPipe, which no trainer runs and the search does not offer but the
    planner costs (``Framework.costed_schedules``), beside the checked configurations: each
    DualPipeV's twin over twice the ranks and half the pipelines (which it is costed as) and
    each even 1F1B pipeline run as DualPipe."""
    if "dualpipe" not in framework(fw).costed_schedules:
        return []
    duals = [as_dualpipe(c) for c in configs if c.pipeline_schedule in ("dualpipev", "1f1b")]
    return [d for d in duals if d is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller sweep (smoke test)")
    args = ap.parse_args()
    rows, infeasible = [], 0
    schedules: Counter[str] = Counter()
    t0 = time.perf_counter()
    todo = problems(args.quick)
    for name, n, gpu, batch, fw in todo:
        model = ModelSpec.preset(name)
        cluster = Cluster(gpu=gpu, num_nodes=n // 8, gpus_per_node=8,
                          inter_node_link=GPUS[gpu])
        job = Job(global_batch_size=batch, seq_len=4096 if n < 4096 else 8192, framework=fw)
        t = time.perf_counter()
        try:
            p = plan(model, cluster, job)
        except Infeasible:
            infeasible += 1
            continue
        wall = time.perf_counter() - t
        configs = [p.config]
        res = search(model, cluster, job, p.constraints, top_k=1, by=("schedule",))
        configs += [row_config(np.array(f.row), model)
                    for f in res.best_by.get("schedule", {}).values()]
        configs += dualpipe_twins(configs, fw)
        seen: set[ParallelConfig] = set()
        for cfg in configs:
            if cfg in seen:
                continue
            seen.add(cfg)
            try:
                est = estimate(model, cluster, job, cfg)
            except SpecError:  # a DualPipe twin whose micro-batches DualPipe cannot take
                continue
            bd = est.time_breakdown_s
            pipeline = est.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
            sim = timeline(model, cluster, job, cfg).makespan
            schedules[str(cfg.pipeline_schedule) if cfg.pp > 1 or
                      cfg.pipeline_schedule != "1f1b" else "no pipeline"] += 1
            rows.append((abs(sim / pipeline - 1), name, n, gpu, batch, fw, describe(cfg),
                         pipeline, sim, wall if cfg is p.config else 0.0))
    total = time.perf_counter() - t0
    bad = [r for r in rows if r[0] > 0.02]
    print(f"planning problems: {len(todo)} ({len(todo) - infeasible} planned, {infeasible} with "
          f"nothing that fits)")
    print(f"configurations checked: {len(rows)} (the plans and the fastest of each schedule): "
          + ", ".join(f"{k} {v}" for k, v in sorted(schedules.items())))
    print(f"plans whose estimate disagrees with their simulated timeline by > 2%: {len(bad)} "
          f"(target 0)")
    print(f"largest disagreement: {100 * max(r[0] for r in rows):.2e} %")
    walls = [r[-1] for r in rows if r[-1] > 0]
    print(f"search time: mean {sum(walls) / len(walls):.2f} s, max {max(walls):.2f} s; "
          f"sweep {total:.0f} s")
    slowest = max(rows, key=lambda r: r[-1])
    print(f"slowest search: {slowest[1]} {slowest[2]:,d} {slowest[3]} batch {slowest[4]:,d} "
          f"{slowest[5]}")
    print("worst five:")
    for r in sorted(rows, reverse=True)[:5]:
        print(f"  {r[1]:<13s} {r[2]:>6,d} {r[3]:<10s} batch {r[4]:>6,d} {r[5]:<10s} "
              f"{r[6]:<55s} estimate {r[7]:.4f} s, timeline {r[8]:.4f} s "
              f"({100 * (r[8] / r[7] - 1):+.2e} %)")


if __name__ == "__main__":
    main()
