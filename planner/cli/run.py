"""``planner run``: start a saved plan's processes with torchrun on this node, or write the
sbatch script of a plan on several nodes (needs torch)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING

from costmodel import SpecError
from costmodel.errors import install_hint
from planner.cli.common import FORCE_HELP, add_command

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner plan --model gpt3-125m --gpus 2 --gpu h100-sxm --global-batch-size 4 \\
      --seq-len 128 --preset fsdp -o plan.json
  planner run plan.json                         # the minimal training loop, 2 processes
  planner run plan.json -- --steps 20
  planner run plan.json --script train.py -- --lr 3e-4
  planner run plan.json --dry-run               # print the torchrun command
  planner run big_plan.json -o train.sbatch     # a multi-node plan: write the sbatch script
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner run`` to ``sub`` (what follows ``--`` is the script's: ``main``)."""
    run = add_command(
        sub, "run", help="train with a saved plan: torchrun on this node, or an sbatch script",
        description="Start the plan's processes with torchrun on this node (one per rank; "
        "the script reads the plan from $PLANNER_PLAN and calls planner.apply), or, for a "
        "plan on several nodes, write an sbatch script that starts them. Features the "
        "runtime cannot execute are refused before anything starts. Without --script, the "
        "minimal loop (python -m planner.runtime.train: the reference transformer on "
        "synthetic tokens, the loss printed by rank 0) trains.", epilog=EPILOG)
    run.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    run.add_argument("--script", help="training script each process runs (default: "
                     "python -m planner.runtime.train)")
    run.add_argument("--force", action="store_true", help=FORCE_HELP)
    run.add_argument("--dry-run", action="store_true",
                     help="print the torchrun command instead of running it")
    run.add_argument("-o", "--output", help="where a multi-node plan's sbatch script goes "
                     "(default train.sbatch)")
    run.add_argument("--model", help="module:attr of the torch module a traced module's plan "
                     "trains (default: the one the plan was made from)")
    run.set_defaults(func=cmd_run)
    run.usage = ("planner run [-h] [--script SCRIPT] [--force] [--dry-run] [-o OUTPUT] "
                 "[--model MODULE:ATTR] plan [-- ARGS]")


def cmd_run(args: argparse.Namespace) -> int:
    """``planner run``: start a saved plan's processes (or write its multi-node script)."""
    from planner.runtime.launch import launch

    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"planner run needs torch: {install_hint('torch')}")
    return launch(args.plan, args.script, args.script_args, dry_run=args.dry_run,
                  output=args.output, command=args.command_line, force=args.force,
                  model=args.model)
