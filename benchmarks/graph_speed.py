"""How fast a torch model becomes a layer graph (``LayerGraph.from_module``), its
``LayerCosts`` (``costs_from_graph``: the sharding ILP of each distinct block at TP
degrees 1, 2, 4 and 8, without sequence parallelism and, at 2, 4 and 8, with it) and a
plan (the one search over them, as ``planner.plan`` of a module runs it), and in how much
memory: Llama-3-8B,
Llama-3-70B, Llama-2-70B (the reference transformer of their presets), a 1.3B ViT (26
pre-norm blocks of width 2048, 16 heads, patch 14 on 224 x 224 images), a T5-Large-sized
encoder-decoder (24 + 24 blocks of width 1024, 16 heads, vocabulary 32,128: two kinds of
layer and a norm between them) and Mixer-L/16 (24 Mixer layers of width 1024 on 224 x 224
images), traced in bf16 on the meta device with one sequence (4,096 tokens; 512 for the
encoder-decoder) or 8 images per traced batch, planned on 512 H100s (64 nodes of 8,
InfiniBand NDR) for a global batch of 512. ``plan s`` is ``planner.plan(module, ...)`` end
to end (trace, LayerCosts, search, the stage DP of the pipelined top plans), the best of
three runs (as ``timeit`` reports: the machine's noise only ever adds time).

    python benchmarks/graph_speed.py

Targets: extraction <= 10 s and memory <= 4 GiB (issue 6); the module path's plan on 512
H100 in <= 1 s for Llama-3-8B and <= 2 s for the 70B models (issue 33).
"""

from __future__ import annotations

import resource
import time

import numpy as np
import torch

import planner
from costmodel import Cluster, Job, ModelSpec
from costmodel.trace.blockcosts import costs_from_graph
from costmodel.trace.graph import LayerGraph
from costmodel.trace.recorder import training_loss
from planner.alternatives import describe
from planner.examples import EncoderDecoder, MLPMixer, ViT
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
        t5 = EncoderDecoder(vocab=32128, dim=1024, heads=16, encoder_layers=24,
                            decoder_layers=24)
        mixer = MLPMixer(dim=1024, depth=24, patch=16, image=224, classes=1000)
    cases.append(("vit-1.3b", lambda: vit, torch.randn(8, 3, 224, 224)))
    cases.append(("t5-large-like", lambda: t5, torch.randint(0, 32128, (1, 512))))
    cases.append(("mixer-l16", lambda: mixer, torch.randn(8, 3, 224, 224)))
    cluster = Cluster(gpu="h100-sxm", num_nodes=64, gpus_per_node=8, inter_node_link="ib-ndr")
    print(f"{'model':<14s} {'params':>8s} {'layers':>7s} {'nodes':>6s} {'extract s':>10s} "
          f"{'TFLOP/mb':>9s} {'costs s':>8s} {'search s':>9s} {'plan s':>7s}  plan")
    for name, make, x in cases:
        module = make()
        t0 = time.perf_counter()
        graph = LayerGraph.from_module(module, x, dtype=torch.bfloat16,
                                       loss_fn=training_loss)
        dt = time.perf_counter() - t0
        seq = x.shape[1] if x.dim() == 2 else 1
        job = Job(global_batch_size=512, seq_len=seq)
        t1 = time.perf_counter()
        costs = costs_from_graph(graph, cluster, job, tp_degrees=(1, 2, 4, 8),
                                      sequence_parallel="both")
        dc = time.perf_counter() - t1
        t1 = time.perf_counter()
        found = search(costs, cluster, job, Constraints())
        dsearch = time.perf_counter() - t1
        top = found.top[0] if found.top else None
        searched = "nothing fits" if top is None else \
            f"{describe(row_config(np.array(top.row)))}, {top.step_time:.2f} s/step"
        ds = np.inf
        for _ in range(3):
            t1 = time.perf_counter()
            plan = planner.plan(module, cluster, job, example_inputs=x)
            ds = min(ds, time.perf_counter() - t1)
        print(f"{name:<14s} {graph.num_params() / 1e9:>7.2f}B {len(graph.layers):>7d} "
              f"{graph.graph.number_of_nodes():>6d} {dt:>10.3f} "
              f"{graph.model_flops() / 1e12:>9.2f} {dc:>8.2f} {dsearch:>9.2f} {ds:>7.2f}  "
              f"{searched}; plan(): {describe(plan.config)}, "
              f"{plan.estimate.step_time_s:.2f} s/step, "
              f"{plan.estimate.peak_memory_bytes / 2**30:.1f} GiB")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(f"peak resident memory of this process: {peak:.2f} GiB")


if __name__ == "__main__":
    main()
