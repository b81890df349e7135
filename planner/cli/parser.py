"""The ``planner`` command's argument parser, built from a set of subcommand modules: the
CLI's own (``planner.cli.build_parser``) and the explorer's (``planner.web``, which parses its
form as ``planner plan``'s flags with the same parser and errors)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from types import ModuleType

from planner.cli.common import Parser
from planner.version import __version__

__all__ = ["command_parser"]


def command_parser(commands: Iterable[ModuleType]) -> argparse.ArgumentParser:
    """The ``planner`` parser with the subcommands of ``commands`` (each module's
    ``add_parser``), in that order."""
    parser = Parser(
        prog="planner",
        description="Auto-parallel planner: how to split training of a large model, and "
        "whether it fits in memory.",
    )
    parser.add_argument("--version", action="version",
                        version=f"planner (autoparallel-planner) {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.add_parser(sub)
    return parser
