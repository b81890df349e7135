"""``planner ARGS`` run inside the test process: what ``python -m planner ARGS`` runs, without
the second or more a new interpreter (and torch's import) takes each time. Tests of the
console entry point itself (``python -m planner``, a fresh interpreter without torch) keep
their subprocess: tests/test_cli.py and the README test."""

from __future__ import annotations

import io
import os
import sys
import warnings
from collections.abc import Mapping
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


def run_planner(*args: str, cwd: Path | str | None = None,
                env: Mapping[str, str] | None = None) -> Result:
    """Run ``planner *args`` (in ``cwd``, with the variables ``env`` set) in this process and
    return its exit status and output. Warnings are shown every time, as in a fresh process;
    so is the folder's own code: a ``cwd`` module (``mymodels.py``) another command imported
    is not reused, and the import path is put back afterwards."""
    out, err = io.StringIO(), io.StringIO()
    before, path = Path.cwd(), list(sys.path)
    saved = {k: os.environ.get(k) for k in env or {}}
    own = [f.stem for f in Path(cwd).glob("*.py")] if cwd is not None else []
    try:
        os.environ.update(env or {})
        for name in own:
            sys.modules.pop(name, None)
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
        sys.path[:] = path
        for name in own:
            sys.modules.pop(name, None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
