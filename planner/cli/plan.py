"""``planner plan``: search every configuration for the fastest that fits (a training job, a
serving job with ``--inference``, or a traced torch ``nn.Module``); also the search
``planner explain`` runs when it is given flags instead of a saved plan."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from costmodel import Cluster, Job, ModelSpec, SpecError
from costmodel.formulas.layercosts import LayerCosts
from costmodel.serving.inference import InferenceJob
from planner.alternatives import params_text
from planner.cli.common import (
    add_command,
    add_common_args,
    add_inference_args,
    add_search_args,
    load_constraints,
    load_problem,
    non_negative_int,
)
from planner.cli.estimate import estimate_report
from planner.cli.torchmodule import add_module_args, module_inputs
from planner.plan import plan
from planner.progress import Progress
from planner.result import ModuleSource, Plan
from planner.space import Constraints

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192
  planner plan --model gpt3-175b --cluster selene --num-nodes 128 \\
      --global-batch-size 1536 --seq-len 2048 --framework megatron --max pp=16 --json
  planner plan --model llama-3-8b --gpus 8 --global-batch-size 64 --seq-len 8192 \\
      --preset fsdp -o plan.json
  planner plan --inference --model llama-2-70b --gpus 8 --gpu h100-sxm \\
      --prompt-len 2048 --output-len 256                # serving: lowest latency
  planner plan --inference --model llama-3-70b --gpus 16 --gpu a100-80gb \\
      --prompt-len 1024 --output-len 512 --objective throughput --max-tpot-ms 50 \\
      --weight-precision bf16,int8,int4 -o serve.json
  planner emit serve.json --target vllm -o serve.sh
  planner plan --model mymodels:Net --gpus 16 --global-batch-size 256 --seq-len 2048
      # a torch nn.Module (class, factory or instance in mymodels.py): traced on the
      # meta device, each block sharded per TP degree, then the same search as a preset
      # (token ids in when its first layer is an nn.Embedding; otherwise give
      # --input-shape, e.g. 8x3x224x224)
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner plan`` to ``sub``."""
    pl = add_command(
        sub, "plan",
        help="search every parallel configuration; the fastest that fits, and why",
        description="Search the whole space (dp, tp, pp, cp, ep, ZeRO stage and sharding "
        "group, sequence parallel, micro-batch, pipeline schedule and virtual stages, "
        "recompute, offload) for the fastest configuration that fits in memory; print it with "
        "its estimate, the runners-up and why the others lost. Any degree or option given "
        "below is fixed; --max caps one; --preset starts from a named set of constraints. "
        "Exits with status 3, saying what would fit, when nothing does.", epilog=EPILOG)
    add_common_args(pl)
    add_search_args(pl)
    add_inference_args(pl, search=True)
    add_module_args(pl, "--model module:attr naming an nn.Module")
    pl.add_argument("--why", type=non_negative_int, default=12,
                    help="rows of the why-not table shown")
    pl.add_argument("-o", "--output", help="also write the plan as JSON to this file")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    """``planner plan``: the fastest configuration that fits."""
    model, cluster, job = load_problem(args, modules=True)
    if not isinstance(model, ModelSpec):
        assert isinstance(job, Job)  # load_problem serves (--inference) only a ModelSpec
        return _plan_torch_module(args, model, cluster, job)
    result = search_problem(args, model, cluster, job)
    if _saved_or_json(args, result):
        return 0
    rows = max(0, args.why)
    if isinstance(job, InferenceJob):
        print(result.summary(rows=rows))
        if args.output:
            print(f"\nplan written to {args.output}; serve it with 'planner emit "
                  f"{args.output} --target vllm'")
        return 0
    _print_training(args, model, cluster, job, result)
    return 0


def _sp_note(costs: LayerCosts) -> str:
    """How a traced module's blocks were costed for sequence parallelism."""
    if len(costs.sp_options) > 1:
        return "with and without sequence parallel"
    return f"{'with' if costs.sequence_parallel else 'without'} sequence parallel"


def _print_training(args: argparse.Namespace, model: ModelSpec | LayerCosts, cluster: Cluster,
                    job: Job, result: Plan) -> None:
    """A training plan's report: the model line, the plan with why the others lost, the
    estimate; a traced module's model line says what was traced."""
    traced = ""
    if isinstance(model, LayerCosts) and model.spec is None:
        layer = next(b for b in model.blocks if b.kind == "layer")
        traced = (f" (traced: {len(model.blocks)} blocks, {layer.name} x{layer.repeat}; "
                  f"{_sp_note(model)})")
    unit = "tokens" if job.seq_len > 1 else "samples"
    print(f"model    {model.name}: {params_text(model)}{traced}; "
          f"{cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}; "
          f"{job.global_batch_size} x {job.seq_len} {unit}, {job.precision}")
    print(result.summary(rows=max(0, args.why)))
    print()
    print(estimate_report(model, cluster, result.training()[0], result.training()[2]))
    if args.output:
        print(f"\nplan written to {args.output}")


def _saved_or_json(args: argparse.Namespace, result: Any) -> bool:
    """Write the plan to ``-o`` if given; with ``--json`` print it as JSON and return True
    (the command has nothing more to print)."""
    if args.output:
        result.to_json(args.output)
    if args.json:
        print(result.to_json())
    return bool(args.json)


def search(args: argparse.Namespace) -> Any:
    """The plan the flags of ``planner plan`` ask for (a ``Plan``; ``planner explain``)."""
    model, cluster, job = load_problem(args)
    return search_problem(args, model, cluster, job)


def search_problem(args: argparse.Namespace, model: ModelSpec, cluster: Cluster,
                   job: Job | InferenceJob) -> Any:
    """The plan of ``model`` under the search flags, with a progress bar on a terminal
    after one second (none for a serving search, which is quick)."""
    if isinstance(job, InferenceJob):
        from planner.inference import plan_inference

        if args.preset or args.frameworks:
            raise SpecError("--preset and --frameworks describe trainers; a serving search "
                            "(--inference) takes --tp, --pp, --replicas and --max")
        cons = load_constraints(args)
        if args.replicas is not None:
            cons = cons.merge(Constraints(fixed={"replicas": args.replicas}))
        return plan_inference(model, cluster, job, constraints=cons, top_k=args.top_k)
    with Progress("searching") as bar:
        return plan(model, cluster, job, constraints=load_constraints(args), top_k=args.top_k,
                    progress=bar)


# -- a torch module -----------------------------------------------------------------------

def _plan_torch_module(args: argparse.Namespace, module: Any, cluster: Cluster,
                       job: Job) -> int:
    """``planner plan`` of a torch module: traced, its blocks costed per TP degree, then the
    one search (a ``Plan``, reported as a preset's)."""
    inputs = module_inputs(args, module, job)
    with Progress("tracing and sharding") as bar:
        found = plan(module, cluster, job, example_inputs=inputs, progress=bar,
                     constraints=load_constraints(args), top_k=args.top_k)
    tensors = inputs if isinstance(inputs, tuple) else (inputs,)
    found = dataclasses.replace(found, module=ModuleSource(
        args.model, tuple(tuple(t.shape) for t in tensors),
        "float32" if tensors[0].is_floating_point() else "int64"))
    if not _saved_or_json(args, found):
        _print_training(args, found.model, cluster, found.training()[0], found)
    return 0
