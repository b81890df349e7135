"""Errors of the cost model and the planner.

``SpecError``: bad input (a typo, an impossible degree); ``Infeasible``: the input is valid but
nothing fits, with what is missing.
"""

from pathlib import Path

from hardware_profiles.errors import SpecError

__all__ = ["Infeasible", "SpecError", "install_hint"]


def install_hint(extra: str) -> str:
    """How to install the optional dependencies ``extra`` (``torch``, ``plots``): into a
    source checkout (an editable install, this package beside a ``pyproject.toml``) with
    ``pip install -e 'CHECKOUT[extra]'``, else from the package index."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "planner").is_dir():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install 'autoparallel-planner[{extra}]'"


class Infeasible(Exception):
    """No configuration fits; the message says what is missing (memory per GPU, GPUs, ...)."""
