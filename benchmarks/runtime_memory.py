"""Measured vs predicted memory of plans applied by ``planner.apply``, in this process.

    python benchmarks/runtime_memory.py

For one-process plans of a small Llama-style model (fp32, on CPU) with each recompute mode and
two micro-batch sizes: the bytes of parameters, gradients and optimizer states after one step
(``Parallelized.state_bytes``) and the activations one micro-batch keeps for backward, against
the memory estimator's terms for the same plan. Activations are measured as the bytes the CPU
allocator still holds after one forward pass and the loss, allocations minus frees as
``torch.profiler`` (``profile_memory=True``) records them: what autograd keeps for backward,
the temporaries of the forward pass being freed. On a GPU, ``torch.cuda.memory_allocated``
would measure the same directly.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from costmodel import Cluster, Job, ModelSpec, ParallelConfig, estimate
from planner.result import Plan
from planner.runtime.apply import apply
from planner.runtime.model import build_model
from planner.runtime.modules import synthetic_batch

MODEL = ModelSpec(name="llama-small", num_layers=4, hidden_size=512, num_heads=8,
                  num_kv_heads=4, ffn_hidden_size=1408, vocab_size=8192, gated_mlp=True)
JOB = Job(global_batch_size=4, seq_len=1024, precision="fp32", framework="torchtitan")
MIB = 1024**2


def measure(cfg: ParallelConfig) -> tuple[dict[str, float], dict[str, float]]:
    """(measured, predicted) bytes: weights, gradients, optimizer, activations."""
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=1)
    plan = Plan(model=MODEL, cluster=cluster, job=JOB, config=cfg,
                estimate=estimate(MODEL, cluster, JOB, cfg))
    run = apply(plan, build_model(MODEL, seed=0), device="cpu")
    opt = run.optimizer(lr=1e-4)
    x, y = synthetic_batch(JOB, MODEL.vocab_size, 0)
    part = run.parts[0]
    run.step(x, y)
    opt.step()
    states = run.state_bytes(opt)
    opt.zero_grad(set_to_none=True)
    run.step(x, y)
    opt.zero_grad(set_to_none=True)
    # After two steps (DDP allocates its gradient buckets in the first and rebuilds them in
    # the second), one micro-batch's forward pass and loss.
    mb = slice(0, cfg.micro_batch_size)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = run.loss_fn(part(x[mb]), y[mb])
    acts = sum(e.self_cpu_memory_usage for e in prof.events())
    del loss
    measured = {**states, "activations": float(acts)}
    stage = plan.estimate.stages[0]
    predicted = {"weights": stage.resident_weights_bytes,
                 "gradients": stage.resident_gradients_bytes,
                 "optimizer": stage.memory.optimizer_bytes,
                 "activations": stage.memory.activations_bytes}
    return measured, predicted


def main() -> None:
    """Print measured and predicted MiB per term and the error of the activations."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    print(f"{MODEL.name}: {MODEL.num_params() / 1e6:.1f}M parameters, {JOB.seq_len} tokens, "
          "fp32, one process on CPU; MiB measured / predicted")
    print(f"{'plan':<28s} {'weights':>15s} {'gradients':>15s} {'optimizer':>15s} "
          f"{'activations':>15s} {'error':>7s}")
    for recompute in ("none", "selective", "full"):
        for mbs in (1, 2):
            cfg = ParallelConfig(recompute=recompute, micro_batch_size=mbs)
            got, want = measure(cfg)
            cells = [f"{got[k] / MIB:>7.1f}/{want[k] / MIB:<7.1f}" for k in
                     ("weights", "gradients", "optimizer", "activations")]
            err = got["activations"] / want["activations"] - 1
            print(f"recompute={recompute:<9s} mbs={mbs:<6d} {' '.join(cells)} {err:>+7.1%}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
