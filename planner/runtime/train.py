"""A minimal training loop: synthetic tokens, the reference transformer, the plan's optimizer.

What the runtime tests and the examples run, and the default script of ``planner run``::

    python -m planner.runtime.train --plan plan.json --steps 5     # one process per rank

Every rank draws the same global batch of random tokens per step (seeded), trains its
``local_batch`` of it, and rank 0 prints the loss. ``reference_losses`` trains the same model
on the same data in one process without any parallelism, the yardstick for the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.model import ModelSpec
from hardware_profiles.files import write_text
from planner.result import Plan
from planner.runtime.apply import Parallelized, apply, cross_entropy, make_optimizer
from planner.runtime.checks import traced_source
from planner.runtime.model import build_model
from planner.runtime.modules import synthetic_batch

__all__ = ["TrainResult", "main", "module_reference_losses", "reference_losses", "train",
           "train_module"]

#: Learning rate of the examples (AdamW, Loshchilov & Hutter 2019, torch defaults otherwise).
LR = 1e-3


@dataclass
class TrainResult:
    """What a run measured on this rank: the global mean ``losses`` per step, wall
    ``step_times_s``, and ``state_bytes`` of weights, gradients and optimizer states after
    the first step (``Parallelized.state_bytes``), and the ``stage_ids`` it held."""

    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    state_bytes: dict[str, int] = field(default_factory=dict)
    stage_ids: list[int] = field(default_factory=list)


def train(plan: Plan, *, steps: int = 5, lr: float = LR, seed: int = 0,
          meta: bool | None = None, log: Callable[[str], None] | None = None,
          spec: ModelSpec | None = None) -> TrainResult:
    """Train the reference transformer of ``plan.model`` for ``steps`` steps as the plan
    says, in this process (one rank of the job). ``meta``: build the model on the meta device
    and let each rank allocate and initialise only its shards (its random weights differ from
    a one-process run); ``False``: every rank builds the whole model on the CPU from ``seed``
    (what the equivalence tests need); ``None``: meta when CUDA is present. ``log``: called
    with a line per step. ``spec``: the reference transformer to train (default the plan's
    preset; the one a traced module's plan was traced from)."""
    if meta is None:
        meta = torch.cuda.is_available()
    spec = spec or plan.preset("planner run")
    module = build_model(spec, device="meta" if meta else "cpu", seed=seed)
    run = apply(plan, module)
    job = plan.training()[0]  # apply refused a serving plan
    vocab = spec.vocab_size
    return _loop(run, lambda step: synthetic_batch(job, vocab, step, seed), steps, lr, log)


def _loop(run: Parallelized, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
          steps: int, lr: float, log: Callable[[str], None] | None) -> TrainResult:
    """``steps`` steps of ``run`` on the global batches ``batch(step)``, with the plan's
    optimizer: what ``train`` and ``train_module`` measure."""
    opt = run.optimizer(lr=lr)
    out = TrainResult(stage_ids=list(run.stage_ids))
    for step in range(steps):
        x, y = batch(step)
        t0 = time.perf_counter()
        loss = run.step(run.local_batch(x), run.local_batch(y))
        opt.step()
        if step == 0:
            out.state_bytes = run.state_bytes(opt)
        opt.zero_grad(set_to_none=True)
        out.step_times_s.append(time.perf_counter() - t0)
        out.losses.append(loss)
        if log is not None:
            log(f"step {step + 1:>3}  loss {loss:.6f}  ({out.step_times_s[-1]:.3f} s)")
    return out


def train_module(plan: Plan, make: Callable[[], torch.nn.Module], example: torch.Tensor, *,
                 steps: int = 5, lr: float = LR, seed: int = 0,
                 log: Callable[[str], None] | None = None) -> TrainResult:
    """Train a traced module's plan on the module ``make()`` builds (its weights drawn after
    ``torch.manual_seed(seed)``, the same on every rank) for ``steps`` steps of synthetic
    data (``planner.runtime.modules.module_batch``, shaped like ``example``, the inputs it
    was traced with), in this process (one rank of the job)."""
    from planner.runtime.modules import module_batch, output_size

    torch.manual_seed(seed)
    module = make()
    classes = output_size(module, example)
    job, cfg, _ = plan.training()
    micro = example[:1].expand(cfg.micro_batch_size, *example.shape[1:]).contiguous()
    run = apply(plan, module, example_inputs=micro)
    return _loop(run, lambda step: module_batch(example, classes, job.global_batch_size, step,
                                                seed), steps, lr, log)


def module_reference_losses(make: Callable[[], torch.nn.Module], example: torch.Tensor,
                            job: Job, *, steps: int = 5, lr: float = LR, seed: int = 0
                            ) -> list[float]:
    """``train_module``'s training in one process with no parallelism: the full batch per
    step, one forward and backward, the job's optimizer."""
    from planner.runtime.modules import module_batch, output_size

    torch.manual_seed(seed)
    module = make()
    classes = output_size(module, example)
    return _one_process(module, job, lambda step: module_batch(
        example, classes, job.global_batch_size, step, seed), steps, lr)


def reference_losses(model: ModelSpec, job: Job, *, steps: int = 5, lr: float = LR,
                     seed: int = 0) -> list[float]:
    """The same training in one process with no parallelism: the full batch per step, one
    forward and backward, the job's optimizer. The losses every plan must reproduce."""
    return _one_process(build_model(model, seed=seed), job,
                        lambda step: synthetic_batch(job, model.vocab_size, step, seed),
                        steps, lr)


def _one_process(module: torch.nn.Module, job: Job,
                 batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int,
                 lr: float) -> list[float]:
    """The loss of each of ``steps`` steps of ``module`` on the whole batches ``batch(step)``
    in this process, one forward and backward each, with the job's optimizer."""
    opt = make_optimizer(job.optimizer, module.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        loss = cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _train_traced(plan: Plan, model: str | None, *, steps: int, lr: float, seed: int,
                  log: Callable[[str], None] | None) -> TrainResult:
    """``train_module`` of a traced module's plan: the module ``model`` names (default the
    plan's ``module``), trained on synthetic data of its traced inputs' shape."""
    from planner.models import build_module

    name, source = traced_source(plan, model)
    dtype = torch.int64 if source.input_dtype == "int64" else torch.float32
    example = torch.zeros(source.input_shapes[0], dtype=dtype)
    return train_module(plan, lambda: build_module(name), example, steps=steps, lr=lr,
                        seed=seed, log=log)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m planner.runtime.train --plan plan.json [--steps N] [--json OUT]``."""
    p = argparse.ArgumentParser(prog="python -m planner.runtime.train",
                                description="Train the reference transformer as a plan says "
                                "(one process per rank; start it with 'planner run').")
    p.add_argument("--plan", default=os.environ.get("PLANNER_PLAN"),
                   help="plan JSON file (default: $PLANNER_PLAN, set by 'planner run')")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--lr", type=float, default=LR, help=f"learning rate (default {LR})")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    p.add_argument("--meta", action=argparse.BooleanOptionalAction, default=None,
                   help="build the model on the meta device, each rank allocating its shards "
                   "(default: when CUDA is present); --no-meta builds it whole on the CPU")
    p.add_argument("--json", metavar="OUT", help="write every rank's measurements here "
                   "(rank 0 writes)")
    p.add_argument("--model", metavar="MODULE:ATTR", help="the torch module a traced "
                   "module's plan trains (default: the one the plan was made from, "
                   "'planner plan --model module:attr'), on synthetic data of its traced "
                   "inputs' shape")
    args = p.parse_args(argv)
    if not args.plan:
        p.error("give --plan plan.json (or set PLANNER_PLAN)")
    try:
        plan = Plan.from_json(args.plan)
        rank = int(os.environ.get("RANK", "0"))
        say = print if rank == 0 else None
        if say:
            job = plan.training()[0]
            say(f"training {plan.model.name} on {plan.config.world_size} processes, "
                f"{job.global_batch_size} x {job.seq_len} {job.unit} per step "
                "(plan loaded, no search)")
        if isinstance(plan.model, LayerCosts) and plan.model.spec is None:
            res = _train_traced(plan, args.model, steps=args.steps, lr=args.lr,
                                seed=args.seed, log=say)
        else:
            res = train(plan, steps=args.steps, lr=args.lr, seed=args.seed, meta=args.meta,
                        log=say)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        rows: list[dict[str, object] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(rows, {"rank": dist.get_rank(), **res.__dict__})
        if dist.get_rank() == 0:
            write_text(args.json, json.dumps(rows, indent=1), "results file")
    dist.destroy_process_group()
    return 0


def exit_process(code: int) -> None:
    """End a torchrun worker with exit status ``code`` once its output is flushed, skipping
    the interpreter's teardown. After ``destroy_process_group`` a device mesh or a finished
    DTensor collective can still hold the gloo process group; freeing it while the
    interpreter shuts down can abort the process ("terminate called without an active
    exception", pytorch/pytorch#179291), which torchrun reports as a failed run although
    every rank finished its work."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> int:
    """``main``, with a Ctrl-C (``planner run`` forwards it through torchrun) ending the
    rank with one line and status 130 instead of a traceback per rank."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"rank {os.environ.get('RANK', '?')}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    exit_process(run())
