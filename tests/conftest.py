"""Test-suite settings: property-based tests assert behaviour, not speed, so hypothesis's
per-example deadline (200 ms) is off; a loaded 2-core CI machine would otherwise fail an
example that merely ran slowly."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("behaviour", deadline=None)
settings.load_profile("behaviour")
