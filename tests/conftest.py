"""Test-suite settings.

Property-based tests assert behaviour, not speed, so hypothesis's per-example deadline
(200 ms) is off: a loaded 2-core CI machine would otherwise fail an example that merely ran
slowly.

Compiled modules are cached even where the environment says not to (PYTHONDONTWRITEBYTECODE,
set in some CI images): every worker process and every ``python -m planner`` a test starts
would otherwise compile the packages and re-do pytest's assertion rewriting of every test
module, seconds per process. The caches are ``__pycache__`` folders, which git ignores.

The fast loop (``-m "not slow"``) draws a quarter of each property test's examples
(``tests/fastloop.py``).
"""

from __future__ import annotations

import os
import sys

import pytest
from fastloop import examples
from hypothesis import settings

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

settings.register_profile("behaviour", deadline=None)
settings.load_profile("behaviour")


def pytest_configure(config: pytest.Config) -> None:
    """The fast loop (``-m "not slow"``) draws fewer examples per property test
    (``tests/fastloop.py``); the whole suite, as CI runs it, draws them all."""
    words = " ".join(str(config.getoption("markexpr", "") or "").split())
    if "not slow" in words:
        os.environ["PLANNER_FAST_LOOP"] = "1"
        settings.register_profile("fast-loop", settings.get_profile("behaviour"),
                                  max_examples=examples(settings.default.max_examples))
        settings.load_profile("fast-loop")
