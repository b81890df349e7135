"""How close a traced module's plan is to its preset's: the reference transformer of a preset
(``planner.runtime.build_model``), traced on the meta device, costed per block and TP degree
(``costs_from_graph``), and put through the memory and step-time tables and the search,
against the preset's formulas (``LayerCosts.of(spec)``) on the same grid of configurations.

    python benchmarks/traced_vs_preset.py

Prints, per model: the largest relative difference of any memory term, the range of the
traced / preset step-time ratio, the Spearman rank correlation of the step times over the
grid, whether ``planner.plan`` picks the same configuration, and the ratio of the two plans'
step times. torchtitan's conventions (eager kernels, which the reference module runs; its
per-op selective recompute) under DDP (ZeRO 0: 1-D data parallel runs under
``torch.autocast``, which the module traced so costs: ``costs_from_graph``'s
``autocast_graph``) and FSDP (ZeRO 2, 3), TP 1-8 with and without sequence parallelism,
eager and under ``torch.compile`` (the rows marked ``compiled``), and compiled with
torchao's tensor-wise float8 (``fp8``). The four dense presets, and the small mixture
of experts of the traced MoE test (``tests/test_layercosts.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from scipy.stats import spearmanr

import planner
from costmodel import Cluster, Job, ModelSpec, ParallelConfig
from costmodel.formulas.arrays import ConfigArrays
from costmodel.formulas.memory import memory_table
from costmodel.formulas.steptime import time_table
from costmodel.trace.blockcosts import costs_from_graph
from costmodel.trace.graph import LayerGraph
from costmodel.trace.recorder import training_loss
from planner.runtime.model import build_model

SEQ = 2048


def main() -> None:
    cluster = Cluster(gpu="h100-sxm", num_nodes=4, gpus_per_node=8)
    print(f"{'model':<28s} {'memory max err':>15s} {'step ratio':>14s} {'spearman':>9s} "
          f"{'same plan':>10s} {'plan step':>10s}")
    # The four dense presets, and a small mixture of experts (top-2 of 8), whose reference
    # module runs torchtitan's MoE (tests/test_layercosts.py, the traced MoE test).
    moe = ModelSpec(name="small-moe", num_layers=8, hidden_size=1024, num_heads=16,
                    num_kv_heads=8, vocab_size=32000, ffn_hidden_size=2816, gated_mlp=True,
                    num_experts=8, top_k=2, moe_ffn_hidden_size=1408)
    for precision, compiled in (("bf16", False), ("bf16", True), ("fp8", True)):
        job = Job(global_batch_size=64, seq_len=SEQ, precision=precision,
                  framework="torchtitan", compile=compiled)
        for name in ("llama-3.2-1b", "llama-3-8b", "gpt3-350m", "gpt3-2.7b", moe.name):
            _compare(name, moe, cluster, job)


def _compare(name: str, moe: ModelSpec, cluster: Cluster, job: Job) -> None:
    """Print one row: the traced reference module of ``name`` against its formulas."""
    spec = moe if name == moe.name else ModelSpec.preset(name)
    if spec.vocab_size % 64:  # padded as trainers pad it (a vocabulary-parallel head)
        spec = dataclasses.replace(spec, vocab_size=-(-spec.vocab_size // 64) * 64)
    module = build_model(spec, device="meta", dropout=0.1 if spec.dropout else 0.0)
    tokens = torch.zeros(1, SEQ, dtype=torch.long)
    graph = LayerGraph.from_module(module, tokens, dtype=torch.bfloat16, loss_fn=training_loss)
    under = LayerGraph.from_module(module, tokens, dtype=torch.float32, autocast=torch.bfloat16,
                                   loss_fn=training_loss) if job.precision == "bf16" else None
    traced = costs_from_graph(graph, cluster, job, sequence_parallel="both",
                                   autocast_graph=under)
    configs = [ParallelConfig(dp=32 // (t * p), tp=t, pp=p, zero_stage=z,
                              micro_batch_size=b, recompute=r, sequence_parallel=sp)
               for t in (1, 2, 4, 8) for p in (1, 2) for z in (0, 2, 3) for b in (1, 2)
               for r in ("none", "selective", "full") for sp in (False, True)
               if t > 1 or not sp]
    a = ConfigArrays.from_configs(spec, configs)
    mw, mg = memory_table(spec, cluster, job, a), memory_table(traced, cluster, job, a)
    err = max(float(np.max(np.abs(mg.terms[k] - mw.terms[k])
                           / np.maximum(mw.terms[k], 1.0)))
              for k in ("weights", "gradients", "optimizer", "activations"))
    tw, tg = time_table(spec, cluster, job, a, mw), time_table(traced, cluster, job, a, mg)
    ratio = tg.step_time / tw.step_time
    rho = spearmanr(tw.step_time, tg.step_time).correlation
    got, want = planner.plan(traced, cluster, job), planner.plan(spec, cluster, job)
    plan_ratio = (got.estimate.step_time_s or 0.0) / (want.estimate.step_time_s or 1.0)
    name = name + (" (fp8, compiled)" if job.precision == "fp8"
                   else " (compiled)" if job.compile else "")
    print(f"{name:<28s} {100 * err:>14.2f}% {ratio.min():>6.3f}-{ratio.max():.3f}x "
          f"{rho:>9.3f} {'yes' if got.config == want.config else 'no':>10s} "
          f"{plan_ratio:>9.3f}x")


if __name__ == "__main__":
    main()
