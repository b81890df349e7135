"""``planner plot``: a saved plan's memory per stage, step time and pipeline timeline on one
figure (needs matplotlib)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from costmodel import SpecError
from costmodel.errors import install_hint
from planner.cli.common import FORCE_HELP, add_command, load_saved_plan, positive_int

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner plot plan.json
  planner plot plan.json -o plan.svg --micro-batches 8"""


def add_parser(sub: Subparsers) -> None:
    """Add ``planner plot`` to ``sub``."""
    plt_ = add_command(
        sub, "plot", help="draw a saved plan: memory per stage, step time, pipeline timeline",
        description="Draw a saved training plan on one figure: memory per GPU of each "
        "pipeline stage by term against the GPU's capacity, the step time by term (hidden "
        "communication hatched), and the pipeline schedule as it runs (planner.timeline). "
        "Legends sit beside the data.", epilog=EPILOG)
    plt_.add_argument("plan", help="a plan JSON file written by 'planner plan -o'")
    plt_.add_argument("-o", "--output", help="the figure: .png, .svg or .pdf (default: the "
                      "plan's name with .png)")
    plt_.add_argument("--micro-batches", type=positive_int, help="draw the timeline's first "
                      "N micro-batches' worth of time (default: 4 per pipeline stage)")
    plt_.add_argument("--force", action="store_true", help=FORCE_HELP)
    plt_.set_defaults(func=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    """``planner plot``: a saved plan's memory per stage, step time and pipeline timeline."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SpecError(f"planner plot needs matplotlib: {install_hint('plots')}")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from planner.plots import plot_plan

    plan = load_saved_plan(args.plan, args)
    out = args.output or str(Path(args.plan).with_suffix(".png"))
    if Path(out).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"-o {out!r}: write a .png, .svg or .pdf file")
    plot_plan(plan, out, max_micro_batches=args.micro_batches)
    print(f"plot written to {out}", file=sys.stderr)
    return 0
