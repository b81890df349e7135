"""Test-suite settings.

Property-based tests assert behaviour, not speed, so hypothesis's per-example deadline
(200 ms) is off: a loaded 2-core CI machine would otherwise fail an example that merely ran
slowly.

Compiled modules are cached even where the environment says not to (PYTHONDONTWRITEBYTECODE,
set in some CI images): every worker process and every ``python -m planner`` a test starts
would otherwise compile the packages and re-do pytest's assertion rewriting of every test
module, seconds per process. The caches are ``__pycache__`` folders, which git ignores.
"""

from __future__ import annotations

import os
import sys

from hypothesis import settings

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

settings.register_profile("behaviour", deadline=None)
settings.load_profile("behaviour")
