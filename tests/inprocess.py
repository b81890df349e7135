"""``planner ARGS`` run inside the test process: what ``python -m planner ARGS`` runs, without
the second or more a new interpreter (and torch's import) takes each time. Tests of the
console entry point itself (``python -m planner``, a fresh interpreter without torch) keep
their subprocess: tests/test_cli.py and the README test."""

from __future__ import annotations

import io
import os
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from planner.cli import main


@dataclass(frozen=True)
class Result:
    """What a command left: its exit status and everything it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_planner(*args: str, cwd: Path | str | None = None) -> Result:
    """Run ``planner *args`` (in ``cwd``) in this process and return its exit status and
    output. Warnings are shown every time, as in a fresh process."""
    out, err = io.StringIO(), io.StringIO()
    before = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("always")
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's --help and usage errors
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(before)
    return Result(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
