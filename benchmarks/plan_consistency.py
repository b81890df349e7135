"""Does every chosen plan's estimate describe the schedule it runs?

For a sweep of planning problems (Llama-3 8B / 70B / 405B, GPT-3 175B, Mixtral 8x7B; 8 to
16,384 GPUs; A100 80GB and H100 SXM; global batch from GPUs / 8 to 8 x GPUs; each trainer),
plan, then simulate the chosen configuration's pipeline op by op (``planner.timeline``) and
compare its makespan with the estimate's pipeline time (the step time without what follows
the last backward: gradient reduction, parameter gather, optimizer, offload). Prints how many
plans disagree by more than 2 % (target 0), the worst five, and the search time.

    python benchmarks/plan_consistency.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from costmodel import Cluster, Job, ModelSpec
from costmodel.errors import Infeasible
from planner import plan, timeline
from planner.plan import describe

# (model, GPU counts) so that each model meets the scales it is trained at.
SCALES = {
    "llama-3-8b": (8, 64, 512),
    "llama-3-70b": (64, 512, 4096),
    "llama-3-405b": (512, 4096, 16384),
    "gpt3-175b": (64, 1024, 4096),
    "mixtral-8x7b": (8, 64, 512),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller sweep (smoke test)")
    args = ap.parse_args()
    rows, infeasible = [], 0
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
        bd = p.estimate.time_breakdown_s
        pipeline = p.estimate.step_time_s - bd["dp_comm"] - bd["optimizer"] - bd["offload"]
        sim = timeline(model, cluster, job, p.config).makespan
        rows.append((abs(sim / pipeline - 1), name, n, gpu, batch, fw, describe(p.config),
                     pipeline, sim, wall))
    total = time.perf_counter() - t0
    bad = [r for r in rows if r[0] > 0.02]
    print(f"planning problems: {len(todo)} ({len(rows)} planned, {infeasible} with nothing "
          f"that fits)")
    print(f"plans whose estimate disagrees with their simulated timeline by > 2%: {len(bad)} "
          f"(target 0)")
    print(f"largest disagreement: {100 * max(r[0] for r in rows):.2e} %")
    print(f"search time: mean {sum(r[-1] for r in rows) / len(rows):.2f} s, max "
          f"{max(r[-1] for r in rows):.2f} s; sweep {total:.0f} s")
    print("worst five:")
    for r in sorted(rows, reverse=True)[:5]:
        print(f"  {r[1]:<13s} {r[2]:>6,d} {r[3]:<10s} batch {r[4]:>6,d} {r[5]:<10s} "
              f"{r[6]:<55s} estimate {r[7]:.4f} s, timeline {r[8]:.4f} s "
              f"({100 * (r[8] / r[7] - 1):+.2e} %)")


if __name__ == "__main__":
    main()
