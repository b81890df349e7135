"""Save every plot of the planner as a PNG, from the public API only.

    python notebooks/make_plots.py --out plots/

Writes memory.png, step_time.png and frontier.png (Llama-3-70B on 64 H100s, the quick-start
plan), timeline.png (GPT-3 175B on 64 A100s with Korthikanti et al. 2022's tp=8 pp=8 setup,
16 micro-batches, as GPipe, 1F1B, interleaved 1F1B and zero bubble), and sweep_gpus.png and sweep_bandwidth.png (the
quick-start job re-planned on 32 to 256 GPUs and on 12.5 to 100 GB/s NICs).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import planner  # noqa: E402
from planner import plots  # noqa: E402


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="plots", help="directory for the PNG files")
    out = Path(ap.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig: plt.Figure, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    model = planner.ModelSpec.preset("llama-3-70b")
    cluster = planner.Cluster(gpu="h100-sxm", num_nodes=8, gpus_per_node=8)
    job = planner.Job(global_batch_size=512, seq_len=8192)
    plan = planner.plan(model, cluster, job)

    ax = plots.plot_memory(plan)
    save(ax.figure, "memory.png")
    ax = plots.plot_step_time(plan)
    save(ax.figure, "step_time.png")
    ax = plots.plot_frontier(planner.frontier(model, cluster, job), plan)
    save(ax.figure, "frontier.png")

    gpt = planner.ModelSpec.preset("gpt3-175b")
    selene = planner.Cluster.preset("selene", num_nodes=8)
    tjob = planner.Job(global_batch_size=16, seq_len=2048, framework="torchtitan")
    base = planner.ParallelConfig(dp=1, tp=8, pp=8, micro_batch_size=1,
                                  sequence_parallel=True, recompute="selective")
    fig, axes = plt.subplots(4, 1, figsize=(10, 13), sharex=True)
    for ax, (schedule, v) in zip(axes, (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 3),
                                        ("zero-bubble", 1)), strict=True):
        cfg = dataclasses.replace(base, pipeline_schedule=schedule, virtual_pipeline_stages=v)
        plots.plot_timeline(planner.timeline(gpt, selene, tjob, cfg), ax=ax)
    save(fig, "timeline.png")

    points = planner.sweep(model, cluster, job, "num_gpus", [32, 64, 128, 256])
    ax = plots.plot_sweep(points, label="GPUs (H100, 8 per node)")
    save(ax.figure, "sweep_gpus.png")
    points = planner.sweep(model, cluster, job, "inter_node_gbps", [12.5, 25, 50, 100])
    ax = plots.plot_sweep(points, label="inter-node GB/s per NIC (8 NICs per node)")
    save(ax.figure, "sweep_bandwidth.png")
    for p in written:
        print(p)
    return written


if __name__ == "__main__":
    main()
