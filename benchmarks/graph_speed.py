"""How fast a torch model becomes a layer graph (``LayerGraph.from_module``), its
``LayerCosts`` (``LayerCosts.from_graph``: the sharding ILP of each distinct block at TP
degrees 1, 2, 4 and 8) and a plan (``planner.graphplan.plan_graph``, the module path the
single pipeline of issue 33 replaces: the sharding ILP on every pipeline degree's mesh,
then the stage DP), and in how much memory: Llama-3-8B, Llama-3-70B, Llama-2-70B (the
reference transformer of their presets) and a 1.3B ViT (26 pre-norm blocks of width 2048,
16 heads, patch 14 on 224 x 224 images), traced in bf16 on the meta device with one
sequence (4,096 tokens) or 8 images per micro-batch, planned on 512 H100s (64 nodes of 8,
InfiniBand NDR) for a global batch of 512.

    python benchmarks/graph_speed.py

Targets: extraction <= 10 s and memory <= 4 GiB (issue 6); the module path's plan on 512
H100 in <= 1 s for Llama-3-8B and <= 2 s for the 70B models (issue 33).
"""

from __future__ import annotations

import resource
import time

import numpy as np
import torch

from costmodel import Cluster, Job, ModelSpec
from costmodel.graph import LayerGraph
from costmodel.layercosts import LayerCosts
from planner.alternatives import describe
from planner.examples import ViT
from planner.graphplan import plan_graph
from planner.runtime.model import build_model
from planner.search import search
from planner.space import Constraints, row_config


def main() -> None:
    cases = []
    for name in ("llama-3-8b", "llama-3-70b", "llama-2-70b"):
        spec = ModelSpec.preset(name)
        cases.append((name, lambda spec=spec: build_model(spec, device="meta"),
                      torch.randint(0, spec.vocab_size, (1, 4096))))
    with torch.device("meta"):
        vit = ViT(dim=2048, depth=26, heads=16, patch=14, image=224, classes=1000)
    cases.append(("vit-1.3b", lambda: vit, torch.randn(8, 3, 224, 224)))
    cluster = Cluster(gpu="h100-sxm", num_nodes=64, gpus_per_node=8, inter_node_link="ib-ndr")
    print(f"{'model':<14s} {'params':>8s} {'layers':>7s} {'nodes':>6s} {'extract s':>10s} "
          f"{'TFLOP/mb':>9s} {'costs s':>8s} {'search s':>9s} {'plan s':>7s}  plan")
    for name, make, x in cases:
        module = make()
        t0 = time.perf_counter()
        graph = LayerGraph.from_module(module, x, dtype=torch.bfloat16)
        dt = time.perf_counter() - t0
        seq = x.shape[1] if x.dim() == 2 else 1
        job = Job(global_batch_size=512, seq_len=seq)
        t1 = time.perf_counter()
        costs = [LayerCosts.from_graph(graph, cluster, job, tp_degrees=(1, 2, 4, 8),
                                       sequence_parallel=sp) for sp in (False, True)]
        dc = time.perf_counter() - t1
        t1 = time.perf_counter()
        found = [search(c, cluster, job, Constraints()) for c in costs]
        dsearch = time.perf_counter() - t1
        top = min((f.top[0] for f in found if f.top), key=lambda x: x.step_time, default=None)
        searched = "nothing fits" if top is None else \
            f"{describe(row_config(np.array(top.row)))}, {top.step_time:.2f} s/step"
        t1 = time.perf_counter()
        plan = plan_graph(graph, cluster, job)
        ds = time.perf_counter() - t1
        exact = "" if plan.solution.optimal else " (best in time limit)"
        print(f"{name:<14s} {graph.num_params() / 1e9:>7.2f}B {len(graph.layers):>7d} "
              f"{graph.graph.number_of_nodes():>6d} {dt:>10.3f} "
              f"{graph.model_flops() / 1e12:>9.2f} {dc:>8.2f} {dsearch:>9.2f} {ds:>7.2f}  "
              f"search: {searched}; graph plan: pp={plan.pp} x "
              f"{plan.mesh.shape[0]}x{plan.mesh.shape[1]}, "
              f"{plan.step_time_s:.2f} s/step, {plan.peak_memory_bytes / 2**30:.1f} GiB{exact}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(f"peak resident memory of this process: {peak:.2f} GiB")


if __name__ == "__main__":
    main()
