"""``planner emit``: a saved plan as a trainer's config file, or a serving plan as an
engine's launch script."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from costmodel import Infeasible, Job
from costmodel.formulas.estimate import Estimate
from costmodel.units import GIB
from hardware_profiles.files import write_text
from planner.cli.common import FORCE_HELP, add_command, load_saved_plan, warn
from planner.emit import TARGETS, emit

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner plan --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192 -o plan.json
  planner emit plan.json --target torchtitan -o torchtitan.toml
  planner emit plan.json --target deepspeed -o ds_config.json
  planner emit plan.json --target megatron -o megatron_args.sh
  planner emit plan.json --target slurm -o train.sbatch && sbatch train.sbatch
  planner emit serve.json --target vllm -o serve.sh       # a serving plan (--inference)
  planner emit serve.json --target tensorrt-llm -o build_and_serve.sh
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner emit`` to ``sub``."""
    em = add_command(
        sub, "emit", help="write a saved plan for a trainer (torchtitan, DeepSpeed, "
        "Megatron-LM, Slurm) or, for a serving plan, an engine (vLLM, TensorRT-LLM)",
        description="Write the plan saved by 'planner plan -o plan.json' in the form a "
        "trainer takes: a torchtitan job TOML, a DeepSpeed ds_config.json, the Megatron-LM "
        "pretrain_gpt.py arguments, or a Slurm sbatch script that starts the plan's trainer "
        "with torchrun; a serving plan ('planner plan --inference') as a vllm serve script or "
        "the TensorRT-LLM convert, build and serve steps. A feature the target cannot "
        "express is mapped to its nearest setting with a warning (also in the file's header, "
        "with the new prediction); --strict refuses instead.", epilog=EPILOG)
    em.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    em.add_argument("--target", required=True, choices=TARGETS, help="what to write")
    em.add_argument("-o", "--output", help="write to this file (default: standard output)")
    em.add_argument("--force", action="store_true", help=FORCE_HELP + "; write a file "
                    "that does not fit under the target's conventions anyway")
    em.add_argument("--strict", action="store_true",
                    help="refuse a plan the target cannot run unchanged")
    em.set_defaults(func=cmd_emit)


def cmd_emit(args: argparse.Namespace) -> int:
    """``planner emit``: a saved plan as a trainer's config file."""
    out = emit(load_saved_plan(args.plan, args), args.target, command=args.command_line,
               strict=args.strict)
    for w in out.warnings:
        warn(w)
    est = out.estimate
    if isinstance(est, Estimate) and isinstance(out.job, Job) and not est.fits:
        msg = (f"the {args.target} file does not fit: {est.peak_memory_bytes / GIB:.1f} GiB "
               f"per GPU under {args.target}'s conventions, of "
               f"{est.memory_capacity_bytes / GIB:.1f} GiB")
        if not args.force:
            raise Infeasible(f"{msg}; re-plan for it ('planner plan --framework "
                             f"{out.job.framework}'), or pass --force to write it anyway")
        warn(f"{msg}; written anyway (--force)")
    if args.output:
        write_text(args.output, out.text, f"{args.target} file")
        print(f"{args.target} file written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(out.text)
    return 0
