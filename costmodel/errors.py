"""Errors of the cost model and the planner.

``SpecError``: bad input (a typo, an impossible degree); ``Infeasible``: the input is valid but
nothing fits, with what is missing.
"""

from hardware_profiles.errors import SpecError

__all__ = ["Infeasible", "SpecError"]


class Infeasible(Exception):
    """No configuration fits; the message says what is missing (memory per GPU, GPUs, ...)."""
