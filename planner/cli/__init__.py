"""Command line: ``planner plan``, ``estimate``, ``explain``, ``compare``, ``emit``, ``plot``,
``run``, ``validate``, ``profile``, ``calibrate``, ``graph``, ``models``, ``gpus``,
``clusters``.

Bad input prints one line naming what is wrong and exits with status 2, never a traceback; a
valid question that no configuration answers (nothing fits) exits with status 3 and says what
would fit.

One module per subcommand (``gpus`` and ``clusters``, listings like ``models``, share its
module), each with ``add_parser(subparsers)`` and its ``cmd_*`` handler; ``common`` holds the
shared flags, the loading of a model, cluster, job and constraints from them, and the output
helpers. Torch is imported only by the commands that need it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from costmodel import Infeasible, SpecError
from planner.cli import (
    calibrate,
    compare,
    emit,
    estimate,
    explain,
    graph,
    models,
    plan,
    plot,
    profile,
    run,
    validate,
)
from planner.cli.common import EXIT_INFEASIBLE, EXIT_USAGE, Parser, one_line

__all__ = ["EXIT_INFEASIBLE", "EXIT_USAGE", "build_parser", "main"]

#: The subcommand modules, in the order ``planner --help`` lists them.
COMMANDS = (estimate, plan, explain, compare, emit, plot, run, validate, profile, calibrate,
            graph, models)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``planner`` command."""
    parser = Parser(
        prog="planner",
        description="Auto-parallel planner: how to split training of a large model, and "
        "whether it fits in memory.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, 2 for bad input, 3 when nothing fits."""
    words = list(sys.argv[1:] if argv is None else argv)
    # `planner run PLAN ... -- ARGS`: what follows "--" belongs to the training script.
    script_args: list[str] = []
    if words[:1] == ["run"] and "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    args = build_parser().parse_args(words)
    args.script_args = script_args
    args.command_line = "planner " + shlex.join(words)
    try:
        return int(args.func(args))
    except SpecError as e:
        print(f"planner: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Infeasible as e:
        print(f"planner: infeasible: {one_line(e)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except BrokenPipeError:
        # Output piped into a command that stopped reading (e.g. `| head`): not an error.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
