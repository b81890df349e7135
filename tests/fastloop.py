"""How many examples a property test draws.

The whole suite (``python -m pytest -q``, as CI runs it) draws each test's full count. The
fast loop (``-m "not slow"``; ``tests/conftest.py`` sets ``PLANNER_FAST_LOOP`` for it) draws
a quarter of it, at least 10: enough to catch a broken property while the code changes, and
the whole suite still draws every example before a change lands. ``PLANNER_FUZZ_EXAMPLES=N``
sets the count of every property test, for a longer hunt.
"""

from __future__ import annotations

import os

#: The share of a property test's examples the fast loop draws, and its least count.
FAST_SHARE, FAST_LEAST = 4, 10


def examples(full: int) -> int:
    """Examples for a property test whose whole-suite count is ``full``."""
    given = os.environ.get("PLANNER_FUZZ_EXAMPLES")
    if given:
        return int(given)
    if os.environ.get("PLANNER_FAST_LOOP"):
        return max(FAST_LEAST, full // FAST_SHARE)
    return full
