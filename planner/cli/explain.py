"""``planner explain``: why a plan (saved, or searched from the flags of ``planner plan``),
and what every other choice would cost."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from planner.cli.common import (
    FORCE_HELP,
    add_command,
    add_common_args,
    add_inference_args,
    add_search_args,
    load_saved_plan,
    print_json,
)
from planner.cli.plan import search
from planner.explain import explain
from planner.progress import Progress

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner explain --model llama-3-70b --gpus 64 --gpu h100-sxm --gpus-per-node 8 \\
      --global-batch-size 512 --seq-len 8192
  planner explain plan.json --json
"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner explain`` to ``sub``."""
    ex = add_command(
        sub, "explain", help="why this plan: what every other choice would cost",
        description="For each choice of the plan (tp, pp, cp, ep, ZeRO stage, sequence "
        "parallel, micro-batch, schedule, virtual stages, recompute, offload, trainer), search "
        "again with each other value fixed and say what the fastest configuration with it "
        "costs: slower by how much and which term grew, or how far over the memory it is. "
        "Give a saved plan, or the flags of 'planner plan' to search first.", epilog=EPILOG)
    ex.add_argument("plan", nargs="?", help="a plan JSON file written by 'planner plan -o'")
    add_common_args(ex, model_required=False)
    add_search_args(ex)
    add_inference_args(ex, search=True)
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.add_argument("--force", action="store_true", help=FORCE_HELP)
    ex.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    """``planner explain``: why this plan, and what every other choice would cost."""
    result = load_saved_plan(args.plan, args) if args.plan else search(args)
    with Progress("explaining") as bar:
        why = explain(result, progress=bar)
    if args.json:
        print_json(why.to_dict())
    else:
        print(why.summary())
    return 0
