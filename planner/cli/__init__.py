"""Command line: ``planner plan``, ``estimate``, ``explain``, ``compare``, ``emit``, ``plot``,
``serve``, ``run``, ``validate``, ``profile``, ``calibrate``, ``graph``, ``models``, ``gpus``,
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
import contextlib
import functools
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
    serve,
    validate,
)
from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    TimeLimit,
    check_outputs,
    one_line,
    time_limit,
    user_code_timeout,
)
from planner.cli.parser import command_parser

__all__ = ["EXIT_INFEASIBLE", "EXIT_USAGE", "build_parser", "main"]

#: The subcommand modules, in the order ``planner --help`` lists them.
COMMANDS = (estimate, plan, explain, compare, emit, plot, serve, run, validate, profile,
            calibrate, graph, models)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``planner`` command."""
    return command_parser(COMMANDS)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    # Built once per process: ``main`` runs many times in one process (the explorer's server,
    # the notebooks, the tests), and the parser of every subcommand takes ~10 ms to build. A
    # parse leaves it as it was (each gets a new namespace; appended lists are copied).
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status: 0, 2 for bad input (or output that cannot be
    written), 3 when nothing fits, 130 when interrupted (Ctrl-C)."""
    words = list(sys.argv[1:] if argv is None else argv)
    # `planner run PLAN ... -- ARGS`: what follows "--" belongs to the training script.
    script_args: list[str] = []
    if words[:1] == ["run"] and "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    _tolerant_streams()
    args = _parser().parse_args(words)
    args.script_args = script_args
    args.command_line = "planner " + shlex.join(words)
    try:
        check_outputs(args)
        with time_limit(user_code_timeout(args)):
            code = int(args.func(args))
        sys.stdout.flush()  # a full disk or closed stdout shows here, as one line below
        return code
    except TimeLimit as e:
        print(f"planner: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # inside a command, only a model's own code exits
        if getattr(args, "model", None) is None:
            raise
        print(f"planner: error: the model's code called sys.exit({one_line(repr(e.code))}) "
              f"while the planner imported, built or traced it; a model module must not exit",
              file=sys.stderr)
        return EXIT_USAGE
    except SpecError as e:
        print(f"planner: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Infeasible as e:
        print(f"planner: infeasible: {one_line(e)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Output piped into a command that stopped reading (e.g. `| head`): not an error.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except OSError as e:  # standard output on a full disk (/dev/full), or closed
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (nothing more to flush at exit)
        print(f"planner: error: cannot write the output: {one_line(e.strerror or e)}",
              file=sys.stderr)
        return EXIT_USAGE


def _tolerant_streams() -> None:
    """On a terminal or pipe whose encoding cannot write the report's characters (``±``,
    ``µ``, an ASCII locale), print them as ``?`` instead of failing with
    ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            "±µ×".encode(stream.encoding or "ascii")
        except (UnicodeEncodeError, LookupError):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(errors="replace")  # type: ignore[union-attr]
